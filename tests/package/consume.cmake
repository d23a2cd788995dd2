# Runs one consumption scenario from scratch: cmake -DMODE=... -DSOURCE=... -DWORK=... -P consume.cmake
function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "step failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endfunction()

file(REMOVE_RECURSE ${WORK})
set(common -G Ninja -DCMAKE_BUILD_TYPE=Release -DCOMMSGD_ENABLE_CUDA=OFF)
if(MODE STREQUAL "find_package")
  step(${CMAKE_COMMAND} -S ${SOURCE} -B ${WORK}/lib ${common} -DCOMMSGD_INSTALL=ON -DCOMMSGD_BUILD_TESTS=OFF
       -DCOMMSGD_BUILD_BENCHMARKS=OFF -DCOMMSGD_BUILD_EXAMPLES=OFF)
  step(${CMAKE_COMMAND} --install ${WORK}/lib --prefix ${WORK}/prefix)
  step(${CMAKE_COMMAND} -S ${SOURCE}/tests/package/consumer -B ${WORK}/consumer ${common}
       -DCONSUME_MODE=find_package -DCMAKE_PREFIX_PATH=${WORK}/prefix)
else()
  step(${CMAKE_COMMAND} -S ${SOURCE}/tests/package/consumer -B ${WORK}/consumer ${common}
       -DCONSUME_MODE=${MODE} -DCOMMSGD_SOURCE_DIR=${SOURCE})
endif()
step(${CMAKE_COMMAND} --build ${WORK}/consumer)
step(${WORK}/consumer/consumer)
message(STATUS "consumption by ${MODE}: ok")
