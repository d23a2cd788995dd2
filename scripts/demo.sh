#!/usr/bin/env bash
# Runs the Fashion-MNIST experiment: every exchange family, time to accuracy and bytes per node; writes
# build/demo/RESULTS.md, accuracy_vs_time.png and bytes_per_scheme.png (plots when gnuplot is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset dev
cmake --build --preset dev -j "$(nproc)" --target fashion_mnist
mkdir -p build/demo
./build/dev/examples/fashion_mnist/fashion_mnist experiment --out build/demo "$@"
