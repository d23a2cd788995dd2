// The conformance suite on comm::local with 1, 2, 3, 4 and 7 ranks.
#include "cases.hpp"

#include <commsgd/comm/local.hpp>

#define COMMSGD_LOCAL_CASE(name)                                                                             \
  TEST_CASE("conformance/local/" #name) {                                                                    \
    for (int n : {1, 2, 3, 4, 7}) {                                                                          \
      CAPTURE(n);                                                                                            \
      commsgd::comm::local_group(n).run([](commsgd::comm::local& c) { conformance::name(c); });              \
    }                                                                                                        \
  }
COMMSGD_CONFORMANCE_CASES(COMMSGD_LOCAL_CASE)
