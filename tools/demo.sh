#!/usr/bin/env bash
# The README's first command: installs what it needs, builds everything and
# runs the main job. Until `kvfabric demo` lands (the client-library issue),
# the main job is `kvfabric version`: the version and the optional parts this
# build detected. Arguments are passed to `kvfabric`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel build //...
if [[ $# -eq 0 ]]; then set -- version; fi
exec bazel-bin/cli/kvfabric "$@"
