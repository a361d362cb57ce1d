#!/usr/bin/env python3
"""Schedule autotuning for one kpool family (cpu, sm80, sm90), across the
two machines kpool is built and measured on.

  plan   (build machine: Halide, no GPU) reads schedules/<family>.knobs,
         enumerates each tuning unit's legal knob values (pruned by the
         file's `require` lines, sampled down to --max per unit; with
         --every-value also each legal value of each knob once), adds a
         Halide-autoscheduled candidate per unit, and builds them all into
         one tuning library next to the hand-scheduled variants (a build of
         this project with KPOOL_TUNE_CANDIDATES): BUNDLE/libkpool.so and
         BUNDLE/candidates.json. Candidates that fail to build are listed
         there with the compiler's reason.
  run    (the family's machine: the GPU machine for a GPU family; no Halide)
         checks every candidate byte for byte against the hand variants on
         the same inputs (and, in the exact arithmetic, against the CPU
         kernels), times the valid ones (CUDA: graph replay; CPU: wall
         clock), one progress line each, within --budget seconds, and on
         CUDA the Triton reference on the same cases; the
         results file is rewritten after every candidate, so a run cut off
         keeps what it measured.
  apply  writes each unit's winner (the valid candidate with the lowest
         geometric-mean time over the unit's cases, if it beats the hand
         values by more than --min-gain) into schedules/<family>.knobs and prints the table
         (reference, hand, tuned, autoscheduled per case).

A tuning unit is the knobs of one op (the name's prefix: fwht, compress,
decode, seed, expand); the knobs a knobs file lists `exact_only` form a unit of
their own, timed in the exact arithmetic, the others in the reference's (the CUDA default). The
CPU family has the exact arithmetic only. numpy is all `plan` and `apply`
need; `run` needs torch on CUDA.

The steps are modules of their own: tune_plan.py, tune_run.py (with
tune_workloads.py, the cases and their timing) and tune_apply.py, over
tune_common.py (the units); this file is the command line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from tune_apply import DOCS, apply, keep, table, winners  # noqa: F401 (the tests' names)
from tune_common import REPO, arithmetic_of, unit_of, units  # noqa: F401
from tune_plan import cmake_line, enumerate_unit, every_value, plan  # noqa: F401
from tune_run import Session, check, open_session, run  # noqa: F401


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    pl = sub.add_parser("plan", help="build the candidates into a bundle (build machine)")
    pl.add_argument("family")
    pl.add_argument("bundle")
    pl.add_argument("--units", nargs="*", help="tuning units (default: every one of the family)")
    pl.add_argument("--max", type=int, default=16, help="candidates per unit at most (sampled)")
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--no-autoscheduler", action="store_true")
    pl.add_argument("--every-value", action="store_true",
                    help="also each legal value of each knob once (with --max 0: only those), so that the "
                         "pre-flight runs every value the knobs file calls legal")
    pl.add_argument("--autoschedule-timeout", type=float, default=240, help="seconds per autoscheduled kernel")
    pl.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    pl.add_argument("--cmake", default=shutil.which("cmake") or "cmake")
    pl.add_argument("--cmake-arg", action="append", default=[], help="passed to cmake's configure")
    rn = sub.add_parser("run", help="check and time every candidate (the family's machine)")
    ck = sub.add_parser("check", help="the pre-flight alone: every candidate once on small inputs, bytes "
                                      "against the hand variants (exit status 1 if any fails)")
    for q in (rn, ck):
        q.add_argument("bundle")
        q.add_argument("--budget", type=float, default=480, help="seconds; results so far are kept")
        q.add_argument("--units", nargs="*")
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--candidate-timeout", type=float, default=300,
                       help="seconds a candidate (or a unit's baseline) may take before its process is killed")
    rn.add_argument("--out", default="tune_results.json")
    rn.add_argument("--quick", action="store_true", help="the first two cases of each unit only")
    rn.add_argument("--no-preflight", action="store_true", help="skip the pre-flight check on small inputs")
    ap = sub.add_parser("apply", help="write the winners into the family's .knobs")
    ap.add_argument("results")
    ap.add_argument("--min-gain", type=float, default=0.02, help="how much faster a winner must be (0.02: 2 %%)")
    ap.add_argument("--no-knobs", action="store_true", help="print (and keep) the table, leave the .knobs as it is")
    ap.add_argument("--keep", action="store_true",
                    help="also write the results to docs/measured/tune_<family>.json and the table into docs/tuning.md")
    ap.add_argument("--docs-dir", default=DOCS)
    for q in (pl, ap):
        q.add_argument("--knobs-dir", default=os.path.join(REPO, "schedules"))
    a = p.parse_args(argv)
    return {"plan": plan, "run": run, "check": check, "apply": apply}[a.command](a)


if __name__ == "__main__":
    sys.exit(main())
