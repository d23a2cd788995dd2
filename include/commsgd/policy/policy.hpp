// Every built-in policy: the tags data_parallel<Coding, Compression, Sync, C> is written with, each with the
// traits that build its part. One header per policy, so a translation unit can include only the ones it uses.
#pragma once

#include <commsgd/policy/async_ps.hpp>
#include <commsgd/policy/cssgd.hpp>
#include <commsgd/policy/dense.hpp>
#include <commsgd/policy/first_arrivals.hpp>
#include <commsgd/policy/gradient_code.hpp>
#include <commsgd/policy/half.hpp>
#include <commsgd/policy/local_sgd.hpp>
#include <commsgd/policy/partitioned.hpp>
#include <commsgd/policy/powersgd.hpp>
#include <commsgd/policy/qsgd.hpp>
#include <commsgd/policy/random_k.hpp>
#include <commsgd/policy/sign.hpp>
#include <commsgd/policy/synchronous.hpp>
#include <commsgd/policy/top_k.hpp>
#include <commsgd/policy/top_k_allreduce.hpp>
#include <commsgd/policy/traits.hpp>
#include <commsgd/policy/uncoded.hpp>
#include <commsgd/policy/uncoded_shuffle.hpp>
