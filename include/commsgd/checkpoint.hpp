// deprecated: include <commsgd/state/data_parallel.hpp>; kept for one release.
#pragma once
#include <commsgd/state/data_parallel.hpp>
