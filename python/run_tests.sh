#!/usr/bin/env bash
# //python:python_test: the Python package's tests (python/tests) with the
# module Bazel built, against daemons Bazel built, under Debian's python3
# (python3-torch, python3-pytest; tools/setup.sh). Outside Bazel:
#   KVFABRIC_BIN_DIR=<dir with kvfabric-cached, kvfabric-placement> \
#   PYTHONPATH=<dir holding the kvfabric package with _kvfabric.so> \
#   /usr/bin/python3 -m pytest python/tests
set -euo pipefail
runfiles=${RUNFILES_DIR:-${TEST_SRCDIR:-$0.runfiles}}/kvfabric
python=${KVF_PYTHON:-/usr/bin/python3}
bin=$(mktemp -d "${TEST_TMPDIR:-/tmp}/kvf-bin.XXXXXX")
ln -s "$runfiles/server/cache_host/kvfabric-cached" "$bin/kvfabric-cached"
ln -s "$runfiles/server/placement/kvfabric-placement" "$bin/kvfabric-placement"
export KVFABRIC_BIN_DIR=$bin
export PYTHONPATH=$runfiles/python
export PYTHONDONTWRITEBYTECODE=1
cd "$runfiles/python"
exec "$python" -m pytest -q -s -p no:cacheprovider tests
