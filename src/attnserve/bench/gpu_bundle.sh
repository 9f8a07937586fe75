#!/usr/bin/env bash
# Pack what attnserve.bench.gpu needs on an offline GPU machine into parts small enough to bring
# one at a time (docs/gpu.md): this checkout's committed tree and the wheels such a machine
# lacks (onnxruntime-gpu, the exporter's onnxscript and its dependencies, safetensors), for
# the machine's Python. Run it where pip reaches PyPI.
#
#   bash src/attnserve/bench/gpu_bundle.sh wheels/gpu            # Python 3.12, parts of 60 MiB
#   PYTHON_VERSION=3.11 PART_SIZE=30m bash src/attnserve/bench/gpu_bundle.sh wheels/gpu
#
# Writes OUT/bundle.tar.part-00, -01, ... and OUT/SHA256SUMS (the parts and the whole tar).
# On the GPU machine:  cat bundle.tar.part-* > bundle.tar && sha256sum -c --ignore-missing SHA256SUMS && tar -xf bundle.tar
set -euo pipefail

out=${1:?usage: gpu_bundle.sh OUT_DIR}
python_version=${PYTHON_VERSION:-3.12}
part_size=${PART_SIZE:-60m}
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
python=${PYTHON:-$repo/.venv/bin/python}
[ -x "$python" ] || python=python3

# The versions this checkout is tested with, so the GPU machine runs the same exporter and
# runtime; PACKAGES (pip requirements, space-separated) replaces the list.
pins=${PACKAGES:-$("$python" -c '
import importlib.metadata as m
print(" ".join(f"{n}=={m.version(n)}" for n in ("onnxruntime-gpu", "onnxscript", "onnx-ir", "onnx", "ml-dtypes", "safetensors")))')}

mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/wheels"
git -C "$repo" archive --format=tar.gz -o "$stage/attnserve.tar.gz" HEAD
# --no-deps: everything else they need (numpy, protobuf, packaging, sympy, flatbuffers,
# typing_extensions) comes with torch, onnx and the CPU onnxruntime the machine already has.
# shellcheck disable=SC2086
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$python_version" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$stage/wheels" $pins
tar -C "$stage" -cf "$stage/bundle.tar" attnserve.tar.gz wheels
rm -f "$out"/bundle.tar.part-*
split -b "$part_size" -d "$stage/bundle.tar" "$out/bundle.tar.part-"
(cd "$stage" && sha256sum bundle.tar) > "$out/SHA256SUMS"
(cd "$out" && sha256sum bundle.tar.part-*) >> "$out/SHA256SUMS"
echo "pinned: $pins"
ls -l "$out"
