#!/usr/bin/env bash
# Installs every Debian package kvfabric needs to build, test and run its demo.
# Idempotent: when every package is already installed it does nothing (no
# apt-get update, no network). Packages are named, never pinned to a mirror.
set -euo pipefail

PACKAGES=(
  # toolchain and builds
  build-essential pkg-config cmake ninja-build bazel-bootstrap default-jdk-headless
  clang-format clang-tidy
  # clang++ for tools/thread_safety_check.sh (-Wthread-safety; Debian's clang 14) and
  # tools/fuzz.sh (libFuzzer's runtime is in libclang-rt-14-dev)
  clang libclang-rt-14-dev
  # compiler cache of the CMake build (CMakeLists.txt; Bazel has its disk cache)
  ccache
  # core libraries
  libssl-dev libspdlog-dev libfmt-dev libcli11-dev libyaml-cpp-dev nlohmann-json3-dev
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  # control plane
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc prometheus-cpp-dev
  # optional parts: detected by both builds, installed here so CI builds all of them
  libucx-dev ucx-utils libibverbs-dev librdmacm-dev liburing-dev libze-dev
  # the synthetic transformer's matrix multiplies (demo and benchmarks recompute for real)
  libopenblas-dev
  # baselines the cache-host benchmark measures in the same run
  redis-server memcached
  # membership store the placement service can use (integration tests start one)
  etcd-server
  # a real Prometheus scrapes a test cluster; promtool checks /metrics, rules and
  # alert tests (tests/observability_test.cc, deploy/prometheus/)
  prometheus
  # the Python package (python/, docs/python.md): pybind11 binding, built and tested
  # with Debian's python3 (/usr/bin/python3) in a venv that sees these; PyTorch (CPU
  # build) for the zero-copy and vLLM-connector tests
  python3-dev python3-venv python3-pip python3-setuptools python3-wheel python3-pytest
  pybind11-dev python3-pybind11 python3-numpy python3-torch
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "setup: installing ${#missing[@]} missing packages: ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
