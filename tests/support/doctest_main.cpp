// The tests' main: doctest's, except that a run filtered to a source file fails when no test case matched
// (support/source_filter.hpp), and that under ThreadSanitizer the test suites "single_thread" and "threads_seen"
// are left out.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <support/source_filter.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
#if defined(__SANITIZE_THREAD__)
  // A test case that starts no thread gives ThreadSanitizer nothing to check, and at its slowdown a large one
  // costs a minute: such cases in the threads suite's files say so with doctest::test_suite("single_thread").
  // A case whose threads walk only paths another case of its file already walks (the same exchange with
  // another code's values) says so with doctest::test_suite("threads_seen").
  context.addFilter("test-suite-exclude", "single_thread,threads_seen");
#endif
  const int status = context.run();
  if (context.shouldExit()) return status;
  if (commsgd::test::source_filter_matched_nothing(argc, argv)) {
    std::fprintf(stderr, "no test case matched the --source-file filter\n");
    return 1;
  }
  return status;
}
