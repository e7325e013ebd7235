"""The docs name code that exists (issue 22): every `path.py` a page names is a file of the repository, every
`path.py:Name` and every "(`name`, … in `path.py`)" names something that file defines. A module moved or
split without its docs following (check_policy left driver.py for policy_check.py) fails here."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(ROOT.glob("docs/*.md")) + [ROOT / "README.md"]
# Files a page tells the reader to create (the policy guide's worked example), not files of the repository.
TO_BE_WRITTEN = {"tierserve/policies/local/tier_short_first.py"}
PATH = re.compile(r"`([\w./-]+\.py)(?::(\w+))?`")
NAMED_IN = re.compile(r"\(((?:`\w+`,? )+)in `([\w./-]+\.py)`")


def _files(path: str) -> list[Path]:
    """The repository files a page's path means: as written, under tierserve/, or (a bare or partial path, as
    engine.md writes `driver.py`) every file under tierserve/ ending so."""
    for base in (ROOT, ROOT / "tierserve"):
        if (base / path).is_file():
            return [base / path]
    return [p for p in (ROOT / "tierserve").rglob(Path(path).name) if p.as_posix().endswith("/" + path)]


def _defines(files: list[Path], name: str) -> bool:
    pattern = re.compile(rf"^\s*(?:async def|def|class)\s+{name}\b|^\s*{name}\s*(?::[^=\n]*)?=", re.M)
    return any(pattern.search(f.read_text(encoding="utf-8")) for f in files)


def _references(page: Path) -> list[tuple[int, str, str | None]]:
    text = page.read_text(encoding="utf-8")
    found = [(text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)) for m in PATH.finditer(text)]
    for m in NAMED_IN.finditer(text):
        found += [(text.count("\n", 0, m.start()) + 1, m.group(2), n) for n in re.findall(r"`(\w+)`", m.group(1))]
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_named_file_and_definition_exists(page: Path) -> None:
    stale = []
    for line, path, name in _references(page):
        if path in TO_BE_WRITTEN:
            continue
        files = _files(path)
        if not files:
            stale.append(f"{page.name}:{line}: `{path}` is no file of the repository")
        elif name and not _defines(files, name):
            stale.append(f"{page.name}:{line}: `{name}` is not defined in `{path}`")
    assert not stale, "; ".join(stale)
