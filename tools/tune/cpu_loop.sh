#!/usr/bin/env bash
# The tuner's whole loop for real on the CPU family, as CI runs it (ctest
# tune.cpu_loop): plan a small space (two units, two candidates each, the
# autoscheduled twins), run it with real CPU timings (after a run with
# failing fake candidates among the real ones), apply the winners to a
# copy of schedules/, rebuild the library against that copy, and check the
# rebuilt library bit for bit (the Python package's tests: golden dumps of
# the reference and the scalar model).
#
#   bash tools/tune/cpu_loop.sh WORKDIR [PYTHON]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$1
python=${2:-python3}
jobs=$(nproc 2>/dev/null || echo 2)
rm -rf "$work"
mkdir -p "$work"
cp -r "$root/schedules" "$work/schedules"
tune() { "$python" "$root/tools/tune/kpool_tune.py" "$@"; }

tune plan cpu "$work/bundle" --units fwht seed --max 2 --jobs "$jobs" --knobs-dir "$work/schedules"
# Isolation among the real candidates: a segfaulting, a hanging and a raising
# fake candidate are recorded and every real one is still measured.
KPOOL_TUNE_BUNDLE="$work/bundle" "$python" -m pytest -q -p no:cacheprovider "$root/tools/tune/test_kpool_tune.py" \
    -k real_bundle
tune run "$work/bundle" --quick --budget 120 --out "$work/results.json"
tune apply "$work/results.json" --knobs-dir "$work/schedules"
echo "--- the tuned cpu.knobs against the committed one:"
diff "$root/schedules/cpu.knobs" "$work/schedules/cpu.knobs" || true

cmake -S "$root" -B "$work/rebuilt" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKPOOL_CUDA=OFF -DKPOOL_BUILD_TESTS=OFF \
    -DKPOOL_KNOBS_DIR="$work/schedules" >"$work/rebuilt.log"
cmake --build "$work/rebuilt" --target kpool_shared -- -j"$jobs" >>"$work/rebuilt.log"
KPOOL_LIBRARY="$work/rebuilt/libkpool.so" "$python" -m pytest -q -p no:cacheprovider "$root/python/tests/test_cpu.py"
