#!/usr/bin/env bash
# Render a chute HTML report in headless Chromium and save a PNG of it.
#   scripts/screenshot-report.sh OUTPUT_DIR [PNG]
# Needs Debian's chromium (apt-get install chromium). Runs offline: the report is one file.
set -euo pipefail
out="${1:?usage: $0 OUTPUT_DIR [PNG]}"
png="${2:-report.png}"
page="$(cd "$out" && pwd)/_chute/report.html"
[ -f "$page" ] || chute report "$out" >/dev/null
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --window-size=1200,2600 --screenshot="$png" "file://$page"
echo "$png"
