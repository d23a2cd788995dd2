// expect: Compression is not a compression policy
// A type with no compression_traits (or old sparsifier_traits) specialisation is refused by name, before
// anything is built from it.
#include <commsgd/data_parallel.hpp>

using namespace commsgd;
struct no_traits {};
template class commsgd::data_parallel<policy::uncoded<>, no_traits, policy::synchronous>;
