// expect: P is not a compression policy
// A type with no compression_traits specialisation is refused by the primary template, which names the
// seam.
#include <commsgd/data_parallel.hpp>
#include <commsgd/policy/policy.hpp>

using namespace commsgd;
struct no_traits {};
template class commsgd::data_parallel<policy::uncoded<>, no_traits, policy::synchronous>;
