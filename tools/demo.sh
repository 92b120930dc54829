#!/usr/bin/env bash
# The README's first command: installs what it needs, builds `kvfabric`
# optimised (CMake preset "ci", RelWithDebInfo: the demo's attention runs on
# the CPU backend and a debug build is several times slower) and runs
# `kvfabric demo` on an embedded local cluster. Arguments go to `kvfabric`
# instead (e.g. `tools/demo.sh demo --max-history-tokens 65536`,
# `tools/demo.sh version`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
cmake --preset ci >/dev/null
cmake --build --preset ci --target cli_kvfabric
if [[ $# -eq 0 ]]; then set -- demo; fi
exec build/ci/cli/kvfabric "$@"
