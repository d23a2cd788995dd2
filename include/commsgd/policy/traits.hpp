// The open seam data_parallel<Coding, Compression, Sync, C> composes through.
//
// A policy is a small tag type in namespace commsgd::policy. Its header (policy/<name>.hpp for the built-in
// ones) specialises one of the three traits below next to the tag, saying how to build its part over a
// communicator, which options it takes and which partners it accepts; data_parallel.hpp names no policy and
// includes none. A type written outside the library plugs in the same way
// (tests/unit/data_parallel_user_policies.cpp does it with a sparsifier and a sync strategy).
//
// The second slot holds a compression policy: what happens to the block gradients between backward and the
// exchange. Sparsification (top_k) is one kind; quantisation (qsgd, sign), low rank (powersgd), random-k and
// fp16/bf16 are others, and policy::dense is none.
//
//   coding_traits<P>      using options = <its settings, an aggregate; no_options for none>;
//                         template <class C> using type = <a coding::coding_scheme over C>;
//                         static type<C> make(C&, std::size_t length, const options&);
//                         static constexpr bool plain;   one block per rank summed by the all-reduce
//                         template <class Compression> static consteval bool accepts();
//   compression_traits<P> using options = <its settings>;
//                         static constexpr bool dense_blocks;  true: the blocks reach the coding scheme as
//                         they are; false: using type = <a sparsify::sparsifier>;
//                         static type make(std::size_t length, const options&); its messages are summed
//                         by sparsify::exchanger, one per rank (so only a plain coding policy pairs), with
//                         options::exchange (a sparsify::exchange_options) where the options have one;
//                         or, where the policy exchanges in its own way (several collectives, another
//                         reduction, values handed back to error feedback), instead of type and make:
//                         template <class Scheme, class C> using reducer = <a sync::reducer>;
//                         template <class C> static reducer<Scheme, C> make_reducer(C&, Scheme,
//                                                                 std::size_t length, const options&);
//                         such a reducer also offers compression() (its state, for checkpoints) and
//                         last() (a const comm::exchange_report&), as sparsify::sparse_reducer does
//   sync_traits<P>        using options = <its settings>;
//                         template <class C> using type = <a sync::sync_strategy over C>;
//                         static type<C> make(C&, std::size_t length, const options&, float lr);
//                         template <class Coding, class Compression> static consteval bool accepts();
//
// data_parallel's options are composed from the three (policy::options below), so each policy's settings
// travel with it and a translation unit compiles only the policies it names.
//
// accepts() returns true or fails a static_assert whose message says why the pair makes no sense: a C++20
// static_assert message must be a literal, so the reason lives in the header of the policy that refuses. A
// sync strategy whose step takes a reducer (sync/reducer_concept.hpp) sums block gradients and so composes
// with any coding scheme and compression; one that exchanges by itself takes one gradient per rank. Rules
// that several policies share live below (exchanges_by_itself, codes_dense_blocks) for their traits to
// inherit.
#pragma once

#include <commsgd/config.hpp>

#include <cstdint>
#include <type_traits>

namespace commsgd::inline v1::policy {

// What the primary templates assert on: false, but only once P is known, so that merely declaring them is fine.
template <class P>
inline constexpr bool never_specialised = false;

// The primary templates are never used: a type reaches them only when no header specialised its traits, and
// then the assertion names the seam instead of a missing member three levels down.
template <class P>
struct coding_traits {
  static_assert(never_specialised<P>,
                "commsgd::policy::coding_traits<P>: P is not a coding policy; its header "
                "must specialise commsgd::policy::coding_traits (policy/traits.hpp)");
};
template <class P>
struct compression_traits {
  static_assert(never_specialised<P>,
                "commsgd::policy::compression_traits<P>: P is not a compression policy; its header must "
                "specialise commsgd::policy::compression_traits (policy/traits.hpp)");
};
template <class P>
struct sync_traits {
  static_assert(never_specialised<P>, "commsgd::policy::sync_traits<P>: P is not a sync policy; its header "
                                      "must specialise commsgd::policy::sync_traits (policy/traits.hpp)");
};

// The options of a part that takes none.
struct no_options {};

// data_parallel<Coding, Compression, Sync, C>::options: one field per slot, each the options type its policy
// names, plus what the composition itself reads.
template <class Coding, class Compression, class Sync>
struct options {
  float lr = 0.01f; // every strategy: (0, inf)
  typename coding_traits<Coding>::options coding{};
  typename compression_traits<Compression>::options compression{};
  typename sync_traits<Sync>::options sync{};
  // Check every this many steps that replicas which should be identical are, 0 = off (sync/replica_guard.hpp).
  std::int64_t replica_check_every = 0;
};

// Whether a compression policy leaves the block gradients dense (nothing between them and the coding scheme).
template <class P>
inline constexpr bool is_dense = compression_traits<P>::dense_blocks;

// Whether a compression policy builds its own reducer over a coding scheme and a communicator, instead of
// handing its messages to sparsify::exchanger.
// (The alias goes through reducer_of because GCC 12 rejects a member alias template named directly in a
// requires-expression.)
template <class Traits, class Scheme, class C>
using reducer_of = typename Traits::template reducer<Scheme, C>;
template <class P, class Scheme, class C>
concept builds_reducer = requires {
  typename reducer_of<compression_traits<P>, Scheme, C>;
};

// Whether a coding policy is one block per rank summed by the communicator's all-reduce, which is what a
// strategy that exchanges by itself does anyway.
template <class P>
inline constexpr bool is_plain = coding_traits<P>::plain;

// The accepts() of a sync strategy that exchanges models or partitions itself: it takes this rank's whole
// gradient, so there is no block to code and no message to compress.
struct exchanges_by_itself {
  template <class Coding, class Compression>
  static consteval bool accepts() {
    static_assert(is_plain<Coding> && is_dense<Compression>,
                  "commsgd::data_parallel<Coding, Compression, Sync>: this Sync strategy exchanges by itself "
                  "(local_sgd averages models, async_ps pushes to a server, partitioned exchanges partitions "
                  "as backward produces them); none sums block gradients every step, which coding (cssgd, "
                  "uncoded_shuffle, all-gather, unicast) and error-feedback sparsification (top_k) are "
                  "defined on. Use policy::uncoded<> with policy::dense");
    return true;
  }
};

// The options of a coding scheme with redundancy (cssgd, uncoded_shuffle, gradient_code).
struct redundancy_options {
  int redundancy = 1; // ranks that compute each block: [1, n]
};

// The plain and accepts() of a coding scheme with redundancy, which combines or shuffles segments of the
// dense block gradients that several ranks hold (cssgd, uncoded_shuffle).
struct codes_dense_blocks {
  using options = redundancy_options;
  static constexpr bool plain = false;

  template <class Compression>
  static consteval bool accepts() {
    static_assert(is_dense<Compression>,
                  "commsgd::data_parallel<cssgd or uncoded_shuffle, Compression, Sync>: a coded (or "
                  "shuffled) exchange combines equally shaped dense block gradients segment by segment, "
                  "while a sparsifier (top_k) leaves each rank a different sparse set, so there is nothing "
                  "to code together; use policy::uncoded<> with the sparsifier, or the coded scheme with "
                  "policy::dense");
    return true;
  }
};

// A strategy's own options with the composition's lr put in: one learning rate for every strategy.
template <class StrategyOptions>
StrategyOptions with_lr(StrategyOptions so, float lr) {
  so.lr = lr;
  return so;
}

} // namespace commsgd::inline v1::policy
