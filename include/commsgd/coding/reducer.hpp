// deprecated: include <commsgd/coding/block_reducer.hpp>; kept for one release.
#pragma once
#include <commsgd/coding/block_reducer.hpp>
