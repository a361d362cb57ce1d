#!/usr/bin/env bash
# A fuzz campaign over every target, one libFuzzer process at a time on one
# core (nice'd): SEEDS seeds x RUNS inputs per target, each seed from a fresh
# scratch corpus with the committed corpus as a second, read-only directory.
#
#   tests/fuzz/campaign.sh BUILD_DIR OUT_DIR [SEEDS=10] [RUNS=100000] [SECONDS_PER_SEED=0: no limit]
#
# KPOOL_FUZZ_TARGETS picks targets, KPOOL_FUZZ_FIRST_SEED the first seed
# (seeds FIRST..FIRST+SEEDS-1, to go on with a campaign). A seed's time
# includes loading the corpus (a minute for compress on a busy machine).
#
# Writes OUT_DIR/<target>/seed<N>.log and a table, OUT_DIR/summary.tsv:
# target, seed, executions, cov/ft at the start (after the corpus) and at
# the end, new corpus entries, the finding (crash-/timeout-/leak- artifact)
# or "-". New inputs stay in OUT_DIR/<target>/new; keep what adds coverage
# with `FUZZER -merge=1 tests/fuzz/corpus/<target> OUT_DIR/<target>/new`.
set -u
build=$1 out=$2 seeds=${3:-10} runs=${4:-100000} per_seed=${5:-0}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# (Default: every target the build has, tests/CMakeLists.txt's KPOOL_FUZZ_TARGETS.)
targets=${KPOOL_FUZZ_TARGETS:-$(find "$build/tests/fuzz" -maxdepth 1 -type f -name 'kpool_fuzz_*' -printf '%f\n' |
    sed 's/^kpool_fuzz_//' | LC_ALL=C sort)}
mkdir -p "$out"
summary="$out/summary.tsv"
[ -f "$summary" ] || printf 'target\tseed\texecs\tcov_start\tft_start\tcov_end\tft_end\tnew_entries\tseconds\tfinding\n' >"$summary"
for target in $targets; do
    fuzzer="$build/tests/fuzz/kpool_fuzz_$target"
    dir="$out/$target"
    mkdir -p "$dir/new" "$dir/artifacts"
    first=${KPOOL_FUZZ_FIRST_SEED:-1}
    for seed in $(seq "$first" $((first + seeds - 1))); do
        scratch=$(mktemp -d)
        log="$dir/seed$seed.log"
        start=$(date +%s)
        # One core: no -jobs / -fork; ASan's and UBSan's reports abort.
        ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
            taskset -c 0 nice -n 10 "$fuzzer" -seed="$seed" -runs="$runs" -max_total_time="$per_seed" \
            -max_len=4096 -timeout=60 -rss_limit_mb=4096 -print_final_stats=1 \
            -artifact_prefix="$dir/artifacts/seed$seed-" "$scratch" "$root/tests/fuzz/corpus/$target" >"$log" 2>&1
        status=$?
        seconds=$(($(date +%s) - start))
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
        start_line=$(grep -m1 -E 'INITED' "$log")
        end_line=$(grep -E '#[0-9]+' "$log" | grep -E 'cov: ' | tail -n 1)
        field() { echo "$1" | sed -n "s/.* $2: \([0-9]*\).*/\1/p"; }
        new=$(find "$scratch" -type f | wc -l)
        cp -n "$scratch"/* "$dir/new/" 2>/dev/null
        rm -rf "$scratch"
        finding=-
        if [ "$status" -ne 0 ]; then
            finding=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
            finding=${finding:-exit$status}
        fi
        printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$target" "$seed" "${execs:-?}" \
            "$(field "$start_line" cov)" "$(field "$start_line" ft)" "$(field "$end_line" cov)" \
            "$(field "$end_line" ft)" "$new" "$seconds" "$finding" >>"$summary"
    done
done
echo "campaign done: $summary"
