#!/bin/sh
# The two parts of a fuzz target's ctest step (tests/fuzz/CMakeLists.txt):
#
#   run_fuzz.sh replay FUZZER TARGET CORPUS_DIR
#       every committed input once, in name order, no mutation: the same
#       calls on every machine. libFuzzer prints "Running: FILE" before each.
#   run_fuzz.sh mutate FUZZER TARGET CORPUS_DIR SCRATCH_DIR ARTIFACTS_DIR RUNS
#       a bounded libFuzzer run from the corpus (new inputs go to SCRATCH_DIR,
#       started afresh; the committed corpus is only read).
#
# A failure ends with one line naming the target and the input: the corpus
# file for a replay, the saved artifact for a mutation run (replay it with
# `FUZZER FILE`).
set -u
mode=$1 fuzzer=$2 target=$3 corpus=$4
log=$(mktemp)
trap 'rm -f "$log" "$log.list"' EXIT

# fail WHAT INPUT STATUS: the whole log, then the one line naming the input.
fail() {
    cat "$log"
    echo "fuzz.$mode.$target: FAILED $1 ${2:-(none)} (exit $3)"
    exit 1
}
case "$mode" in
    replay)
        # Files, not the directory: libFuzzer then runs each named input and
        # says which one it runs.
        find "$corpus" -type f | LC_ALL=C sort >"$log.list"
        count=$(wc -l <"$log.list")
        # shellcheck disable=SC2046
        "$fuzzer" -timeout=60 -rss_limit_mb=4096 $(cat "$log.list") >"$log" 2>&1 || {
            status=$?
            fail "on the committed input" "$(sed -n 's/^Running: //p' "$log" | tail -n 1)" "$status"
        }
        tail -n 3 "$log"
        echo "fuzz.replay.$target: $count committed inputs passed"
        ;;
    mutate)
        scratch=$5 artifacts=$6 runs=$7
        rm -rf "$scratch" && mkdir -p "$scratch" "$artifacts"
        "$fuzzer" -runs="$runs" -seed=1 -max_len=4096 -timeout=60 -rss_limit_mb=4096 -print_final_stats=1 \
            -artifact_prefix="$artifacts/$target-" "$scratch" "$corpus" >"$log" 2>&1 || {
            status=$?
            fail "on the input (replay it: $fuzzer INPUT)" \
                "$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)" "$status"
        }
        tail -n 12 "$log"
        echo "fuzz.mutate.$target: $runs inputs passed"
        ;;
    *)
        echo "usage: run_fuzz.sh replay|mutate FUZZER TARGET CORPUS_DIR [SCRATCH ARTIFACTS RUNS]" >&2
        exit 2
        ;;
esac
