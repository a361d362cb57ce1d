#!/usr/bin/env bash
# One call on a GPU machine that has no Halide: the GPU tests, the dump check
# on the device, the Python side-by-side test, the benchmark next to the
# Triton reference (in both arithmetics), and (with
# --profile) Nsight Compute on the large cases. Everything built here first:
#
#   bash scripts/kpool.sh build
#   # the reference module is never part of the project: copy it into the
#   # ignored .ref/ and carry that next to the build
#   mkdir -p .ref && cp ../shared/reference/kpool_triton.py ../shared/anchors/bench_triton.py .ref/
#   # carry build/libkpool.so build/tests/kpool_tests build/tools/kpool and .ref:
#   KPOOL_REFERENCE_DIR=.ref bash bench/run_on_gpu.sh [--profile] [--quick]
#
# Logs and JSON go to $OUT (default ./gpu-out); the last lines printed are
# the benchmark's table.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
profile=no
bench_args=()
for a in "$@"; do
    case "$a" in
        --profile) profile=yes ;;
        *) bench_args+=("$a") ;;
    esac
done
export PYTHONPATH=python KPOOL_LIBRARY=build/libkpool.so PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
build/tests/kpool_tests --gtest_filter='Gpu*' --gtest_brief=1 >"$out/gpu_tests.log" 2>&1
echo "gpu tests: rc=$? ($(grep -E '^\[  (PASSED|FAILED)' "$out/gpu_tests.log" | tr '\n' ' '))"
grep -E '^\[  FAILED' "$out/gpu_tests.log" | head -20
build/tools/kpool check tests/data/dump_seed0 --device cuda >"$out/check_cuda.log" 2>&1
echo "kpool check --device cuda: rc=$? ($(grep -c '^ok' "$out/check_cuda.log") ok)"
grep -v '^ok' "$out/check_cuda.log" | head -10

if [ "$profile" = yes ]; then
    ncu --clock-control none --kernel-name regex:^_kernel_ --launch-count 12 \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        python3 bench/profile_gpu.py --calls 1 fwht:rows=1048576 compress:n_pools=262144,pool=16 \
        compress:n_pools=262144,pool=4 seed:tokens=262144,pool=16 decode:requests=512,next_n=4,pool=4 \
        decode:requests=64,next_n=1,pool=16 expand:rows=4096,pool=4 >"$out/ncu.txt" 2>&1
    echo "ncu: rc=$?"
    grep -E '^  _kernel|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Local Memory Spilling Req' \
        "$out/ncu.txt" | head -80
fi
python3 -m pytest python/tests/test_gpu_side_by_side.py -q -p no:cacheprovider >"$out/side_by_side.log" 2>&1
echo "side by side (kpool triton arithmetic vs the reference): rc=$? ($(tail -1 "$out/side_by_side.log"))"
grep -E '^(FAILED|ERROR|DIFF)|arith_model|boundary|comparisons identical' "$out/side_by_side.log" | head -30
# The softmax-pool ops again in the reference's arithmetic (KPOOL_ARITHMETIC_TRITON).
python3 bench/bench_gpu.py --min-runs 50 --arithmetic triton --only copy,compress,decode \
    --out "$out/kpool_bench_triton.json" "${bench_args[@]}" >"$out/bench_triton.log" 2>&1
echo "bench --arithmetic triton: rc=$?"
python3 bench/bench_gpu.py --min-runs 50 --out "$out/kpool_bench.json" "${bench_args[@]}" 2>&1 | tee "$out/bench.log"
