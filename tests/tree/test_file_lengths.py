"""No source file of the algorithms, the schedules or the runtime passes 500
lines: a file that grows past it holds more than one thing to read at once
(split it by op family, as schedules/cuda/ is)."""
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIMIT = 500
FOLDERS = ("generators", "schedules", "runtime")
SOURCES = (".cpp", ".h", ".hpp", ".inc", ".py")


def test_no_long_source_files():
    long = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in SOURCES and path.is_file():
                lines = path.read_text().count("\n")
                if lines > LIMIT:
                    long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not long, f"over {LIMIT} lines: " + "; ".join(long)
