"""The comparisons of a GPU side-by-side run, one row each, printed by
conftest.py after the run (and written to $OUT/kpool_side_by_side.json)."""

RESULTS: list = []


def record(test: str, case: str, ok: bool, compared: int, differing: int, excused: int = 0, note: str = ""):
    RESULTS.append(dict(test=test, case=case, ok=ok, bytes_compared=compared, bytes_differing=differing,
                        bytes_excused=excused, note=note))
