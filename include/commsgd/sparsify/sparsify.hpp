// Everything in sparsify/: the concept, none, top_k with error feedback, sparse_vector, the all-gather
// exchange and the sparse all-reduce.
#pragma once

#include <commsgd/sparsify/allreduce.hpp>
#include <commsgd/sparsify/allreduce_reducer.hpp>
#include <commsgd/sparsify/finite.hpp>
#include <commsgd/sparsify/none.hpp>
#include <commsgd/sparsify/sparse_exchange.hpp>
#include <commsgd/sparsify/sparse_reducer.hpp>
#include <commsgd/sparsify/sparse_vector.hpp>
#include <commsgd/sparsify/sparsifier.hpp>
#include <commsgd/sparsify/top_k.hpp>
#include <commsgd/state/top_k.hpp>
