// Every sync strategy.
#pragma once

#include <commsgd/state/strategy.hpp>
#include <commsgd/sync/async_ps.hpp>
#include <commsgd/sync/choose_exchange.hpp>
#include <commsgd/sync/choose_from_plans.hpp>
#include <commsgd/sync/choose_from_steps.hpp>
#include <commsgd/sync/choose_with_history.hpp>
#include <commsgd/sync/coded_diloco.hpp>
#include <commsgd/sync/delays.hpp>
#include <commsgd/sync/dense_exchange.hpp>
#include <commsgd/sync/diloco.hpp>
#include <commsgd/sync/diloco_codes.hpp>
#include <commsgd/sync/exchange_thread.hpp>
#include <commsgd/sync/first_arrivals.hpp>
#include <commsgd/sync/local_sgd.hpp>
#include <commsgd/sync/measure_network.hpp>
#include <commsgd/sync/partitioned.hpp>
#include <commsgd/sync/reducer_concept.hpp>
#include <commsgd/sync/replica_guard.hpp>
#include <commsgd/sync/sgd.hpp>
#include <commsgd/sync/strategy.hpp>
#include <commsgd/sync/synchronous.hpp>
