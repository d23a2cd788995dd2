// deprecated: include <commsgd/sparsify/sparse_reducer.hpp>; kept for one release.
#pragma once
#include <commsgd/sparsify/sparse_reducer.hpp>
