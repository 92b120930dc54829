#!/usr/bin/env bash
# What an engine links, checked against an installed kvfabric:
#
#   tests/cmake_consumer/run.sh PREFIX [BUILD_DIR]
#
# PREFIX is a `cmake --install` prefix (CI: build/ci-install); BUILD_DIR
# (default build/consumer) gets the consumers' build trees and the cluster's
# temporary folder is made with mktemp. Steps, each printed:
#
#   1. builds the C++ consumer (main.cc, kvfabric::kvfabric), the C-only
#      consumer (c/, project(... LANGUAGES C), kvfabric::kvfabric) and the C
#      consumer against kvfabric::kvfabric_static, each a separate project
#      that knows only PREFIX;
#   2. checks the shared library (client/libkvfabric_test.sh: its SONAME,
#      libstdc++ among its DT_NEEDED entries, every kvf_* function exported,
#      the generated protocol classes and its dependencies' symbols not) and
#      that the C consumer needs libkvfabric alone (not gRPC, CUDA, libstdc++);
#   3. starts a cluster from PREFIX/bin on loopback: kvfabric-placement and two
#      kvfabric-cached daemons, ports picked by the kernel (:0, read back from
#      --ready-file), and waits until placement lists both daemons;
#   4. runs the C++ consumer (Client::Open and Match), then the C round trip
#      (consumer_c: save a 4096-token prompt, finish, load it back and compare
#      every byte) with the shared and with the static library, each with its
#      own seed so each saves a chain the cluster does not hold yet.
#
# Exits non-zero on the first failure, printing the daemons' logs. The cluster
# is stopped and its folder removed however the script ends (trap).
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 PREFIX [BUILD_DIR]" >&2
  exit 2
fi
prefix=$(realpath "$1")
build=$(realpath -m "${2:-build/consumer}")
src=$(cd "$(dirname "$0")" && pwd)
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi

say() { echo "cmake_consumer: $*"; }
die() {
  echo "cmake_consumer: FAILED: $*" >&2
  exit 1
}

# ---- 1. Build the consumers against PREFIX only.
configure_and_build() {  # configure_and_build SOURCE BUILD [CMAKE ARGS...]
  local s=$1 b=$2
  shift 2
  cmake -S "$s" -B "$b" "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix" "$@" >"$b.configure.log" 2>&1 ||
    { cat "$b.configure.log" >&2; die "configure $s"; }
  cmake --build "$b" >"$b.build.log" 2>&1 || { cat "$b.build.log" >&2; die "build $s"; }
}
mkdir -p "$build"
say "building the C++, C and static C consumers against $prefix"
configure_and_build "$src" "$build/cc"
configure_and_build "$src/c" "$build/c"
configure_and_build "$src/c" "$build/c-static" -DKVF_CONSUMER_STATIC=ON

# ---- 2. The shared library, as the dynamic linker sees it
#         (client/libkvfabric_test.sh), and what the C program needs.
lib=$(find "$prefix" -name 'libkvfabric.so.*.*' -type f | head -n 1)
[[ -n $lib ]] || die "no libkvfabric.so.* under $prefix"
"$src/../../client/libkvfabric_test.sh" "$lib" "$prefix/include/kvfabric/kvfabric.h" ||
  die "the installed libkvfabric.so"
soname=$(readelf -d "$lib" | sed -nE 's/.*Library soname: \[(.*)\].*/\1/p')
needed=$(readelf -d "$build/c/consumer_c" | sed -nE 's/.*Shared library: \[(.*)\].*/\1/p' | tr '\n' ' ')
grep -q "$soname" <<<"$needed" || die "consumer_c does not need $soname: $needed"
if grep -E 'grpc|protobuf|cuda|ucp|stdc' <<<"$needed" >/dev/null; then
  die "the C consumer links more than libkvfabric: $needed"
fi
say "$(basename "$lib"): $(du -k "$lib" | cut -f1) KiB; consumer_c needs: $needed"

# ---- 3. A cluster from the installed binaries.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvf-consumer.XXXXXX")
pids=()
cleanup() {
  local rc=$?
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [[ $rc -ne 0 ]]; then
    for log in "$tmp"/*.log; do
      [[ -f $log ]] && { echo "--- $log" >&2; tail -n 40 "$log" >&2; }
    done
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

wait_ready() {  # wait_ready FILE PID NAME: the server wrote FILE (60 s at most)
  local i
  for ((i = 0; i < 600; i++)); do
    [[ -s $1 ]] && return 0
    kill -0 "$2" 2>/dev/null || die "$3 exited before it was ready"
    sleep 0.1
  done
  die "$3 not ready after 60 s"
}

"$prefix/bin/kvfabric-placement" --insecure --grpc-address=127.0.0.1:0 --metrics-address=off \
  --log-level=warn --ready-file="$tmp/placement.ready" >"$tmp/placement.log" 2>&1 &
pids+=($!)
wait_ready "$tmp/placement.ready" "$!" kvfabric-placement
placement=$(sed -n 's/^grpc=//p' "$tmp/placement.ready")
for i in 0 1; do
  "$prefix/bin/kvfabric-cached" --host-id="consumer-$i" --insecure --grpc-address=127.0.0.1:0 \
    --transport-address=127.0.0.1:0 --metrics-address=off --lock-memory=off --log-level=warn \
    --host-pool-bytes=32MiB --host-page-bytes=32KiB --placement-address="$placement" \
    --ready-file="$tmp/cache-$i.ready" >"$tmp/cache-$i.log" 2>&1 &
  pids+=($!)
  wait_ready "$tmp/cache-$i.ready" "$!" "kvfabric-cached $i"
done
# The daemons register after writing their ready files: wait until placement
# plans over both.
for ((i = 0; ; i++)); do
  status=$("$prefix/bin/kvfabric" status --insecure --placement "$placement" --interval 0 2>/dev/null || true)
  grep -q "^2 live cache hosts" <<<"$status" && break
  ((i < 300)) || die "placement $placement does not list both daemons after 30 s"
  sleep 0.1
done
say "cluster up: placement $placement, daemons consumer-0 and consumer-1 (folder $tmp)"

# ---- 4. The consumers against it.
"$build/cc/consumer" || die "C++ consumer (offline checks)"
"$build/cc/consumer" "$placement" || die "C++ consumer against the cluster"
"$build/c/consumer_c" "$placement" 1 || die "C round trip with libkvfabric.so"
"$build/c-static/consumer_c" "$placement" 2 || die "C round trip with libkvfabric.a"
say "ok"
