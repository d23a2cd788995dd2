// Everything in compress/: the compressor concept, its reducer and the models (powersgd).
#pragma once

#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/powersgd.hpp>
#include <commsgd/compress/reducer.hpp>
