// The supported compositions all instantiate.
#include <commsgd/comm/local.hpp>
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>
#include <commsgd/select/radix.hpp>

using namespace commsgd;
template class commsgd::data_parallel<policy::uncoded<>, policy::dense, policy::synchronous>;
template class commsgd::data_parallel<policy::uncoded<coding::by_unicast>, policy::dense,
                                      policy::synchronous>;
template class commsgd::data_parallel<policy::cssgd<coding::int32_sum>, policy::dense, policy::synchronous>;
template class commsgd::data_parallel<policy::uncoded_shuffle, policy::dense, policy::synchronous>;
template class commsgd::data_parallel<policy::uncoded<>, policy::top_k<select::radix>, policy::synchronous>;
template class commsgd::data_parallel<policy::uncoded<>, policy::dense, policy::local_sgd>;
template class commsgd::data_parallel<policy::uncoded<>, policy::dense, policy::async_ps>;
template class commsgd::data_parallel<policy::uncoded<>, policy::dense, policy::partitioned>;
template class commsgd::data_parallel<policy::uncoded<>, policy::top_k<select::radix, std::uint64_t>,
                                      policy::synchronous>;
template class commsgd::data_parallel<policy::cssgd<>, policy::dense, policy::synchronous, comm::local>;
