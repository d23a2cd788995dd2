// The tests' main: doctest's, except that a run filtered to a source file (how a batched unit test runs one
// file's tests, COMMSGD_UNITY_TESTS) fails when no test case matched, so a misspelt filter cannot pass.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string_view>

namespace {

unsigned matched = 0;

// Counts the test cases that passed the filters; everything else a reporter may be told is ignored.
struct count_matched : doctest::IReporter {
  explicit count_matched(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    matched = stats.numTestCasesPassingFilters;
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

REGISTER_LISTENER("commsgd_count_matched", 1, count_matched);

} // namespace

int main(int argc, char** argv) {
  bool by_file = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    by_file = by_file || arg.starts_with("--source-file=") || arg.starts_with("-sf=");
  }
  doctest::Context context(argc, argv);
  const int status = context.run();
  if (context.shouldExit()) return status;
  if (by_file && matched == 0) {
    std::fprintf(stderr, "no test case matched the --source-file filter\n");
    return 1;
  }
  return status;
}
