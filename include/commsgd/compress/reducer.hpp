// deprecated: include <commsgd/compress/compressed_reducer.hpp>; kept for one release.
#pragma once
#include <commsgd/compress/compressed_reducer.hpp>
