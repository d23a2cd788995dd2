// deprecated: include <commsgd/state/strategy.hpp>; kept for one release.
#pragma once
#include <commsgd/state/strategy.hpp>
