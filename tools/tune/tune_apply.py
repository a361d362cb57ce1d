"""kpool_tune.py apply: each unit's winner written into the family's knobs,
the results table printed (and kept in docs/)."""

from __future__ import annotations

import json
import math
import os

from tune_common import REPO, geomean_ratio, knobs_file
from tune_plan import knob_string
from tune_run import summary, what


def winners(results, min_gain=0.02):
    """{unit: (best candidate or None, autoscheduled candidate or None)}: a
    candidate replaces the hand values only if it is faster by more than
    min_gain (timing noise), on every case of the unit measured."""
    out = {}
    for unit, e in results["units"].items():
        tuned = [c for c in e["candidates"] if c["valid"] and not c.get("autoscheduler")]
        best = min(tuned, key=lambda c: geomean_ratio(c["times"], e["hand"]["times"]), default=None)
        if best is not None and geomean_ratio(best["times"], e["hand"]["times"]) > 1.0 - min_gain:
            best = None  # the hand values stay
        auto = next((c for c in e["candidates"] if c.get("autoscheduler")), None)
        out[unit] = (best, auto)
    return out


def first_line(error):
    """An error's first line (CUDA's errors go on with advice)."""
    return (error.strip().splitlines() or [""])[0]


def table(results, min_gain=0.02):
    lines = ["| unit | case | reference µs | hand µs | tuned µs | tuned knobs | autoscheduled µs |",
             "| --- | --- | ---: | ---: | ---: | --- | ---: |"]
    not_built = results.get("failed_to_build", [])
    failed = [c for c in not_built if c.get("autoscheduler")]
    for unit, (best, auto) in winners(results, min_gain).items():
        e = results["units"][unit]
        reference = e.get("reference", {}).get("times", {})
        for name, hand_us in e["hand"]["times"].items():
            tuned_us = best["times"][name] if best else hand_us
            knobs = knob_string(best["changed"]) if best else "(hand)"
            if auto and auto["valid"]:
                auto_s = f"{auto['times'][name]:.1f} ({auto['autoscheduler']})"
            elif auto:
                auto_s = "wrong bytes" if "differ" in auto.get("error", "") else "failed"
            else:
                auto_s = "not built" if any(c["unit"] == unit for c in failed) else "-"
            ref_s = f"{reference[name]:.1f}" if name in reference else "-"
            lines.append(f"| {unit} ({e['arithmetic']}) | {name} | {ref_s} | {hand_us:.1f} | {tuned_us:.1f} | {knobs} "
                         f"| {auto_s} |")
    lines.append("")
    for unit, e in results["units"].items():
        if e.get("reference", {}).get("error"):
            lines.append(f"{unit}: the reference was not timed: {first_line(e['reference']['error'])}")
    for c in failed:
        lines.append(f"{c['unit']}: {c['autoscheduler']} could not schedule it: {first_line(c['error'])}")
    for c in not_built:
        if not c.get("autoscheduler"):
            lines.append(f"{c['unit']}: {knob_string(c['changed'])} did not build: {first_line(c['error'])}")
    for unit, e in results["units"].items():
        for c in e["candidates"]:
            if not c["valid"]:
                what = c.get("autoscheduler") or knob_string(c["changed"])
                lines.append(f"{unit}: {what} failed: {first_line(c['error'])}")
    return "\n".join(lines)


DOCS = os.path.join(REPO, "docs")


def keep(results, table_text, docs_dir):
    """The run's results as docs/measured/tune_<family>.json, and its table
    in docs/tuning.md between the family's markers (added at the end the
    first time)."""
    family = results["family"]
    os.makedirs(os.path.join(docs_dir, "measured"), exist_ok=True)
    measured = os.path.join(docs_dir, "measured", f"tune_{family}.json")
    with open(measured, "w") as f:
        json.dump(results, f, indent=1)
    begin, end = f"<!-- tune table {family}: kpool_tune.py apply --keep -->", f"<!-- end tune table {family} -->"
    s = results.get("summary") or summary(results)
    section = (f"{begin}\n### {family}, measured on {results.get('device') or 'an unnamed device'}\n\n"
               f"{s['measured']} candidates measured, {s['failed']} failed, {s['not_reached']} not reached, "
               f"{s['not_built']} not built (`docs/measured/tune_{family}.json`).\n\n{table_text}\n{end}")
    path = os.path.join(docs_dir, "tuning.md")
    with open(path) as f:
        doc = f.read()
    if begin in doc and end in doc:
        doc = doc[:doc.index(begin)] + section + doc[doc.index(end) + len(end):]
    else:
        doc = doc.rstrip("\n") + "\n\n" + section + "\n"
    with open(path, "w") as f:
        f.write(doc)
    print(f"kept: {measured} and the table in {path}")


def apply(a):
    with open(a.results) as f:
        results = json.load(f)
    path = os.path.join(a.knobs_dir, f"{results['family']}.knobs")
    new = {}
    for unit, (best, _) in winners(results, a.min_gain).items():
        if best:
            new.update(best["changed"])
            ratio = geomean_ratio(best["times"], results["units"][unit]["hand"]["times"])
            print(f"{unit}: {knob_string(best['changed'])} ({ratio:.3f}x the hand values' time)")
        else:
            print(f"{unit}: the hand values stay")
    if new and not a.no_knobs:
        knobs_file.write_values(path, new)
        print(f"wrote {len(new)} values into {path}")
    text = table(results, a.min_gain)
    print(text)
    if a.keep:
        keep(results, text, a.docs_dir)
