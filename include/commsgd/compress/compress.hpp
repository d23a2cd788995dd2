// Everything in compress/: the compressor concept, its reducer, error feedback and the models.
//
// Models (each a compressor, checked by a static_assert in its header, with its policy tag beside it):
//   compress::fp16, compress::bf16   every value in 16 bits, all-gathered           (compress/half.hpp)
//   compress::random_k               k shared-seed positions, values all-reduced     (compress/random_k.hpp)
//   compress::sign                   EF-SignSGD: 1 bit per value and a scale         (compress/sign.hpp)
//   compress::qsgd                   QSGD with s levels, stochastic, unbiased        (compress/qsgd.hpp)
//   compress::powersgd               rank-r factors with error feedback, warm start,
//                                    three all-reduces per round                     (compress/powersgd.hpp)
// Their bytes per round are in cost/compress.hpp and cost/powersgd.hpp. compress::hook_momentum
// (compress/momentum.hpp) keeps momentum beside any of them, for an optimizer run without it.
#pragma once

#include <commsgd/compress/compressed_reducer.hpp>
#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/error_feedback.hpp>
#include <commsgd/compress/half.hpp>
#include <commsgd/compress/momentum.hpp>
#include <commsgd/compress/powersgd.hpp>
#include <commsgd/compress/qsgd.hpp>
#include <commsgd/compress/random_k.hpp>
#include <commsgd/compress/sign.hpp>
