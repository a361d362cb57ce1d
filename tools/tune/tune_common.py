"""What the tuner's steps share: the repository, the ops, the knobs files' one reader
(schedules/knobs.py) and the tuning units a family's knobs form."""

from __future__ import annotations

import math
import os
import sys


REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
OPS = ("fwht", "compress", "decode", "seed", "expand")
# Halide's autoschedulers per device, in the order a twin tries them:
# Anderson2021 is the GPU one that searches; Li2018 (a greedy one, GPU
# schedules too) takes what Anderson2021 cannot schedule (decode's in-place
# update, whose token loop it puts between GPU block loops) or not within
# --autoschedule-timeout (decode.exact); Mullapudi2016 schedules the CPU from
# the generators' estimates.
AUTOSCHEDULERS = {"cpu": ("Mullapudi2016",), "cuda": ("Anderson2021", "Li2018")}


# --- the knobs file: schedules/knobs.py, the one reader (the build runs it too) -------------------
sys.path.insert(0, os.path.join(REPO, "schedules"))
import knobs as knobs_file  # noqa: E402


def unit_of(knobs, name):
    """The tuning unit of knob `name` of `knobs` (a knobs_file.Knobs): its op,
    and of the exact arithmetic where the knobs file lists it exact_only."""
    op = name.split(".")[0]
    if op not in OPS:
        return None  # not a kernel's knob of an op: no unit times it
    return f"{op}.exact" if name in knobs.exact_only else op


def units(knobs):
    """{unit: [knob names]} of the knobs (a knobs_file.Knobs) with more than one legal value."""
    out = {}
    for name in knobs.values:
        u = unit_of(knobs, name)
        if u and len(knobs.legal[name]) > 1:
            out.setdefault(u, []).append(name)
    return out


def device_of(family):
    return "cpu" if family == "cpu" else "cuda"


def arithmetic_of(family, unit):
    return "exact" if family == "cpu" or unit.endswith(".exact") else "triton"

def geomean_ratio(times, hand):
    names = [n for n in hand if n in times]
    if not names or len(names) < len(hand):
        return math.inf
    return math.exp(sum(math.log(times[n] / hand[n]) for n in names) / len(names))
