#!/bin/bash
# Builds and runs the CUDA benchmarks on a GPU machine with nvcc and g++
# directly (no Bazel/CMake needed there), and prints a results table.
#
# Usage: bench/gpu/run.sh [build-dir] [-- extra flags for cuda_attention_bench]
# Needs: /usr/local/cuda (or NVCC=...), g++ with C++20, and the Debian packages
# libspdlog-dev libfmt-dev libssl-dev (pkg-config). Runs in a few minutes: the
# bench itself is bounded by `timeout` (BENCH_TIMEOUT, default 300 s) and by
# its own --seconds-per-config. Without a GPU it builds, prints one line and
# exits 0. Record the figures in docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-/tmp/kvfabric-gpu-bench}
[[ $# -gt 0 ]] && shift
[[ ${1:-} == "--" ]] && shift
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
CUDA_LIB=${CUDA_LIB:-$(dirname "$(dirname "$NVCC")")/lib64}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-300}
JOBS=${JOBS:-$(nproc)}

if [[ ! -x $NVCC ]]; then
  echo "run.sh: no nvcc at $NVCC (set NVCC=)" >&2
  exit 1
fi
for pkg in spdlog fmt libcrypto; do
  if ! pkg-config --exists "$pkg"; then
    echo "run.sh: pkg-config cannot find $pkg:" \
      "apt-get install libspdlog-dev libfmt-dev libssl-dev pkg-config" >&2
    exit 1
  fi
done
mkdir -p "$OUT"

NVCC_FLAGS=(-std=c++20 -O3 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
            -Xcompiler -fPIC,-Wall,-Wextra -I.)
# -ffp-contract=off: the CPU kernels' bit-for-bit contract (gpu/kernels/BUILD).
CXX_FLAGS=(-std=c++20 -O2 -ffp-contract=off -Wall -Wextra -I. $(pkg-config --cflags spdlog fmt))
CUDA_SRCS=(bench/gpu/cuda_device_bench.cu gpu/cuda/cuda_device.cu gpu/cuda/attention_launchers.cu
           gpu/cuda/cuda_status.cu gpu/cuda/cuda_probe.cu)
HOST_SRCS=(bench/gpu/cuda_attention_bench.cc client/streaming_attention.cc client/stage_lease.cc
           client/device_arena.cc gpu/cuda/host_log.cc gpu/device_checks.cc gpu/kernel_args.cc
           gpu/kernels/cpu_kernels.cc gpu/kernels/reference_attention.cc core/status.cc
           core/units.cc core/model_fingerprint.cc core/sha256.cc)

# Compiles every source in parallel (JOBS at a time); stops at the first error.
objs=()
pids=()
compile() {  # compile SOURCE OBJECT COMMAND...
  local src=$1 obj=$2
  shift 2
  ("$@" -c "$src" -o "$obj" 2>"$obj.log" || { cat "$obj.log" >&2; exit 1; }) &
  pids+=($!)
  objs+=("$obj")
  if ((${#pids[@]} >= JOBS)); then
    wait "${pids[0]}"
    pids=("${pids[@]:1}")
  fi
}
start=$SECONDS
for f in "${CUDA_SRCS[@]}"; do
  compile "$f" "$OUT/$(echo "$f" | tr / _).o" "$NVCC" "${NVCC_FLAGS[@]}"
done
for f in "${HOST_SRCS[@]}"; do
  compile "$f" "$OUT/$(echo "$f" | tr / _).o" g++ "${CXX_FLAGS[@]}"
done
for pid in "${pids[@]}"; do wait "$pid"; done
g++ "${objs[@]}" -L"$CUDA_LIB" -lcudart_static -ldl -lrt -lpthread \
  $(pkg-config --libs spdlog fmt libcrypto) -o "$OUT/cuda_attention_bench"
echo "built $OUT/cuda_attention_bench in $((SECONDS - start)) s"

nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
  --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not available"
rc=0
timeout --signal=INT --kill-after=30 "$BENCH_TIMEOUT" "$OUT/cuda_attention_bench" "$@" \
  | tee "$OUT/results.txt" || rc=$?
if grep -q '^|' "$OUT/results.txt"; then
  echo
  echo "results table ($OUT/results.txt):"
  grep -E '^(###|\||device memory|h2d:|merge:|check:)' "$OUT/results.txt"
fi
if ((rc == 124)); then echo "run.sh: the bench ran past ${BENCH_TIMEOUT} s and was stopped" >&2; fi
exit "$rc"
