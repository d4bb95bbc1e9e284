#!/usr/bin/env bash
# Refreshes docs/img/report.png, the picture of a report the README shows: a tiny real sweep of
# sweeps/laptop.yaml (30 steps a trial, no MLflow, in a private local Ray), then its report.html
# in headless Chromium. Not run by the tests (CI has no Chromium); run it from anywhere after
# `pip install -e .`, when the report's look changes. PLATFORM overrides the command to run.
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=$(mktemp -d)
trap 'rm -rf "$runs"' EXIT
${PLATFORM:-platform} sweep sweeps/laptop.yaml --set train.steps=30 --no-tracking --local \
    --runs-dir "$runs" || [ $? -eq 1 ]   # 1: some trials failed; the report still shows them
report=$(ls -d "$runs"/laptop-*/report.html)
chromium --headless --no-sandbox --hide-scrollbars --window-size=1200,1500 \
    --screenshot="$PWD/docs/img/report.png" "file://$report"
size=$(stat -c %s docs/img/report.png)
echo "docs/img/report.png: $size bytes"
[ "$size" -lt 300000 ] || { echo "over 300 KB: keep the README light, shrink the window"; exit 1; }
