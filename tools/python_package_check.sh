#!/usr/bin/env bash
# Installs the Python package as a user would (docs/python.md: pip install .
# into a venv that sees Debian's torch, no network) and runs python/tests
# against the installed package, outside the source tree, with daemons from
# BIN_DIR. CI runs it after the CMake build (.ci/run).
#
# usage: tools/python_package_check.sh CMAKE_BUILD_DIR BIN_DIR
#        tools/python_package_check.sh --bazel   (tools/test.sh: the module and
#                                                 daemons Bazel built)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvf-pip.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [[ $# -eq 1 && $1 == --bazel ]]; then
  bazel_bin=$root/bazel-bin
  export KVF_PREBUILT_MODULE=$bazel_bin/python/kvfabric/_kvfabric.so
  bin=$tmp/bin
  mkdir -p "$bin"
  ln -s "$bazel_bin/server/cache_host/kvfabric-cached" "$bin/"
  ln -s "$bazel_bin/server/placement/kvfabric-placement" "$bin/"
elif [[ $# -eq 2 ]]; then
  export KVF_CMAKE_BUILD_DIR=$(realpath "$1")
  bin=$(realpath "$2")
else
  echo "usage: $0 CMAKE_BUILD_DIR BIN_DIR | --bazel" >&2
  exit 2
fi
/usr/bin/python3 -m venv --system-site-packages "$tmp/venv"
"$tmp/venv/bin/pip" install --no-build-isolation --no-deps --no-index --quiet "$root"
cd "$tmp"
where=$("$tmp/venv/bin/python" -c 'import kvfabric; print(kvfabric.__file__)')
case $where in
  "$tmp/venv/"*) echo "python_package_check: imports the installed package: $where" ;;
  *) echo "python_package_check: FAILED: kvfabric imported from $where" >&2; exit 1 ;;
esac
KVFABRIC_BIN_DIR=$bin PYTHONDONTWRITEBYTECODE=1 "$tmp/venv/bin/python" -m pytest -q \
  -p no:cacheprovider "$root/python/tests"
