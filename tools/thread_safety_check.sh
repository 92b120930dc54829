#!/usr/bin/env bash
# Clang's thread-safety analysis over kvfabric's libraries: every .cc under
# client/ core/ gpu/ server/ transport/ cli/ that the CMake build compiles is
# compiled again with `clang++ -fsyntax-only -Wthread-safety
# -Werror=thread-safety` (compile only: nothing is linked or run). Members
# declared KVF_GUARDED_BY and functions declared KVF_REQUIRES
# (core/thread_annotations.h, core/mutex.h) are checked; code still on plain
# std::mutex is not, and passes.
#
# Include paths, definitions and the language standard come from the CMake
# build's compile_commands.json, so the check sees exactly the headers the
# build does. CI runs it after the CMake workflow has configured and built
# build/ci. Given a build directory with no compile_commands.json, it
# configures one (cmake -G Ninja) and generates only the protobuf/gRPC headers
# the sources include; nothing else is built.
#
# Usage: tools/thread_safety_check.sh [--build-dir DIR] [--jobs N] [--verbose] [PATH_PREFIX...]
#   --build-dir  CMake build directory (default build/ci)
#   --jobs       parallel compiles (default: the number of CPUs)
#   --verbose    print every failing file's full diagnostics
#   PATH_PREFIX  check only sources under these (default: the folders above)
# Environment: CLANGXX (default clang++; Debian's clang 14 is what CI uses).
# Output: one line per failing file (with its first diagnostic), then a summary
# line. Exit status 0 when every file compiles without a warning, 1 when any
# does not, 2 on set-up errors.
set -uo pipefail
cd "$(dirname "$0")/.."

build_dir=build/ci
jobs=$(nproc 2>/dev/null || echo 2)
verbose=0
prefixes=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --build-dir) build_dir=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --verbose) verbose=1; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "thread_safety_check: unknown option $1" >&2; exit 2 ;;
    *) prefixes+=("$1"); shift ;;
  esac
done
if [[ ${#prefixes[@]} -eq 0 ]]; then
  prefixes=(client/ core/ gpu/ server/ transport/ cli/)
fi
clangxx=${CLANGXX:-clang++}
if ! command -v "$clangxx" >/dev/null; then
  echo "thread_safety_check: $clangxx not found (tools/setup.sh installs clang)" >&2
  exit 2
fi

start=$(date +%s)
if [[ ! -f $build_dir/compile_commands.json ]]; then
  echo "thread_safety_check: configuring $build_dir (no compile_commands.json there)"
  mkdir -p "$build_dir"
  if ! cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DBUILD_TESTING=ON >"$build_dir/thread_safety_configure.log" 2>&1; then
    cat "$build_dir/thread_safety_configure.log" >&2
    echo "thread_safety_check: cmake configure failed" >&2
    exit 2
  fi
fi
# The generated headers (.pb.h, .grpc.pb.h) that sources include: up to date
# already after a build; generated here (protoc only) otherwise.
if [[ -f $build_dir/build.ninja ]]; then
  mapfile -t generated < <(ninja -C "$build_dir" -t targets all 2>/dev/null |
    sed -n -E 's/^([^:]*\.h): CUSTOM_COMMAND$/\1/p' | grep -v '^/')
  if [[ ${#generated[@]} -gt 0 ]] && ! ninja -C "$build_dir" "${generated[@]}" >/dev/null; then
    echo "thread_safety_check: generating headers in $build_dir failed" >&2
    exit 2
  fi
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One line per source: "<relative path>\t<flags>", flags being the include
# paths, definitions and -std of its compile command.
if ! python3 - "$build_dir/compile_commands.json" "$PWD" "${prefixes[@]}" >"$work/sources" <<'EOF'
import json, os, shlex, sys

db_path, root, prefixes = sys.argv[1], os.path.realpath(sys.argv[2]), tuple(sys.argv[3:])
KEEP_WITH_ARG = {"-I", "-isystem", "-iquote", "-include", "-D", "-U"}
seen = set()
for entry in json.load(open(db_path)):
    path = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
    rel = os.path.relpath(path, root)
    if not rel.endswith(".cc") or not rel.startswith(prefixes) or rel in seen:
        continue
    seen.add(rel)
    args = entry.get("arguments") or shlex.split(entry["command"])
    flags, i = [], 1
    while i < len(args):
        a = args[i]
        if a in KEEP_WITH_ARG and i + 1 < len(args):
            value = args[i + 1]
            if a in ("-I", "-isystem", "-iquote", "-include"):
                value = os.path.join(entry["directory"], value)
            flags += [a, value]
            i += 2
            continue
        if a.startswith(("-I", "-D", "-U", "-std=")) or a.startswith("-isystem"):
            if a.startswith("-I") and not os.path.isabs(a[2:]):
                a = "-I" + os.path.join(entry["directory"], a[2:])
            flags.append(a)
        i += 1
    print(rel + "\t" + shlex.join(flags))
EOF
then
  echo "thread_safety_check: cannot read $build_dir/compile_commands.json" >&2
  exit 2
fi
total=$(wc -l <"$work/sources")
if [[ $total -eq 0 ]]; then
  echo "thread_safety_check: no sources under ${prefixes[*]} in $build_dir/compile_commands.json" >&2
  exit 2
fi

# Through ccache when it is installed (tools/setup.sh installs it): the
# files compile to objects in $work (-c at -O0 instead of -fsyntax-only, so
# that there is an output to cache), and a file whose source, headers and
# flags are unchanged since any earlier run on this machine (any clone:
# CCACHE_BASEDIR hashes paths under this tree as relative ones) is answered
# from the cache, its warnings included; a file that fails is never cached
# and compiles again. This cut the step from ~180-290 s to seconds on CI's
# warm runs. KVF_TSA_CCACHE=0 compiles every file with -fsyntax-only.
launcher=()
mode=(-fsyntax-only)
if [[ ${KVF_TSA_CCACHE:-1} != 0 ]] && command -v ccache >/dev/null; then
  launcher=(env "CCACHE_BASEDIR=$PWD" CCACHE_NOHASHDIR=1 ccache)
  mode=(-c -O0)
fi
launcher_text=${launcher[*]:-}
mode_text=${mode[*]}

# check_one "<path>\t<flags>": writes the diagnostics to $work/logs/<path>.log
# and, when there are any, the path to $work/failed.
export clangxx work launcher_text mode_text
check_one() {
  local path=${1%%$'\t'*} flags=${1#*$'\t'}
  local log="$work/logs/$path.log" obj="$work/obj/$path.o"
  mkdir -p "$(dirname "$log")" "$(dirname "$obj")"
  local out=()
  if [[ $mode_text == "-c -O0" ]]; then out=(-o "$obj"); fi
  # The last -std wins: C++20, whatever the build passes.
  eval "$launcher_text \"\$clangxx\" $flags -std=c++20 $mode_text \"\${out[@]}\" \
    -Wthread-safety -Werror=thread-safety \
    -fno-color-diagnostics -fno-caret-diagnostics \"\$path\"" >"$log" 2>&1
  local rc=$?
  if [[ $rc -ne 0 ]] || grep -q -E '(warning|error):' "$log"; then
    echo "$path" >>"$work/failed"
  fi
}
export -f check_one
tr '\n' '\0' <"$work/sources" | xargs -0 -P "$jobs" -I{} bash -c 'check_one "$1"' _ {}

failed=0
if [[ -f $work/failed ]]; then
  sort -o "$work/failed" "$work/failed"
  failed=$(wc -l <"$work/failed")
  while read -r path; do
    log="$work/logs/$path.log"
    first=$(grep -m 1 -E '(warning|error):' "$log")
    n=$(grep -c -E '(warning|error):' "$log")
    echo "FAIL $path ($n diagnostics): ${first:-clang exited non-zero}"
  done <"$work/failed"
  if [[ $verbose -eq 1 ]]; then
    while read -r path; do
      echo "--- $path"
      cat "$work/logs/$path.log"
    done <"$work/failed"
  else
    echo "(run with --verbose for the full diagnostics)"
  fi
fi
echo "thread-safety check: $total files, $failed failed ($(($(date +%s) - start)) s, $("$clangxx" --version | head -n 1))"
[[ $failed -eq 0 ]]
