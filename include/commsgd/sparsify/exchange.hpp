// deprecated: include <commsgd/sparsify/sparse_exchange.hpp>; kept for one release.
#pragma once
#include <commsgd/sparsify/sparse_exchange.hpp>
