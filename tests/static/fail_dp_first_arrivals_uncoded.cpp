// expect: needs a code that decodes the sum from any n - s ranks
// Proceeding with the first n - s answers is defined only where any n - s vectors give the sum.
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>

using namespace commsgd;
template class commsgd::data_parallel<policy::uncoded<>, policy::dense, policy::first_arrivals>;
