// expect: constraint failure|constraints not satisfied
// metered<> of something that is not a communicator is refused by the concept, with the reason.
#include <commsgd/comm/metered.hpp>

commsgd::comm::metered<int>* wrong = nullptr;
