// deprecated: include <commsgd/sync/reducer_concept.hpp>; kept for one release.
#pragma once
#include <commsgd/sync/reducer_concept.hpp>
