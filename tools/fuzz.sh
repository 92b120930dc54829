#!/usr/bin/env bash
# libFuzzer targets of kvfabric's parsers of untrusted bytes (tests/fuzz/*_fuzz.cc), built with
# Debian's clang 14 (-fsanitize=fuzzer,address,undefined) straight from the sources they need
# (nothing else is built), each run for a bounded time from its committed seed corpus
# (tests/fuzz/corpus/<target>/; new inputs go to a scratch copy, not the repository).
#
# Usage: tools/fuzz.sh [--seconds N] [--out DIR] [TARGET...]
#   --seconds  run time per target (default 20)
#   --out      build and scratch directory (default build/fuzz)
#   TARGET     tcp_wire, transfer_wire, block_header, calibration, yaml_config,
#              block_key_golden (default: all)
# Environment: CLANGXX (default clang++).
# Exit status 0 when every target ran its time without a crash; 1 when one crashed (the
# reproducer is left under --out and named in the output: add it to the corpus and a
# regression test); 2 on set-up errors.
set -uo pipefail
cd "$(dirname "$0")/.."

seconds=20
out=build/fuzz
targets=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --seconds) seconds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz: unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[[ ${#targets[@]} -eq 0 ]] && targets=(tcp_wire transfer_wire block_header calibration yaml_config
                                      block_key_golden)
cxx=${CLANGXX:-clang++}
command -v "$cxx" >/dev/null || { echo "fuzz: $cxx not found (tools/setup.sh installs clang)" >&2; exit 2; }

# The sources each target links, beside its own file.
sources_of() {
  case $1 in
    tcp_wire) echo transport/tcp/tcp_wire.cc core/crc32c.cc core/status.cc ;;
    transfer_wire) echo proto/transfer_wire.cc core/status.cc ;;
    block_header) echo core/block_format.cc core/crc32c.cc core/status.cc core/model_fingerprint.cc core/sha256.cc ;;
    calibration) echo core/bus_calibration.cc core/bus_cost_model.cc core/units.cc core/status.cc core/env.cc core/posix_env.cc core/errno_status.cc ;;
    yaml_config) echo core/config/yaml_config.cc core/config/unit_flags.cc core/units.cc core/status.cc ;;
    block_key_golden) echo core/testing/block_key_golden.cc core/model_fingerprint.cc core/sha256.cc core/status.cc ;;
    *) return 1 ;;
  esac
}

# Libraries beyond the C++ runtime.
libs_of() {
  case $1 in
    block_header) echo -lcrypto ;;
    yaml_config) echo -lyaml-cpp ;;
    block_key_golden) echo -lcrypto ;;
  esac
}

mkdir -p "$out"
failed=0
for t in "${targets[@]}"; do
  srcs=$(sources_of "$t") || { echo "fuzz: unknown target $t" >&2; exit 2; }
  bin=$out/${t}_fuzz
  if ! "$cxx" -std=c++20 -O1 -g -I. -msse4.2 -fsanitize=fuzzer,address,undefined \
      -fno-sanitize-recover=undefined tests/fuzz/${t}_fuzz.cc $srcs -o "$bin" $(libs_of "$t") \
      2>"$out/$t.build.log"; then
    echo "fuzz: $t: build failed:" >&2
    head -20 "$out/$t.build.log" >&2
    exit 2
  fi
  corpus=$out/${t}_corpus
  rm -rf "$corpus" && mkdir -p "$corpus"
  cp tests/fuzz/corpus/$t/* "$corpus"/ 2>/dev/null || true
  start=$(date +%s)
  if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=1024 -artifact_prefix="$out/$t-" \
      "$corpus" >"$out/$t.log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$out/$t.log" | grep -o '[0-9]*$')
    [[ -z $runs ]] && runs=$(grep -Eo '#[0-9]+' "$out/$t.log" | tail -1 | tr -d '#')
    echo "fuzz: $t: ok, ${runs:-?} inputs in $(( $(date +%s) - start )) s, corpus $(ls "$corpus" | wc -l) files"
  else
    failed=1
    echo "fuzz: $t: FAILED (log $out/$t.log):"
    grep -E 'ERROR|SUMMARY|artifact|Test unit written' "$out/$t.log" | head -10
  fi
done
exit $failed
