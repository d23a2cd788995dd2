// A test program run filtered to a source file (how a batched program runs one file's tests,
// COMMSGD_UNITY_TESTS) must match at least one test case, so that a misspelt filter cannot pass. Included by
// the programs' main() (support/doctest_main.cpp, mpi/support.hpp), once per program.
#pragma once

#include <doctest/doctest.h>

#include <string_view>

namespace commsgd::test {

inline unsigned& matched_test_cases() {
  static unsigned n = 0;
  return n;
}

// Counts the test cases that passed the filters; everything else a reporter may be told is ignored.
struct count_matched : doctest::IReporter {
  explicit count_matched(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& s) override {
    matched_test_cases() = s.numTestCasesPassingFilters;
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

// Whether the command line filters by source file and nothing matched: the run must then fail.
inline bool source_filter_matched_nothing(int argc, char** argv) {
  bool by_file = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    by_file = by_file || arg.starts_with("--source-file=") || arg.starts_with("-sf=");
  }
  return by_file && matched_test_cases() == 0;
}

} // namespace commsgd::test
