#!/usr/bin/env bash
# Installs the Debian packages commsgd builds and runs with, when any is missing.
set -euo pipefail
packages=(cmake ninja-build g++ python3 zlib1g-dev
          libboost-mpi-dev openmpi-bin libopenmpi-dev
          doctest-dev libbenchmark-dev libeigen3-dev
          dataset-fashion-mnist gnuplot-nox
          python3-torch libtorch-dev libgloo-dev pybind11-dev python3-pytest python3-venv python3-pip)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "commsgd: installing ${missing[*]}"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
