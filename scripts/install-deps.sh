#!/usr/bin/env bash
# Installs the Debian 12 packages Cadence's build and demo need (only the missing ones; CLI11
# and nlohmann/json for the tools and apps, never the library);
# `install-deps.sh test` adds what the full test run needs (clang with its sanitizer and OpenMP
# runtimes; Open MPI for the MPI transport tests; gloo for the gloo transport tests; libzmq for
# the ZeroMQ transport tests (its C API: no cppzmq); Ninja,
# which builds faster; Python with its headers, venv, numpy, pytest and torch for
# scripts/test-python.sh); libsodium for the ZeroMQ transport's keys; pkgconf, meson and
# doxygen, bazel-bootstrap for the consumer tests and the API reference).
# Needs root for apt-get; without root it lists what to install and fails.
set -euo pipefail
packages=(cmake make g++ doctest-dev libbenchmark-dev python3 dataset-fashion-mnist zlib1g-dev
          libcli11-dev nlohmann-json3-dev)
if [[ ${1:-} == test ]]; then
  packages+=(clang libclang-rt-14-dev libomp-dev libopenmpi-dev openmpi-bin libgloo-dev libzmq3-dev
             ninja-build python3-dev python3-venv python3-numpy python3-pytest python3-torch
             libsodium-dev pkgconf meson doxygen bazel-bootstrap)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "cadence: missing Debian packages: ${missing[*]}" >&2
  echo "cadence: install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "cadence: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
