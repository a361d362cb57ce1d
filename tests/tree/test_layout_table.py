"""README's layout table names only what the tree holds.

Each row's folders (first column) exist, and every file or folder its
description names in backticks exists: a name with a slash relative to the
row's folder or to the repository root, a bare file name somewhere under the
row's folder (globs allowed, `kpool_numerics.*`).
"""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
FILE_SUFFIXES = (".cpp", ".h", ".hpp", ".c", ".inc", ".py", ".cmake", ".sh", ".txt", ".knobs", ".budgets", ".map",
                 ".json", ".md", ".toml", ".*")


def layout_rows():
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("path", "---"):
            continue
        rows.append((re.findall(r"`([^`]+)`", cells[0]), re.findall(r"`([^`]+)`", cells[1])))
    return rows


def exists(pattern, bases):
    return any(list(base.glob(pattern.rstrip("/"))) for base in bases)


def is_path(name):
    if not re.fullmatch(r"[\w.*-]+(/[\w.*-]+)*/?", name):
        return False
    return "/" in name or name.endswith(FILE_SUFFIXES)


def test_layout_table_has_rows():
    assert len(layout_rows()) >= 10


def test_layout_paths_exist():
    missing = []
    for folders, named in layout_rows():
        bases = [ROOT / f.rstrip("/") for f in folders if exists(f, [ROOT])]
        missing += [f for f in folders if not exists(f, [ROOT])]
        for name in filter(is_path, named):
            if "/" in name.rstrip("/"):
                found = exists(name, bases + [ROOT])
            else:
                found = exists(name, bases + [ROOT]) or any(exists("**/" + name, [b]) for b in bases if b.is_dir())
            if not found:
                missing.append(f"{name} (row {', '.join(folders)})")
    assert not missing, "README's layout table names paths the tree does not hold: " + "; ".join(missing)
