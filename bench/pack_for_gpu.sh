#!/usr/bin/env bash
# Packs what one call of bench/run_on_gpu.sh needs on a GPU machine that has
# no Halide, into build-gpu/ (ignored by git; a few MB against the 64 MiB a
# call may carry):
#
#   bash bench/pack_for_gpu.sh [--tune FAMILY [plan options]]
#
# - build-gpu/bin.tar.xz: the library, the torch call extension, the test
#   binary and the CLI of a fresh `scripts/kpool.sh build`, and the engine
#   extension example built against its SDK (where .venv has torch);
# - with --tune: a tuning bundle of FAMILY (tools/tune/kpool_tune.py plan,
#   default --max 10 --every-value: each legal value of each knob is also a
#   candidate, so the tuner's pre-flight on the GPU runs every value the
#   knobs file calls legal once; 20-30 minutes on 2 cores), as build-gpu/tune/.
#
# The Triton reference is never part of the project: copy kpool_triton.py and
# bench_triton.py into the ignored .ref/ first. Then, on the GPU machine,
# carrying build-gpu and .ref:
#
#   KPOOL_REFERENCE_DIR=.ref bash bench/run_on_gpu.sh
#
# which unpacks build-gpu/ and, when it holds a tuning bundle, runs the tuner
# in the time left after the benchmark.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pack=build-gpu
tune_family=""
plan_args=()
if [ "${1:-}" = --tune ]; then
    tune_family=${2:?--tune needs a family (sm80, sm90)}
    shift 2
    plan_args=("$@")
    [ ${#plan_args[@]} -eq 0 ] && plan_args=(--max 10 --every-value)
fi
[ -f .ref/kpool_triton.py ] || echo "note: no .ref/kpool_triton.py: the GPU call will have no reference to run" >&2

bash scripts/kpool.sh build
rm -rf "$pack"
mkdir -p "$pack"
# The engine extension example (examples/torch_extension) against this
# build's SDK and the venv's torch (the GPU machine's version), where torch
# is installed.
extension=()
if .venv/bin/python -c 'import torch' 2>/dev/null; then
    .venv/bin/cmake --install build --prefix build/engine-sdk >/dev/null
    .venv/bin/cmake -S examples/torch_extension -B build/engine-ext -G Ninja -DCMAKE_MAKE_PROGRAM="$PWD/.venv/bin/ninja" \
        -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH="$PWD/build/engine-sdk;$(.venv/bin/python -c 'import torch; print(torch.utils.cmake_prefix_path)')"
    .venv/bin/cmake --build build/engine-ext
    extension=(build/engine-ext/libkpool_engine_ops.so)
else
    echo "note: no torch in .venv: the engine extension example is not packed" >&2
fi
# -h: build/libkpool.so is the symlink to the versioned library; carry the
# file, and the op table the Python package reads beside it (kpool_ops.json).
tar chJf "$pack/bin.tar.xz" build/libkpool.so build/kpool_ops.json build/_torch_calls.abi3.so build/tests/kpool_tests \
    build/tools/kpool "${extension[@]}"
if [ -n "$tune_family" ]; then
    PATH="$PWD/.venv/bin:$PATH" .venv/bin/python tools/tune/kpool_tune.py plan "$tune_family" build-tune \
        "${plan_args[@]}"
    mkdir -p "$pack/tune"
    cp build-tune/candidates.json build-tune/kpool_ops.json "$pack/tune/"
    xz -c build-tune/libkpool.so >"$pack/tune/libkpool.so.xz"
fi
du -sh "$pack"
echo "carry: $pack .ref; run: KPOOL_REFERENCE_DIR=.ref bash bench/run_on_gpu.sh"
