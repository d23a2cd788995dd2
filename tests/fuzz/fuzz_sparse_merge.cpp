// Fuzz target: the sparse exchange (sparsify::exchanger::sum) on comm::local with 1 to 3 ranks.
//
// Every rank gets an input-built message that may be well formed or not: an output buffer of the wrong size,
// ragged index/value arrays, indices out of range or not strictly rising, NaN/inf values, ranks that
// disagree on the length. The path (automatic, sparse, dense) and the index width are input choices too.
// The outcome is compared with a reference computed here, independently of the exchange:
//   - if some rank's message is bad (first such rank in rank order wins), every rank raises the same
//     commsgd::error subclass, with the count and first index for non_finite;
//   - otherwise every rank gets the same bits, equal to +0 plus rank 0's pairs, then rank 1's, ... (the
//     dense path may differ only in the sign of a zero), and the report's counts and total are right.
// comm::local's run() joins all threads, so a rank left waiting would show up as a hang (ctest timeout,
// libFuzzer -timeout).
#include "fuzz_support.hpp"

#include <commsgd/comm/local.hpp>
#include <commsgd/cost/sparse.hpp>
#include <commsgd/error.hpp>
#include <commsgd/sparsify/sparse_exchange.hpp>
#include <commsgd/sparsify/sparse_vector.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <typeinfo>
#include <vector>

namespace {

namespace sp = commsgd::sparsify;
namespace cm = commsgd::comm;
using commsgd_fuzz::byte_source;

template <class Index>
struct rank_input {
  std::size_t length = 0;
  std::size_t out_size = 0;
  std::vector<Index> indices;
  std::vector<float> values;
};

enum class verdict { ok, size_mismatch, invalid_argument, non_finite };

struct expectation {
  verdict kind = verdict::ok;
  std::size_t nf_count = 0, nf_first = 0;
  std::vector<float> sum;
};

template <class Index>
rank_input<Index> make_rank(byte_source& in, std::size_t length) {
  rank_input<Index> r;
  const std::uint8_t shape = in.u8();
  r.length = (shape & 0x0f) == 0 ? in.below(33) : length; // now and then a rank disagrees on the length
  r.out_size = (shape & 0xf0) == 0 ? in.below(33) : r.length;
  const std::size_t count = in.below(r.length + 3);
  const bool rising = in.u8() % 4 != 0;
  Index next = 0;
  for (std::size_t j = 0; j < count; ++j) {
    if (rising) {
      next = static_cast<Index>(next + (j == 0 ? 0 : 1) + in.below(3));
      r.indices.push_back(next);
    } else {
      r.indices.push_back(static_cast<Index>(in.u8() % 2 ? in.below(r.length + 2) : in.u64()));
    }
  }
  std::size_t values = count;
  if (in.u8() % 16 == 0) values = in.below(count + 3);
  const bool clean = in.u8() % 3 != 0;
  for (std::size_t j = 0; j < values; ++j) {
    float v = in.awkward_float();
    if (clean && !std::isfinite(v)) v = 1.5f;
    r.values.push_back(v);
  }
  return r;
}

template <class Index>
expectation reference(const std::vector<rank_input<Index>>& ranks) {
  expectation e;
  const std::size_t length = ranks[0].length;
  for (const auto& r : ranks) {
    if (r.out_size != r.length || r.indices.size() != r.values.size()) {
      e.kind = verdict::size_mismatch;
      return e;
    }
    for (std::size_t j = 0; j < r.indices.size(); ++j)
      if (static_cast<std::uint64_t>(r.indices[j]) >= r.length ||
          (j > 0 && r.indices[j] <= r.indices[j - 1])) {
        e.kind = verdict::invalid_argument;
        return e;
      }
    std::size_t bad = 0, first = 0;
    for (std::size_t j = 0; j < r.values.size(); ++j)
      if (!std::isfinite(r.values[j]) && bad++ == 0) first = j;
    if (bad > 0) {
      e.kind = verdict::non_finite;
      e.nf_count = bad;
      e.nf_first = first;
      return e;
    }
    if (r.length != length) {
      e.kind = verdict::size_mismatch;
      return e;
    }
  }
  e.sum.assign(length, 0.0f);
  for (const auto& r : ranks)
    for (std::size_t j = 0; j < r.indices.size(); ++j)
      e.sum[static_cast<std::size_t>(r.indices[j])] += r.values[j];
  return e;
}

struct rank_outcome {
  verdict kind = verdict::ok;
  bool other_error = false;
  std::string what;
  std::size_t nf_count = 0, nf_first = 0;
  std::vector<float> out;
  commsgd::comm::exchange_report report;
};

template <class Index>
void run(byte_source& in) {
  const int n = 1 + static_cast<int>(in.u8() % 3);
  const auto path = static_cast<commsgd::cost::sparse_path>(in.u8() % 3);
  const std::size_t length = in.below(33);
  std::vector<rank_input<Index>> ranks;
  for (int r = 0; r < n; ++r)
    ranks.push_back(make_rank<Index>(in, length));
  const expectation want = reference(ranks);

  std::vector<rank_outcome> got(static_cast<std::size_t>(n));
  cm::local_group(n).run([&](cm::local& c) {
    const auto& mine = ranks[static_cast<std::size_t>(c.rank())];
    auto& o = got[static_cast<std::size_t>(c.rank())];
    o.out.assign(mine.out_size, 7.0f);
    sp::sparse_view<Index> v{mine.length, mine.indices, mine.values};
    sp::exchanger<Index> ex(sp::exchange_options{path});
    try {
      o.report = ex.sum(c, v, o.out);
    } catch (const commsgd::size_mismatch& e) {
      o.kind = verdict::size_mismatch;
      o.what = e.what();
      o.other_error = typeid(e) != typeid(commsgd::size_mismatch);
    } catch (const commsgd::invalid_argument& e) {
      o.kind = verdict::invalid_argument;
      o.what = e.what();
      o.other_error = typeid(e) != typeid(commsgd::invalid_argument);
    } catch (const commsgd::non_finite& e) {
      o.kind = verdict::non_finite;
      o.what = e.what();
      o.nf_count = e.count();
      o.nf_first = e.first_index();
    } catch (const commsgd::error& e) {
      o.other_error = true;
      o.what = e.what();
    }
  });

  for (int r = 0; r < n; ++r) {
    const auto& o = got[static_cast<std::size_t>(r)];
    FUZZ_CHECK_MSG(!o.other_error, "rank " + std::to_string(r) + " raised an unexpected error: " + o.what);
    FUZZ_CHECK_MSG(o.kind == want.kind, "rank " + std::to_string(r) +
                                            " outcome differs from the reference: " +
                                            (o.what.empty() ? std::string("no error") : o.what));
    if (want.kind == verdict::non_finite) {
      FUZZ_CHECK(o.nf_count == want.nf_count);
      FUZZ_CHECK(o.nf_first == want.nf_first);
    }
    if (want.kind != verdict::ok) continue;
    FUZZ_CHECK(o.out.size() == want.sum.size());
    for (std::size_t i = 0; i < want.sum.size(); ++i) {
      const bool same = commsgd_fuzz::same_bits(o.out[i], want.sum[i]) ||
                        (o.report.dense && o.out[i] == 0.0f && want.sum[i] == 0.0f);
      FUZZ_CHECK_MSG(same, "sum differs from the reference at " + std::to_string(i));
      // Every rank holds the very same bits.
      FUZZ_CHECK(commsgd_fuzz::same_bits(o.out[i], got[0].out[i]));
    }
    FUZZ_CHECK(o.report.dense == got[0].report.dense);
    std::uint64_t total = 0;
    for (const auto& ri : ranks)
      total += ri.indices.size();
    FUZZ_CHECK(o.report.total == total);
    if (!o.report.dense) {
      FUZZ_CHECK(o.report.counts.size() == static_cast<std::size_t>(n));
      for (int q = 0; q < n; ++q)
        FUZZ_CHECK(o.report.counts[static_cast<std::size_t>(q)] ==
                   ranks[static_cast<std::size_t>(q)].indices.size());
    }
    if (path == commsgd::cost::sparse_path::sparse) FUZZ_CHECK(!o.report.dense);
    if (path == commsgd::cost::sparse_path::dense) FUZZ_CHECK(o.report.dense);
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  byte_source in(data, size);
  if (in.u8() % 4 == 0)
    run<std::uint64_t>(in);
  else
    run<std::uint32_t>(in);
  return 0;
}
