// The per-bucket part of a hook state's state_dict(), shared by the states that keep a compressor per DDP
// bucket (TopK, Compressor, PowerSGD): a dict from the bucket's key to a tuple that holds its layout and its
// compressor's saved bytes. Loading builds every bucket into a new map before the state takes it, so a dict
// that does not fit raises and leaves the state as it was.
#pragma once

#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "bridge.hpp"
#include "exchange_queue.hpp"

#include <commsgd/compress/momentum.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace commsgd_torch {

// The buckets as a dict, each entry the tuple `entry(bucket)` makes, once the rounds queued are done (they
// change the buckets).
template <class Map, class Entry>
py::dict buckets_dict(exchange_queue& queue, const Map& buckets, Entry entry) {
  queue.drain();
  py::dict d;
  for (const auto& [key, b] : buckets)
    d[py::cast(key)] = entry(b);
  return d;
}

// The buckets a dict of buckets_dict's holds, each made by `make(key, tuple)` (the key as Python's, for an
// error to name).
template <class Key, class Bucket, class Make>
std::map<Key, Bucket> buckets_from(const py::dict& d, Make make) {
  std::map<Key, Bucket> loaded;
  for (auto item : d) {
    auto b = make(item.first, item.second.cast<py::tuple>());
    loaded.insert_or_assign(item.first.cast<Key>(), std::move(b));
  }
  return loaded;
}

// A compressor's stream save() as Python bytes, and the stream that gives them back to its load().
template <class X>
py::bytes saved_bytes(const X& x) {
  std::ostringstream os;
  x.save(os);
  return py::bytes(os.str());
}
inline std::istringstream saved_stream(py::handle bytes) {
  return std::istringstream(bytes.cast<std::string>());
}

// The same for a compressor saved to a byte buffer.
inline py::bytes blob_bytes(std::span<const std::byte> blob) {
  return py::bytes(reinterpret_cast<const char*>(blob.data()), blob.size());
}
inline std::vector<std::byte> saved_blob(py::handle bytes) {
  const auto s = bytes.cast<std::string>();
  std::vector<std::byte> blob(s.size());
  std::memcpy(blob.data(), s.data(), s.size());
  return blob;
}

// The dense warm-up's momentum per key (a parameter or a bucket) as a dict of tensors, and back; `what`
// names the tensors in the error a bad one raises.
inline py::dict velocities_dict(const std::map<std::int64_t, commsgd::compress::hook_momentum>& velocities) {
  py::dict d;
  for (const auto& [key, u] : velocities)
    d[py::int_(key)] = tensor_of(u.buffer());
  return d;
}
inline std::map<std::int64_t, commsgd::compress::hook_momentum>
velocities_from(const py::dict& d, float factor, const char* what) {
  std::map<std::int64_t, commsgd::compress::hook_momentum> velocities;
  for (auto item : d)
    velocities.emplace(item.first.cast<std::int64_t>(), factor)
        .first->second.assign(values_of(item.second.cast<at::Tensor>().contiguous(), what));
  return velocities;
}

} // namespace commsgd_torch
