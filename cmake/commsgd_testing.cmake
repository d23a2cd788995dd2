# Helpers shared by the test folders.

# Environment of every program run under mpiexec: root is allowed (CI runs as root), more ranks than cores
# are allowed, and LeakSanitizer is off because Open MPI keeps allocations until exit by design.
set(COMMSGD_MPI_TEST_ENVIRONMENT
    "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;ASAN_OPTIONS=detect_leaks=0")

# Registers `target` to run under mpiexec with each rank count in `RANKS`, labelled mpi.
function(commsgd_add_mpi_test name target)
  cmake_parse_arguments(arg "" "" "RANKS" ${ARGN})
  foreach(np IN LISTS arg_RANKS)
    add_test(NAME ${name}.np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe ${MPIEXEC_PREFLAGS}
                     $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${name}.np${np} PROPERTIES
      LABELS mpi PROCESSORS ${np} TIMEOUT 600
      ENVIRONMENT "${COMMSGD_MPI_TEST_ENVIRONMENT}")
  endforeach()
endfunction()
