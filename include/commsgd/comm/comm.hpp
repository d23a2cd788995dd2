// Every communicator that needs nothing beyond the standard library (comm::mpi is in comm/mpi.hpp).
#pragma once

#include <commsgd/comm/archetype.hpp>
#include <commsgd/comm/communicator.hpp>
#include <commsgd/comm/local.hpp>
#include <commsgd/comm/metered.hpp>
#include <commsgd/comm/over_messages.hpp>
#include <commsgd/comm/poll.hpp>
#include <commsgd/comm/simulated.hpp>
