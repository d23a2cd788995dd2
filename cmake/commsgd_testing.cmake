# Helpers shared by the test folders.

# Environment of every program run under mpiexec: root is allowed (CI runs as root), more ranks than cores
# are allowed, and LeakSanitizer is off because Open MPI keeps allocations until exit by design.
set(COMMSGD_MPI_TEST_ENVIRONMENT
    "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;ASAN_OPTIONS=detect_leaks=0")

# Registers `target` to run under mpiexec with each rank count in `RANKS`, labelled mpi; `ARGS` go to the
# program.
function(commsgd_add_mpi_test name target)
  cmake_parse_arguments(arg "" "" "RANKS;ARGS" ${ARGN})
  foreach(np IN LISTS arg_RANKS)
    add_test(NAME ${name}.np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe ${MPIEXEC_PREFLAGS}
                     $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} ${arg_ARGS})
    set_tests_properties(${name}.np${np} PROPERTIES
      LABELS mpi PROCESSORS ${np} TIMEOUT 600
      ENVIRONMENT "${COMMSGD_MPI_TEST_ENVIRONMENT}")
  endforeach()
endfunction()

# Batched test programs (COMMSGD_UNITY_TESTS): several doctest files compiled as one translation unit, each
# inside a namespace of its own, so what they share (the library's templates, doctest) is compiled once.
#
#   commsgd_unity_batches(<prefix> <batch size> <sources...>)
#
# writes <prefix>_<k>.cpp (k = 1, 2, ...) into the current binary directory, each holding up to <batch size>
# of the sources in order, and sets in the caller <prefix>_count and, for each k, <prefix>_<k>_stems (the
# file names without extension). A batch's source lists every header its files include first, at global
# scope, so that the include guards make each file's own includes, inside its namespace, empty. Each file runs
# as `<program> --source-file=*/<folder>/<stem>.cpp`. A file that declares outside its own scope (an explicit
# specialisation, a namespace of the library's or doctest's) cannot be batched: commsgd_unity_can_batch says so.
function(commsgd_unity_batches prefix batch)
  set(files ${ARGN})
  list(LENGTH files count)
  set(index 0)
  while(count GREATER 0)
    math(EXPR index "${index} + 1")
    set(stems)
    set(includes)
    set(body)
    foreach(i RANGE 1 ${batch})
      if(count EQUAL 0)
        break()
      endif()
      list(POP_FRONT files src)
      math(EXPR count "${count} - 1")
      get_filename_component(stem ${src} NAME_WE)
      list(APPEND stems ${stem})
      file(STRINGS ${src} lines REGEX "^#include ")
      list(APPEND includes ${lines})
      string(APPEND body "namespace commsgd_test_${stem} {\n#include \"${src}\"\n} // namespace commsgd_test_${stem}\n")
      # The batch's source is made from the file's include lines: configure again when the file changes.
      set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${src})
    endforeach()
    list(REMOVE_DUPLICATES includes)
    list(JOIN includes "\n" includes)
    file(CONFIGURE OUTPUT ${CMAKE_CURRENT_BINARY_DIR}/${prefix}_${index}.cpp
         CONTENT "// Generated (COMMSGD_UNITY_TESTS): ${stems}\n${includes}\n${body}")
    set(${prefix}_${index}_stems ${stems} PARENT_SCOPE)
  endwhile()
  set(${prefix}_count ${index} PARENT_SCOPE)
endfunction()

# Sets `out` to TRUE when the test file `src` may go into a batch (see commsgd_unity_batches).
function(commsgd_unity_can_batch out src)
  file(STRINGS ${src} outside REGEX "^(template <>|namespace (commsgd|doctest|std|boost)([: {]|$)|TYPE_TO_STRING)")
  if(outside)
    set(${out} FALSE PARENT_SCOPE)
  else()
    set(${out} TRUE PARENT_SCOPE)
  endif()
endfunction()
