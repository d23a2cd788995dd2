// Analytic per-node byte and time models of every exchange.
#pragma once

#include <commsgd/cost/candidate.hpp>
#include <commsgd/cost/coding_traffic.hpp>
#include <commsgd/cost/compress.hpp>
#include <commsgd/cost/gradient_code.hpp>
#include <commsgd/cost/overlap.hpp>
#include <commsgd/cost/powersgd.hpp>
#include <commsgd/cost/redundancy.hpp>
#include <commsgd/cost/sparse.hpp>
#include <commsgd/cost/sparse_allreduce.hpp>
#include <commsgd/cost/time.hpp>
#include <commsgd/cost/top_k_plan.hpp>
