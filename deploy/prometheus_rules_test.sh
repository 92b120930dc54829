#!/usr/bin/env bash
# Checks deploy/prometheus/ with promtool (Debian's prometheus package):
# the recording and alert rules parse, the alert unit tests pass
# (kvfabric-alerts_test.yml), and the example scrape config is valid once its
# rule paths point at this tree's files.
set -euo pipefail
dir="$(cd "$(dirname "$0")" && pwd)/prometheus"
if ! command -v promtool >/dev/null; then
  echo "SKIP: promtool not found: apt-get install prometheus (tools/setup.sh does)"
  exit 0
fi
promtool check rules "$dir/kvfabric-rules.yml" "$dir/kvfabric-alerts.yml"
(cd "$dir" && promtool test rules kvfabric-alerts_test.yml)
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cp "$dir/kvfabric-rules.yml" "$dir/kvfabric-alerts.yml" "$tmp/"
sed "s|/etc/prometheus/|$tmp/|" "$dir/prometheus.yml" > "$tmp/prometheus.yml"
promtool check config "$tmp/prometheus.yml"
echo "deploy/prometheus: rules, alert tests and scrape config pass"
