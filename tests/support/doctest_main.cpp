// The tests' main: doctest's, except that a run filtered to a source file fails when no test case matched
// (support/source_filter.hpp).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <support/source_filter.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int status = context.run();
  if (context.shouldExit()) return status;
  if (commsgd::test::source_filter_matched_nothing(argc, argv)) {
    std::fprintf(stderr, "no test case matched the --source-file filter\n");
    return 1;
  }
  return status;
}
