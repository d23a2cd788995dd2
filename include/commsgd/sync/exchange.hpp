// deprecated: include <commsgd/sync/dense_exchange.hpp>; kept for one release.
#pragma once
#include <commsgd/sync/dense_exchange.hpp>
