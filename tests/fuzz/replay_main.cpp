// The replay driver: runs one fuzz target without libFuzzer, so that every compiler builds and ctest runs it.
//
//   fuzz_replay_<target> [corpus-dir-or-file ...]
//
// It feeds the target COMMSGD_FUZZ_ITERATIONS (default: COMMSGD_FUZZ_DEFAULT_ITERATIONS, set per build type)
// pseudo-random inputs from a fixed seed, then every regular file under each path given. A failing check
// aborts, so a failure prints the check and the iteration (or file) that tripped it.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#ifndef COMMSGD_FUZZ_DEFAULT_ITERATIONS
#define COMMSGD_FUZZ_DEFAULT_ITERATIONS 2000
#endif

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

// Lengths are drawn so that short inputs (where most parsing branches are) dominate, with a long tail.
std::vector<std::uint8_t> random_input(std::mt19937_64& rng) {
  const unsigned shape = static_cast<unsigned>(rng() % 8);
  const std::size_t max_len = shape < 4 ? 64 : (shape < 7 ? 512 : 4096);
  std::vector<std::uint8_t> in(static_cast<std::size_t>(rng() % (max_len + 1)));
  // Some inputs favour small byte values, which the targets map to the interesting choices.
  const bool small = rng() % 3 == 0;
  for (auto& b : in)
    b = static_cast<std::uint8_t>(small ? rng() % 16 : rng());
  return in;
}

int replay_path(const std::filesystem::path& p) {
  std::vector<std::filesystem::path> files;
  if (std::filesystem::is_directory(p)) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(p))
      if (e.is_regular_file()) files.push_back(e.path());
  } else if (std::filesystem::is_regular_file(p)) {
    files.push_back(p);
  } else {
    std::fprintf(stderr, "replay: '%s' is neither a file nor a directory\n", p.string().c_str());
    return 1;
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream is(f, std::ios::binary);
    const std::vector<std::uint8_t> in((std::istreambuf_iterator<char>(is)),
                                       std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replay: %s (%zu bytes)\n", f.string().c_str(), in.size());
    LLVMFuzzerTestOneInput(in.data(), in.size());
  }
  std::fprintf(stderr, "replay: %zu file(s) from %s passed\n", files.size(), p.string().c_str());
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  long iterations = COMMSGD_FUZZ_DEFAULT_ITERATIONS;
  if (const char* env = std::getenv("COMMSGD_FUZZ_ITERATIONS")) iterations = std::strtol(env, nullptr, 10);
  std::mt19937_64 rng(0x5eed'c0de'2024ull);
  LLVMFuzzerTestOneInput(nullptr, 0);
  for (long i = 0; i < iterations; ++i) {
    const auto in = random_input(rng);
    LLVMFuzzerTestOneInput(in.data(), in.size());
  }
  std::fprintf(stderr, "replay: %ld pseudo-random input(s) passed\n", iterations);
  for (int a = 1; a < argc; ++a)
    if (const int rc = replay_path(argv[a]); rc != 0) return rc;
  return 0;
}
