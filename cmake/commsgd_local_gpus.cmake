# commsgd_local_gpu_architectures: the CUDA architectures of the GPUs nvidia-smi lists on this machine ("90"
# for compute capability 9.0), empty where there is no nvidia-smi or no GPU answers. A pip build compiles its
# CUDA part for these alone: the package is built for the machine it is installed on.
set(commsgd_local_gpu_architectures "")
find_program(COMMSGD_NVIDIA_SMI nvidia-smi)
if(COMMSGD_NVIDIA_SMI)
  execute_process(COMMAND "${COMMSGD_NVIDIA_SMI}" --query-gpu=compute_cap --format=csv,noheader
                  RESULT_VARIABLE smi_rc OUTPUT_VARIABLE smi_out ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(smi_rc EQUAL 0)
    string(REPLACE "\n" ";" smi_out "${smi_out}")
    foreach(cap IN LISTS smi_out)
      string(STRIP "${cap}" cap)
      if(cap MATCHES "^([0-9]+)\\.([0-9]+)$")
        list(APPEND commsgd_local_gpu_architectures "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
      endif()
    endforeach()
    list(REMOVE_DUPLICATES commsgd_local_gpu_architectures)
  endif()
endif()
