#!/usr/bin/env bash
# What an engine's dynamic linker sees in libkvfabric.so:
#
#   client/libkvfabric_test.sh LIBKVFABRIC_SO KVFABRIC_H
#
# Run by both builds (Bazel: //client:libkvfabric_so_test; CMake: ctest
# client_libkvfabric_so_test) and by tests/cmake_consumer/run.sh on the
# installed library. Fails, naming what is wrong, unless
#   - the SONAME is libkvfabric.so.<major>;
#   - libstdc++ is a DT_NEEDED entry (a C program links -lkvfabric alone) and
#     no CUDA library is (the CUDA runtime is linked in statically);
#   - every kvf_* function the header declares is exported;
#   - no symbol of a kvfabric::v1 class (the generated protocol code) and no
#     symbol of gRPC, protobuf, abseil, spdlog or fmt is exported
#     (client/libkvfabric.map).
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 LIBKVFABRIC_SO KVFABRIC_H" >&2
  exit 2
fi
lib=$1
header=$2
problems=0
problem() {
  echo "libkvfabric_test: $lib: $*" >&2
  problems=$((problems + 1))
}

dyn=$(readelf -d "$lib")
soname=$(sed -nE 's/.*Library soname: \[(.*)\].*/\1/p' <<<"$dyn")
[[ $soname =~ ^libkvfabric\.so\.[0-9]+$ ]] || problem "SONAME is '$soname', not libkvfabric.so.<major>"
needed=$(sed -nE 's/.*Shared library: \[(.*)\].*/\1/p' <<<"$dyn")
grep -q '^libstdc++\.so' <<<"$needed" || problem "libstdc++ is not a DT_NEEDED entry"
if grep -E '^lib(cudart|cuda)\.so' <<<"$needed" >/dev/null; then
  problem "needs a CUDA library: $(grep -E '^lib(cudart|cuda)\.so' <<<"$needed" | tr '\n' ' ')"
fi

# Defined dynamic symbols, mangled and demangled (nm prints both in the same
# order). grep without -q reads all its input, so that with pipefail an early
# exit does not turn nm's SIGPIPE into the pipeline's status.
exports=$(nm -D --defined-only "$lib" | awk '{ print $NF }' | sed 's/@.*//')
demangled=$(nm -DC --defined-only "$lib" | cut -d' ' -f3-)

declared=$(grep -oE '\bkvf_[a-z0-9_]+\(' "$header" | tr -d '(' | sort -u)
missing=$(comm -23 <(echo "$declared") <(grep '^kvf_' <<<"$exports" | sort -u) | tr '\n' ' ')
[[ -z $missing ]] || problem "does not export $missing(declared in $header)"

v1=$(grep -E '^((typeinfo|typeinfo name|vtable) for )?kvfabric::v1::' <<<"$demangled" || true)
[[ -z $v1 ]] || problem "exports $(wc -l <<<"$v1") symbols of kvfabric::v1 classes, e.g. $(head -n 1 <<<"$v1")"
foreign=$(grep -E '^((typeinfo|typeinfo name|vtable|guard variable) for )?(google|grpc|grpc_impl|absl|spdlog|fmt)::' \
  <<<"$demangled" || true)
[[ -z $foreign ]] || problem "exports $(wc -l <<<"$foreign") symbols of its dependencies, e.g. $(head -n 1 <<<"$foreign")"

if [[ $problems -ne 0 ]]; then
  echo "libkvfabric_test: $problems problem(s) (exports: client/libkvfabric.map)" >&2
  exit 1
fi
echo "libkvfabric_test: $lib: SONAME $soname, $(wc -l <<<"$declared") kvf_* functions exported," \
  "$(grep -c '^kvfabric::' <<<"$demangled") kvfabric:: symbols, nothing of kvfabric::v1 or its dependencies"
