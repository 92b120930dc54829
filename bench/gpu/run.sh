#!/bin/bash
# Builds and runs the CUDA device benchmark on a GPU machine, with nvcc
# directly (no Bazel/CMake needed there). Usage: bench/gpu/run.sh [build-dir]
# Prints the figures; record them in docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-/tmp/kvfabric-gpu-bench}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p "$OUT"
FLAGS=(-std=c++20 -O3 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
       -Xcompiler -fPIC,-Wall -I.)
SRCS=(bench/gpu/cuda_device_bench.cu gpu/cuda/cuda_device.cu gpu/cuda/attention_launchers.cu
      gpu/cuda/cuda_status.cu)
HOST_SRCS=(gpu/cuda/host_log.cc gpu/device_checks.cc gpu/kernel_args.cc core/status.cc
           core/units.cc core/model_fingerprint.cc core/sha256.cc)
objs=()
for f in "${SRCS[@]}"; do
  o="$OUT/$(echo "$f" | tr / _).o"
  "$NVCC" "${FLAGS[@]}" -c "$f" -o "$o"
  objs+=("$o")
done
for f in "${HOST_SRCS[@]}"; do
  o="$OUT/$(echo "$f" | tr / _).o"
  g++ -std=c++20 -O2 -I. $(pkg-config --cflags spdlog 2>/dev/null) -c "$f" -o "$o"
  objs+=("$o")
done
g++ "${objs[@]}" -L/usr/local/cuda/lib64 -lcudart_static -ldl -lrt -lpthread -lspdlog -lfmt \
  -lcrypto -o "$OUT/cuda_device_bench"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
  --format=csv,noheader || true
"$OUT/cuda_device_bench"
