# Which torch the build is for: its version, CMake files and CUDA, asked of the interpreter the Python module will
# run with. Included before CUDA is set up (a pip build's CUDA default follows this torch) and before
# commsgd_torch.cmake, which finds LibTorch from what this learns.
#
# Supported torch: COMMSGD_TORCH_MIN (inclusive) to COMMSGD_TORCH_BELOW (exclusive), the range python/pyproject.toml
# states; both ends are tested (Debian's 1.13 in the dev preset, the newest on PyPI in .ci/run).
#
# The torch to build against is the one the Python module will run with: COMMSGD_TORCH_PYTHON names that
# interpreter (default: the one scikit-build-core builds for under pip, else /usr/bin/python3, where Debian's
# python3-torch lives). Its torch.utils.cmake_prefix_path goes first on CMAKE_PREFIX_PATH, so a pip-installed
# torch wins over a system LibTorch. pip's isolated build environment hides the installed packages from the
# interpreter (through PYTHONPATH), so when torch is not importable as is, it is asked again outside it: the
# extension must match the torch that imports it, not one pip would download for the build.
set(COMMSGD_TORCH_MIN 1.13)
set(COMMSGD_TORCH_BELOW 2.16)

if(DEFINED SKBUILD AND DEFINED Python_EXECUTABLE)
  set(commsgd_default_python "${Python_EXECUTABLE}")
else()
  set(commsgd_default_python "/usr/bin/python3")
endif()
set(COMMSGD_TORCH_PYTHON "${commsgd_default_python}" CACHE FILEPATH "The Python interpreter that has torch installed")

# A pip build (SKBUILD) exists only for the module, so anything missing there is an error; elsewhere torch is
# optional and its absence a status line.
function(commsgd_torch_missing why)
  if(DEFINED SKBUILD)
    message(FATAL_ERROR "commsgd_torch: ${why}")
  endif()
  message(STATUS "commsgd: ${why}; commsgd::torch and commsgd_torch are not provided")
endfunction()

set(commsgd_torch_query
    "import torch, torch.utils; print(torch.__version__); print(torch.utils.cmake_prefix_path); print(torch.version.cuda or '')")
set(commsgd_torch_py_rc 1)
if(EXISTS "${COMMSGD_TORCH_PYTHON}")
  execute_process(COMMAND "${COMMSGD_TORCH_PYTHON}" -c "${commsgd_torch_query}" RESULT_VARIABLE commsgd_torch_py_rc
                  OUTPUT_VARIABLE commsgd_torch_py_out ERROR_VARIABLE commsgd_torch_py_err
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT commsgd_torch_py_rc EQUAL 0 AND DEFINED ENV{PYTHONPATH})
    execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE
                            "${COMMSGD_TORCH_PYTHON}" -c "${commsgd_torch_query}"
                    RESULT_VARIABLE commsgd_torch_py_rc OUTPUT_VARIABLE commsgd_torch_py_out
                    ERROR_VARIABLE commsgd_torch_py_err OUTPUT_STRIP_TRAILING_WHITESPACE)
  endif()
endif()
set(commsgd_torch_py_version "")
if(commsgd_torch_py_rc EQUAL 0)
  string(REPLACE "\n" ";" commsgd_torch_py_out "${commsgd_torch_py_out}")
  list(GET commsgd_torch_py_out 0 commsgd_torch_py_version)
  list(GET commsgd_torch_py_out 1 commsgd_torch_prefix)
  list(LENGTH commsgd_torch_py_out n)
  set(COMMSGD_TORCH_PYTHON_CUDA "")
  if(n GREATER 2)
    list(GET commsgd_torch_py_out 2 COMMSGD_TORCH_PYTHON_CUDA)
  endif()
  list(PREPEND CMAKE_PREFIX_PATH "${commsgd_torch_prefix}")
elseif(DEFINED SKBUILD)
  string(STRIP "${commsgd_torch_py_err}" commsgd_torch_py_err)
  string(REGEX REPLACE ".*\n" "" commsgd_torch_py_err "${commsgd_torch_py_err}")
  commsgd_torch_missing("'import torch' fails in ${COMMSGD_TORCH_PYTHON} (${commsgd_torch_py_err}). The extension \
is compiled against the torch it will run with: install torch ${COMMSGD_TORCH_MIN} or newer (below \
${COMMSGD_TORCH_BELOW}) into this environment first, e.g. pip install torch")
  return()
endif()
