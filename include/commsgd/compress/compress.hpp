// Everything in compress/: the compressor concept, its reducer and the models.
#pragma once

#include <commsgd/compress/compressor.hpp>
#include <commsgd/compress/reducer.hpp>
