#!/usr/bin/env bash
# One call on a GPU machine that has no Halide: the GPU tests, the dump check
# and the demo on the device, the benchmark next to the Triton reference, the
# Python side-by-side test, the torch custom operators under torch.compile
# (CUDA graphs), the engine extension example (kpool/torch.hpp), the host time per call from Python, the benchmark in the
# exact arithmetic, compute-sanitizer (memcheck on the replay of the fuzz
# corpus, racecheck and memcheck on the GPU tests, synccheck on the decode
# tests), and (with
# --profile) Nsight Compute on the large cases and per SASS instruction on two
# small decode calls, and the schedule tuner when a
# tuning bundle came along. Everything is built and packed here first (the
# Triton reference is never part of the project: copy it into the ignored
# .ref/ and carry it beside the build):
#
#   mkdir -p .ref && cp ../shared/reference/kpool_triton.py ../shared/anchors/bench_triton.py .ref/
#   bash bench/pack_for_gpu.sh [--tune sm90]      # -> build-gpu/
#   # carry build-gpu and .ref:
#   KPOOL_REFERENCE_DIR=.ref bash bench/run_on_gpu.sh [--profile] [--quick]
#
# (Where a call brings back a few files only, write the logs elsewhere and
# bring back one archive: `OUT=/tmp/gpu-out KPOOL_REFERENCE_DIR=.ref bash
# bench/run_on_gpu.sh; tar czf "$OUT/gpu-out.tgz" -C /tmp/gpu-out .`)
#
# Steps run in that order (most needed first), each within
# KPOOL_GPU_DEADLINE seconds of the start (default 570: a 10-minute call);
# a step cut off says so. Logs and JSON go to $OUT (default ./gpu-out); the
# last lines printed are the benchmark's table and a summary of every step.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-gpu-out}
mkdir -p "$out"
deadline=$((SECONDS + ${KPOOL_GPU_DEADLINE:-570}))
profile=no
bench_args=()
for a in "$@"; do
    case "$a" in
        --profile) profile=yes ;;
        *) bench_args+=("$a") ;;
    esac
done
# What bench/pack_for_gpu.sh packed (the binaries, a tuning bundle).
if [ -f build-gpu/bin.tar.xz ]; then
    tar xJf build-gpu/bin.tar.xz
fi
if [ -f build-gpu/tune/candidates.json ]; then
    mkdir -p build-tune
    cp build-gpu/tune/candidates.json build-gpu/tune/kpool_ops.json build-tune/
    xz -dc build-gpu/tune/libkpool.so.xz >build-tune/libkpool.so
fi
export PYTHONPATH=python KPOOL_LIBRARY=build/libkpool.so PYTHONUNBUFFERED=1
summary=()

# step NAME LOG COMMAND...: runs COMMAND (output to $out/LOG) within the
# time left, and records "NAME: rc=N (S s)".
step() {
    local name=$1 log=$2 left=$((deadline - SECONDS)) start=$SECONDS rc
    shift 2
    if [ "$left" -le 5 ]; then
        summary+=("$name: not run (deadline)")
        return
    fi
    timeout "$left" "$@" >"$out/$log" 2>&1
    rc=$?
    [ "$rc" -eq 124 ] && name="$name (cut off at the deadline)"
    summary+=("$name: rc=$rc ($((SECONDS - start)) s)")
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
# Which image each family's kernels load (the embedded SASS, or the PTX
# JIT-compiled), and a fresh process's first call of every variant with
# each: the SASS, and an older family whose SASS does not fit this GPU (the
# driver's fallback to the PTX). (Forcing the PTX on a family the SASS fits,
# $KPOOL_CUDA_IMAGE=ptx, takes a KPOOL_MEASUREMENT_HOOKS build.)
step "kpool version: first calls, SASS vs PTX JIT" first_calls.log bash -c '
    build/tools/kpool version && CUDA_CACHE_DISABLE=1 KPOOL_CUDA_FAMILY=sm80 build/tools/kpool version'
while read -r line; do summary+=("  $line"); done < <(grep -E '^cuda:' "$out/first_calls.log")
step "gpu tests" gpu_tests.log build/tests/kpool_tests --gtest_filter='Gpu*:*/Gpu*' --gtest_brief=1
summary+=("  $(grep -E '^\[  (PASSED|FAILED)' "$out/gpu_tests.log" | tr '\n' ' ')")
while read -r line; do summary+=("  $line"); done < <(grep -E '^\[  FAILED' "$out/gpu_tests.log" | head -20)
step "kpool check --device cuda" check_cuda.log build/tools/kpool check tests/data/dump_seed0 --device cuda
summary+=("  $(grep -c '^ok' "$out/check_cuda.log") ok; $(grep -v '^ok' "$out/check_cuda.log" | head -3 | tr '\n' ' ')")
step "kpool demo --device cuda" demo.log build/tools/kpool demo --device cuda
summary+=("  $(grep -E '^(verified|FAILED|FAIL|index checks|warm-up)' "$out/demo.log" | head -4 | tr '\n' ' ')")

if [ "$profile" = yes ]; then
    step "ncu" ncu.txt ncu --clock-control none --kernel-name regex:^_kernel_ --launch-count 12 \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        python3 bench/profile_gpu.py --calls 1 fwht:rows=1048576 compress:n_pools=262144,pool=16 \
        compress:n_pools=262144,pool=4 seed:tokens=262144,pool=16 decode:requests=512,next_n=4,pool=4 \
        decode:requests=64,next_n=1,pool=16 expand:rows=4096,pool=4
    grep -E '^  _kernel|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Local Memory Spilling Req' \
        "$out/ncu.txt" | head -80
    # Small decode calls, ours and the reference's, caches warm as in a graph
    # replay: executed instructions and stall samples per SASS instruction
    # (CSV), where a call's fixed cost and a completion's chain go.
    for who in kpool reference; do
        for spec in 1x1_p4:requests=1,next_n=1,pool=4 1x4_p16:requests=1,next_n=4,pool=16; do
            case=${spec#*:} name=ncu_sass_${who}_${spec%%:*}.csv
            step "ncu per SASS instruction: $who decode $case" "$name" ncu --clock-control none --cache-control none \
                --kernel-name 'regex:^(_kernel|_kpool)' --launch-skip 2 --launch-count 1 --section SourceCounters \
                --section WarpStateStats --page source --print-source sass --csv \
                python3 bench/profile_gpu.py $([ $who = reference ] && echo --reference) --calls 3 "decode:$case"
        done
    done
fi
step "bench (default arithmetic: the reference's)" bench.log \
    python3 bench/bench_gpu.py --min-runs 50 --out "$out/kpool_bench.json" "${bench_args[@]}"
step "side by side (kpool's default arithmetic vs the reference; its API and shape rules)" side_by_side.log \
    python3 -m pytest python/tests/test_gpu_side_by_side.py python/tests/test_reference_rules.py -q -p no:cacheprovider
summary+=("  $(tail -1 "$out/side_by_side.log")")
while read -r line; do summary+=("  $line"); done < <(grep -E '^(FAILED|ERROR|DIFF)|arith_model|boundary|comparisons identical' \
    "$out/side_by_side.log" | head -20)
step "torch ops: opcheck, torch.compile fullgraph + reduce-overhead, engine module vs the reference, the eager path's streams" \
    torch_compile.log python3 -m pytest python/tests/test_torch_ops.py python/tests/test_gpu_torch_compile.py \
    python/tests/test_gpu_host_path.py -q -p no:cacheprovider
summary+=("  $(tail -1 "$out/torch_compile.log")")
while read -r line; do summary+=("  $line"); done < <(grep -E '^(FAILED|ERROR)' "$out/torch_compile.log" | head -10)
step "process state: two arithmetics on two streams (eager, captured), index-error words per device, a first call inside a capture, a child after fork" \
    process_state.log python3 -m pytest python/tests/test_process_state.py python/tests/test_gpu_process_state.py \
    -q -p no:cacheprovider
summary+=("  $(tail -1 "$out/process_state.log")")
while read -r line; do summary+=("  $line"); done < <(grep -E '^(FAILED|ERROR)' "$out/process_state.log" | head -10)
step "compute-sanitizer memcheck (index-error words replaced after a capture, replayed)" memcheck_index_words.log \
    timeout "${KPOOL_SANITIZER_S:-100}" compute-sanitizer --error-exitcode 1 --tool memcheck \
    python3 -m pytest python/tests/test_gpu_process_state.py -q -p no:cacheprovider -k index_error_words
while read -r line; do summary+=("  $line"); done < <(grep -E 'ERROR SUMMARY|passed|failed' \
    "$out/memcheck_index_words.log" | head -4)
# An engine's C++ extension with kpool's ops (include/kpool/torch.hpp,
# examples/torch_extension, packed by bench/pack_for_gpu.sh) on CUDA tensors:
# the same bytes as torch.ops.kpool, out variants, opcheck, torch.compile,
# the warm-up and a CUDA graph captured on a side stream.
if [ -f build/engine-ext/libkpool_engine_ops.so ]; then
    step "engine extension (kpool/torch.hpp) on CUDA tensors" torch_extension.log \
        env KPOOL_ENGINE_OPS=build/engine-ext/libkpool_engine_ops.so KPOOL_TEST_DEVICE=cuda \
        python3 -m pytest examples/torch_extension/test_extension.py -q -p no:cacheprovider
    summary+=("  $(tail -1 "$out/torch_extension.log")")
else
    summary+=("engine extension: not packed (no torch where bench/pack_for_gpu.sh ran)")
fi
# compute-sanitizer, each run capped at KPOOL_SANITIZER_S seconds (default
# 100; a capped run reports rc=124): memcheck on the CUDA replay of the fuzz
# corpus (hostile calls through device memory; KPOOL_FUZZ_REPLAY_LIMIT
# inputs per target, spread over its corpus, the regression inputs always),
# then racecheck and memcheck over every GPU test but the *Many* ones (70000
# rows: minutes under the tools).
sanitizer_cap=${KPOOL_SANITIZER_S:-100}
# (A command, not a shell function: step runs it under timeout.)
# Line-buffered (stdbuf): a run that aborts still leaves its log up to there.
sanitizer=(timeout "$sanitizer_cap" stdbuf -oL -eL compute-sanitizer --error-exitcode 1)
step "compute-sanitizer memcheck (GPU fuzz corpus replay)" memcheck_fuzz_replay.log \
    env KPOOL_FUZZ_REPLAY_LIMIT="${KPOOL_FUZZ_REPLAY_LIMIT:-120}" "${sanitizer[@]}" --tool memcheck \
    build/tests/kpool_tests --gtest_filter='*GpuFuzzReplay*' --gtest_brief=1
while read -r line; do summary+=("  $line"); done < <(grep -E 'SUMMARY|^\[  (PASSED|FAILED)|committed inputs replayed' \
    "$out/memcheck_fuzz_replay.log" | head -12)
for tool in racecheck memcheck; do
    step "compute-sanitizer $tool (GPU tests but *Many*)" "$tool.log" "${sanitizer[@]}" --tool "$tool" \
        build/tests/kpool_tests --gtest_filter='Gpu*:-*Many*' --gtest_brief=1
    while read -r line; do summary+=("  $line"); done < <(grep -E 'SUMMARY|^\[  (PASSED|FAILED)' "$out/$tool.log" | head -8)
done
# synccheck over the decode tests: the warp-per-token kernels' barriers sit
# under block-uniform conditions (schedules/block_barriers.h), which a
# divergent barrier would break.
step "compute-sanitizer synccheck (decode GPU tests but *Many*)" synccheck.log "${sanitizer[@]}" --tool synccheck \
    build/tests/kpool_tests --gtest_filter='*GpuDecode*:-*Many*' --gtest_brief=1
while read -r line; do summary+=("  $line"); done < <(grep -E 'SUMMARY|^\[  (PASSED|FAILED)' "$out/synccheck.log" | head -8)

step "host overhead per call (ours vs the reference's launch)" host_overhead.log \
    python3 bench/host_overhead.py --out "$out/kpool_host_overhead.json"
while read -r line; do summary+=("  $line"); done < <(grep -E '^(extension|op |launch floor|where ours goes|[a-z0-9_]+ +[0-9]|  (op|[a-z0-9_]+) +[0-9o])' "$out/host_overhead.log")
# The softmax-pool ops again in the contract's arithmetic (KPOOL_ARITHMETIC_EXACT).
step "bench --arithmetic exact" bench_exact.log \
    python3 bench/bench_gpu.py --min-runs 50 --arithmetic exact --only copy,compress,decode \
    --out "$out/kpool_bench_exact.json" "${bench_args[@]}"

# The schedule tuner on the bundle, in the time left (docs/tuning.md): its
# results are $out/tune_results.json, for `kpool_tune.py apply --keep` back home.
# First each op's autoscheduled twin timed beside ours and the reference
# (the bundle's library: its hand variants and its twins).
if [ -f build-tune/candidates.json ]; then
    step "bench: the autoscheduled twins beside ours" twins.log env KPOOL_LIBRARY=build-tune/libkpool.so \
        python3 bench/bench_gpu.py --quick --no-graph --min-runs 20 --only fwht,compress,seed,decode,expand \
        --twins build-tune --out "$out/kpool_twins.json"
    summary+=("  twins: $(grep -c ' twin ' "$out/twins.log") cases timed, $(grep ' twin ' "$out/twins.log" \
        | grep -vc ' exact$' || true) not exact or failed")
    tune_budget=$((deadline - SECONDS - 30))
    tune_args=()
    [ "$tune_budget" -lt 300 ] && tune_args=(--quick)
    # Each candidate in a worker process: one that faults or hangs (killed
    # after --candidate-timeout) is recorded and the run goes on.
    step "schedule tuner (${tune_budget} s)" tune.log python3 tools/tune/kpool_tune.py run build-tune \
        --budget "$tune_budget" --candidate-timeout 120 "${tune_args[@]}" --out "$out/tune_results.json"
    summary+=("  $(grep -c . "$out/tune.log") lines; $(tail -1 "$out/tune.log")")
    # The pre-flight runs every candidate once on small inputs before any
    # timing; a bundle packed with --every-value holds each legal value of
    # each knob, so a line here is a legal value that does not run.
    summary+=("  pre-flight failures of knob values (legal values that do not run): $(grep '^pre-flight ' \
        "$out/tune.log" | grep -Evc ' (Anderson2021|Li2018|Mullapudi2016) ' || true)")
fi

cat "$out/bench.log"
printf '%s\n' "${summary[@]}"
