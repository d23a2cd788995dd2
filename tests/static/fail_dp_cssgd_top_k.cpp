// expect: nothing to code together
// CSSGD codes dense block gradients; top_k leaves each rank a different sparse set.
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/select/exact.hpp>

using namespace commsgd;
template class commsgd::data_parallel<policy::cssgd<>, policy::top_k<select::exact>, policy::synchronous>;
