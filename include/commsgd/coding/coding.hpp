// Everything in coding/: the scheme concept, the assignment, the combiners and every scheme.
#pragma once

#include <commsgd/coding/assignment.hpp>
#include <commsgd/coding/block_reducer.hpp>
#include <commsgd/coding/combiner.hpp>
#include <commsgd/coding/cssgd.hpp>
#include <commsgd/coding/gradient_code.hpp>
#include <commsgd/coding/gradient_code_scheme.hpp>
#include <commsgd/coding/groups.hpp>
#include <commsgd/coding/scheme.hpp>
#include <commsgd/coding/subsets.hpp>
#include <commsgd/coding/uncoded.hpp>
#include <commsgd/coding/uncoded_shuffle.hpp>
