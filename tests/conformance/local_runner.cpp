// The conformance suite on comm::local with 1, 2, 3, 4 and 7 ranks.
#include "cases.hpp"

#include <commsgd/comm/local.hpp>

// The cases are written against the concept; this runner only makes sense for a model of it, and so does
// the metered wrapper the metered_counts case builds around it.
static_assert(commsgd::comm::communicator<commsgd::comm::local>);
static_assert(commsgd::comm::communicator<commsgd::comm::metered<commsgd::comm::local>>);

#define COMMSGD_LOCAL_CASE(name)                                                                             \
  TEST_CASE("conformance/local/" #name) {                                                                    \
    for (int n : {1, 2, 3, 4, 7}) {                                                                          \
      CAPTURE(n);                                                                                            \
      commsgd::comm::local_group(n).run([](commsgd::comm::local& c) { conformance::name(c); });              \
    }                                                                                                        \
  }
COMMSGD_CONFORMANCE_CASES(COMMSGD_LOCAL_CASE)
