#!/usr/bin/env bash
# Runs the Fashion-MNIST experiment: every exchange scheme, time to accuracy and bytes per node.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset dev
cmake --build --preset dev -j "$(nproc)" --target fashion_mnist
mkdir -p build/demo
./build/dev/examples/fashion_mnist/fashion_mnist experiment --out build/demo "$@"
