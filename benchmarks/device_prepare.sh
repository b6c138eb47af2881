#!/usr/bin/env bash
# Prepare what benchmarks/device_check.sh needs on a lent GPU machine, which reaches no package index:
# wheels for its Python 3.12 (fedgat itself and the dependencies its image lacks) in .whl/, and the
# Planetoid data in .devdata/. Both folders are git-ignored through .git/info/exclude.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
grep -qx '/.devdata/' .git/info/exclude 2>/dev/null || echo '/.devdata/' >>.git/info/exclude
rm -rf .whl .devdata
mkdir -p .whl .devdata
platforms=()
for p in manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${p}_x86_64")
done
# the device image has torch, torch-geometric, numpy, scipy, tqdm, matplotlib, absl-py, attrs, wrapt, mpmath
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform any -d .whl \
    tenseal==0.3.18 zstandard cryptography cffi pycparser pycryptodome dp-accounting dm-tree semantic-version
python3 -m pip wheel -q --no-deps -w .whl .
cp -r "${FEDGAT_DATA:-../shared/data/planetoid}" .devdata/planetoid
du -sh .whl .devdata
