// Reading the IDX files Fashion-MNIST ships in (gzip'd or plain), with errors that say which file and why.
//
// IDX layout: 2 zero bytes, a type byte (0x08 = unsigned byte), the number of dimensions, then one big-endian
// uint32 per dimension, then the data in row-major order.
#pragma once

#include <commsgd/error.hpp>

#include <zlib.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace fmnist {

struct idx_array {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> data;
};

namespace detail {

struct gz_closer {
  void operator()(gzFile_s* f) const noexcept { gzclose(f); }
};

// Reads exactly `size` bytes or throws: a short read is a truncated (or, for gzip, damaged) file.
inline void read_exact(gzFile f, const std::string& path, void* out, std::size_t size, const char* what) {
  auto* p = static_cast<unsigned char*>(out);
  std::size_t done = 0;
  while (done < size) {
    // gzread takes an unsigned int count, so large payloads go in pieces.
    const auto chunk = static_cast<unsigned>(std::min<std::size_t>(size - done, 1u << 30));
    const int got = gzread(f, p + done, chunk);
    if (got < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      throw commsgd::corrupt_data(commsgd::concat("IDX file '", path, "': cannot decompress the ", what,
                                                  " (zlib: ", msg ? msg : "unknown error", ")"));
    }
    if (got == 0)
      throw commsgd::corrupt_data(commsgd::concat("IDX file '", path, "' is truncated: the ", what, " needs ",
                                                  size, " bytes but only ", done, " are present"));
    done += static_cast<std::size_t>(got);
  }
}

inline std::string hex_word(const std::array<unsigned char, 4>& b) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s = "0x";
  for (unsigned char c : b) {
    s += digits[c >> 4];
    s += digits[c & 15];
  }
  return s;
}

} // namespace detail

// Reads an IDX file of unsigned bytes with `expected_rank` dimensions. zlib reads plain files transparently,
// so one code path serves both forms.
inline idx_array read_idx(const std::string& path, int expected_rank) {
  if (!std::filesystem::exists(path))
    throw commsgd::invalid_argument(commsgd::concat(
        "IDX file '", path,
        "' does not exist (install the Debian package dataset-fashion-mnist, or pass --data DIR)"));
  std::unique_ptr<gzFile_s, detail::gz_closer> f(gzopen(path.c_str(), "rb"));
  if (!f) throw commsgd::invalid_argument(commsgd::concat("IDX file '", path, "' cannot be opened"));

  std::array<unsigned char, 4> magic{};
  detail::read_exact(f.get(), path, magic.data(), magic.size(), "magic number");
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08 || magic[3] != expected_rank)
    throw commsgd::corrupt_data(commsgd::concat("IDX file '", path, "' has magic ", detail::hex_word(magic),
                                                " but 0x0000080", expected_rank, " (unsigned bytes, ",
                                                expected_rank, " dimensions) is expected"));

  idx_array out;
  std::size_t total = 1;
  for (int d = 0; d < expected_rank; ++d) {
    std::array<unsigned char, 4> b{};
    detail::read_exact(f.get(), path, b.data(), b.size(), "header");
    const std::uint32_t v =
        std::uint32_t(b[0]) << 24 | std::uint32_t(b[1]) << 16 | std::uint32_t(b[2]) << 8 | b[3];
    out.dims.push_back(v);
    total *= v;
  }
  // Guards against a corrupt header asking for an absurd allocation before the data is even read.
  if (total > (std::size_t{1} << 32))
    throw commsgd::corrupt_data(
        commsgd::concat("IDX file '", path, "' declares ", total, " elements, more than 2^32"));
  out.data.resize(total);
  detail::read_exact(f.get(), path, out.data.data(), total, "data");
  return out;
}

// A labelled image set: pixels scaled to [0, 1], one image of `pixels` floats after another.
struct dataset {
  std::size_t count = 0;
  std::size_t pixels = 0;
  std::vector<float> images;
  std::vector<std::uint8_t> labels;
};

// Finds `name` or `name.gz` in `dir`.
inline std::string find_idx(const std::string& dir, const std::string& name) {
  const auto plain = std::filesystem::path(dir) / name;
  if (std::filesystem::exists(plain)) return plain.string();
  return (std::filesystem::path(dir) / (name + ".gz")).string();
}

// Loads `prefix` ("train" or "t10k") from `dir`, keeping at most `limit` samples (0 keeps all).
inline dataset load_set(const std::string& dir, const std::string& prefix, std::size_t limit = 0) {
  const auto image_path = find_idx(dir, prefix + "-images-idx3-ubyte");
  const auto label_path = find_idx(dir, prefix + "-labels-idx1-ubyte");
  const auto img = read_idx(image_path, 3);
  const auto lab = read_idx(label_path, 1);
  if (img.dims[0] != lab.dims[0])
    throw commsgd::corrupt_data(commsgd::concat("'", image_path, "' holds ", img.dims[0], " images but '",
                                                label_path, "' holds ", lab.dims[0], " labels"));
  dataset ds;
  ds.count = img.dims[0];
  if (limit != 0 && limit < ds.count) ds.count = limit;
  ds.pixels = std::size_t{img.dims[1]} * img.dims[2];
  ds.images.resize(ds.count * ds.pixels);
  for (std::size_t i = 0; i < ds.images.size(); ++i)
    ds.images[i] = static_cast<float>(img.data[i]) / 255.0f;
  ds.labels.assign(lab.data.begin(), lab.data.begin() + static_cast<std::ptrdiff_t>(ds.count));
  for (std::size_t i = 0; i < ds.count; ++i)
    if (ds.labels[i] > 9)
      throw commsgd::corrupt_data(commsgd::concat("'", label_path, "': label ", int(ds.labels[i]),
                                                  " at index ", i, " is outside [0, 9]"));
  return ds;
}

// The data directory: the flag, else $COMMSGD_FASHION_MNIST, else where the Debian package installs it.
inline std::string default_data_dir() {
  if (const char* env = std::getenv("COMMSGD_FASHION_MNIST")) return env;
  return "/usr/share/datasets/fashion-mnist";
}

// The order in which an epoch visits the training set: 0 .. n-1 shuffled from the seed and the epoch alone, so
// every rank, every scheme and a resumed run see the same batches.
inline void shuffle_epoch(std::vector<std::uint32_t>& order, std::uint64_t seed, std::uint64_t epoch) {
  std::iota(order.begin(), order.end(), 0u);
  std::mt19937_64 gen(seed * 1000003u + epoch);
  for (std::size_t i = order.size(); i > 1; --i)
    std::swap(order[i - 1], order[gen() % i]);
}

} // namespace fmnist
