#!/usr/bin/env bash
# Build .whl/ here, for benchmarks/device_check.sh on a lent GPU machine: the packages amdahl
# needs that the machine's image lacks (Ray 2.60 and what it imports at `import ray`: pydantic,
# jsonschema and theirs), as Python 3.12 x86-64 wheels. Ray's wheel is repacked without its Java
# jars and dashboard UI, binaries stripped (80 MB -> 40 MB), so a call's 64 MiB working tree
# holds it. Name `.whl` in the device call's carry; .git/info/exclude keeps it out of git.
#
#   bash benchmarks/device_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .git/info .whl
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$1" "${@:2}"
}
download .whl pydantic==2.12.5 pydantic-core==2.41.5 annotated-types typing-inspection \
  jsonschema jsonschema-specifications referencing rpds-py
tmp=$(mktemp -d)
download "$tmp" ray==2.60.0
(cd "$tmp" && mkdir x && cd x && python3 -m zipfile -e ../ray-*.whl . \
  && rm -rf ray/jars ray/dashboard/client/build \
  && strip --strip-unneeded ray/_raylet.so ray/core/src/ray/raylet/raylet \
    ray/core/src/ray/gcs/gcs_server \
  && python3 -m zipfile -c ../ray.zip ./*)
mv "$tmp/ray.zip" .whl/ray.zip
rm -rf "$tmp"
du -sh .whl
