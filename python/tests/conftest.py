"""Puts python/ (the package) and bench/ (the workloads) on the path, prints
the side-by-side results (side_by_side_results.RESULTS) after the run, and
writes them to $OUT/kpool_side_by_side.json when OUT is set."""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "bench")))
sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..")))


def skip_without_kpool_cuda(pytest, kpool):
    """Skips the calling test module unless libkpool.so loads and was built
    with its CUDA path."""
    try:
        version = kpool.version()
    except OSError as e:
        pytest.skip(f"libkpool.so does not load: {e}", allow_module_level=True)
    if "cuda" not in version:
        pytest.skip(f"{kpool.library_path()} has no CUDA path ({version!r})", allow_module_level=True)


def pytest_terminal_summary(terminalreporter):
    recorded = sys.modules.get("side_by_side_results")
    results = getattr(recorded, "RESULTS", None) if recorded else None
    if not results:
        return
    tr = terminalreporter
    tr.section("kpool vs reference, bit for bit")
    ok = sum(r["ok"] for r in results)
    for r in results:
        flag = "ok  " if r["ok"] else "DIFF"
        line = f"{flag} {r['test']:<15} {r['case']:<48} {r['bytes_compared']:>12} B"
        if r["bytes_differing"]:
            line += f", {r['bytes_differing']} differ"
        if r["bytes_excused"]:
            line += f", {r['bytes_excused']} excused"
        if r["note"]:
            line += f"  [{r['note']}]"
        tr.write_line(line)
    total = sum(r["bytes_compared"] for r in results)
    tr.write_line(f"{ok} of {len(results)} comparisons identical; {total} bytes compared")
    out = os.environ.get("OUT")
    if out and os.path.isdir(out):
        path = os.path.join(out, "kpool_side_by_side.json")
        with open(path, "w") as f:
            json.dump(dict(results=results), f, indent=1)
        tr.write_line(f"wrote {path}")
