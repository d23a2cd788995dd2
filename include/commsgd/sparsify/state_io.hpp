// deprecated: include <commsgd/state/top_k.hpp>; kept for one release.
#pragma once
#include <commsgd/state/top_k.hpp>
