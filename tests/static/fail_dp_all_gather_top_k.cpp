// expect: brings its own sparse exchange
// A sparsifier sums its messages itself, so only the default uncoded<> assignment goes with it.
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/select/exact.hpp>

using namespace commsgd;
template class commsgd::data_parallel<policy::uncoded<coding::by_all_gather>, policy::top_k<select::exact>,
                                      policy::synchronous>;
