# commsgd::torch (comm::process_group over c10d) and the Python module commsgd_torch, when LibTorch is found,
# for the torch cmake/commsgd_torch_query.cmake found (CMakeLists.txt includes it first).

# A CUDA torch's config (Caffe2's cuda.cmake) rewrites the CUDA settings of the including scope: its own
# -gencode list for every architecture it supports in CMAKE_CUDA_FLAGS (some of which a newer nvcc refuses),
# CMAKE_CUDA_ARCHITECTURES OFF, and CMAKE_CUDA_STANDARD_REQUIRED ON, which turns commsgd's C++20 into a
# dialect CMake before 3.26 cannot name for nvcc. commsgd's CUDA code needs none of torch's CUDA, so they
# are put back as they were.
set(commsgd_cuda_settings CMAKE_CUDA_FLAGS CMAKE_CUDA_ARCHITECTURES CMAKE_CUDA_STANDARD CMAKE_CUDA_STANDARD_REQUIRED)
foreach(v IN LISTS commsgd_cuda_settings)
  if(DEFINED ${v})
    set(commsgd_saved_${v}_defined ON)
    set(commsgd_saved_${v} "${${v}}")
  else()
    set(commsgd_saved_${v}_defined OFF)
  endif()
endforeach()
find_package(Torch QUIET)
foreach(v IN LISTS commsgd_cuda_settings)
  if(commsgd_saved_${v}_defined)
    set(${v} "${commsgd_saved_${v}}")
  else()
    unset(${v})
  endif()
endforeach()
if(NOT Torch_FOUND OR NOT TARGET torch)
  commsgd_torch_missing("LibTorch (TorchConfig.cmake) not found")
  return()
endif()
if(Torch_VERSION VERSION_LESS COMMSGD_TORCH_MIN OR NOT Torch_VERSION VERSION_LESS COMMSGD_TORCH_BELOW)
  commsgd_torch_missing("torch ${Torch_VERSION} is outside the supported range [${COMMSGD_TORCH_MIN}, \
${COMMSGD_TORCH_BELOW})")
  return()
endif()

set(COMMSGD_HAS_TORCH ON)
add_library(commsgd_torch INTERFACE)
add_library(commsgd::torch ALIAS commsgd_torch)
set_target_properties(commsgd_torch PROPERTIES EXPORT_NAME torch)
target_link_libraries(commsgd_torch INTERFACE commsgd torch)
message(STATUS "commsgd: LibTorch ${Torch_VERSION} found, commsgd::torch provided")

# The Python module needs that interpreter's development files and pybind11's CMake helpers (the headers
# come from torch where it bundles them; see python/CMakeLists.txt).
set(COMMSGD_HAS_TORCH_PYTHON OFF)
if(NOT COMMSGD_BUILD_PYTHON)
  message(STATUS "commsgd: COMMSGD_BUILD_PYTHON is off, commsgd_torch is not built")
  return()
endif()
if(commsgd_torch_py_version STREQUAL "")
  message(STATUS "commsgd: ${COMMSGD_TORCH_PYTHON} has no torch, commsgd_torch is not built")
  return()
endif()
set(Python3_EXECUTABLE "${COMMSGD_TORCH_PYTHON}")
find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
# pybind11 3 builds with whichever of FindPython's two names has been found, preferring Python; some torch
# releases find Python (the interpreter alone) in their CMake files, which leaves pybind11 without
# Python_add_library. The same interpreter's development files under that name too.
if(Python_FOUND OR DEFINED Python_EXECUTABLE)
  set(Python_EXECUTABLE "${COMMSGD_TORCH_PYTHON}")
  find_package(Python COMPONENTS Interpreter Development.Module QUIET)
endif()
# The extension must be compiled with the pybind11 headers torch's own bindings were (pybind11 types such as
# ProcessGroup cross between the two modules only when both agree): pip's torch bundles them in its include
# folder, Debian's uses the system's. The pybind11 package of exactly that version is preferred (find_package
# passes over others on CMAKE_PREFIX_PATH, such as the one pip's isolated build brings); failing that, any
# pybind11 supplies the CMake helpers and python/CMakeLists.txt puts torch's include folder first.
set(commsgd_torch_pybind11 "")
foreach(dir IN LISTS TORCH_INCLUDE_DIRS)
  if(EXISTS "${dir}/pybind11/detail/common.h")
    file(STRINGS "${dir}/pybind11/detail/common.h" defines REGEX "#define PYBIND11_VERSION_(MAJOR|MINOR|PATCH|MICRO) ")
    string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*(PATCH|MICRO) ([0-9]+).*" "\\1.\\2.\\4" commsgd_torch_pybind11
                         "${defines}")
    break()
  endif()
endforeach()
if(commsgd_torch_pybind11)
  find_package(pybind11 ${commsgd_torch_pybind11} EXACT CONFIG QUIET)
endif()
if(NOT pybind11_FOUND)
  find_package(pybind11 CONFIG QUIET)
endif()
if(NOT Python3_FOUND OR NOT pybind11_FOUND)
  commsgd_torch_missing("the development files of ${COMMSGD_TORCH_PYTHON} or pybind11's CMake files were not found")
  return()
endif()
set(COMMSGD_HAS_TORCH_PYTHON ON)
set(COMMSGD_TORCH_PYTHON_EXECUTABLE "${Python3_EXECUTABLE}")
set(COMMSGD_TORCH_PYTHON_VERSION "${commsgd_torch_py_version}")
message(STATUS "commsgd: building commsgd_torch for ${Python3_EXECUTABLE} (torch ${commsgd_torch_py_version}, pybind11 ${pybind11_VERSION})")
