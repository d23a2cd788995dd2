// expect: none sums block gradients every step
// Local SGD averages models; coding is defined on per-step block-gradient sums.
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>

using namespace commsgd;
template class commsgd::data_parallel<policy::cssgd<>, policy::dense, policy::local_sgd>;
