// Every host threshold selector, the compaction step and the input checks.
#pragma once

#include <commsgd/select/chunked.hpp>
#include <commsgd/select/compact.hpp>
#include <commsgd/select/exact.hpp>
#include <commsgd/select/hierarchical.hpp>
#include <commsgd/select/key.hpp>
#include <commsgd/select/laplace_bisect.hpp>
#include <commsgd/select/laplace_math.hpp>
#include <commsgd/select/radix.hpp>
#include <commsgd/select/sampled.hpp>
#include <commsgd/select/selector.hpp>
#include <commsgd/select/validate.hpp>
