# commsgd::torch (comm::process_group over c10d) and the Python module commsgd_torch, when LibTorch is found.
#
# LibTorch comes through its TorchConfig.cmake (Debian's libtorch-dev puts it under the multiarch cmake
# folder, which find_package searches). The Python module must be built for the interpreter that has torch,
# which is not necessarily the first python3 on PATH: COMMSGD_TORCH_PYTHON names it (default /usr/bin/python3,
# the system interpreter Debian's python3-torch installs into) and is handed to FindPython3 as
# Python3_EXECUTABLE.
find_package(Torch QUIET)
if(NOT Torch_FOUND OR NOT TARGET torch)
  message(STATUS "commsgd: LibTorch not found, commsgd::torch and commsgd_torch are not provided")
  return()
endif()

set(COMMSGD_HAS_TORCH ON)
add_library(commsgd_torch INTERFACE)
add_library(commsgd::torch ALIAS commsgd_torch)
set_target_properties(commsgd_torch PROPERTIES EXPORT_NAME torch)
target_link_libraries(commsgd_torch INTERFACE commsgd torch)
message(STATUS "commsgd: LibTorch ${Torch_VERSION} found, commsgd::torch provided")

# The Python module needs the interpreter with torch, its headers and pybind11.
set(COMMSGD_TORCH_PYTHON "/usr/bin/python3" CACHE FILEPATH "The Python interpreter that has torch installed")
set(COMMSGD_HAS_TORCH_PYTHON OFF)
if(COMMSGD_BUILD_PYTHON AND EXISTS "${COMMSGD_TORCH_PYTHON}")
  execute_process(COMMAND "${COMMSGD_TORCH_PYTHON}" -c "import torch; print(torch.__version__)"
                  RESULT_VARIABLE commsgd_torch_py_rc OUTPUT_VARIABLE commsgd_torch_py_version
                  OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(commsgd_torch_py_rc EQUAL 0)
    set(Python3_EXECUTABLE "${COMMSGD_TORCH_PYTHON}")
    find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
    find_package(pybind11 CONFIG QUIET)
    if(Python3_FOUND AND pybind11_FOUND)
      set(COMMSGD_HAS_TORCH_PYTHON ON)
      set(COMMSGD_TORCH_PYTHON_EXECUTABLE "${Python3_EXECUTABLE}")
      message(STATUS "commsgd: building commsgd_torch for ${Python3_EXECUTABLE} (torch ${commsgd_torch_py_version})")
    endif()
  endif()
endif()
if(NOT COMMSGD_BUILD_PYTHON)
  message(STATUS "commsgd: COMMSGD_BUILD_PYTHON is off, commsgd_torch is not built")
elseif(NOT COMMSGD_HAS_TORCH_PYTHON)
  message(STATUS "commsgd: ${COMMSGD_TORCH_PYTHON} with torch and pybind11 not found, commsgd_torch is not built")
endif()
