"""A results document made of sections that reproduction commands write verbatim, so it can be checked
against their output.

A section is the Markdown a command printed, between `<!-- begin NAME -->` and `<!-- end NAME -->` lines;
`write_section` replaces it (or appends it) and leaves the rest of the document alone, `read_section` gives
it back for a check that the document still matches what the command prints.
"""
from __future__ import annotations

from pathlib import Path


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- begin {name} -->", f"<!-- end {name} -->"


def read_section(path: str | Path, name: str) -> str | None:
    """The text of section `name` of the document at `path` (None when the document or section is absent)."""
    p = Path(path)
    if not p.exists():
        return None
    text = p.read_text(encoding="utf-8")
    begin, end = _markers(name)
    if begin not in text or end not in text:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n") + "\n"


def write_section(path: str | Path, name: str, markdown: str, title: str = "", field: str = "--doc") -> Path:
    """Put `markdown` in section `name` of the document at `path` (created with `title` if absent), through the
    output layer: a target that is not a regular file is refused (never read, never replaced), the document is
    replaced by a rename (an interrupted or failed write leaves the previous one whole), and a write error is
    one line naming the path."""
    from tierserve.core.inputs import read_text
    from tierserve.core.outputs import check_out_file, write_text_atomic
    p = check_out_file(path, field)
    text = read_text(p, field, "Markdown") if p.exists() else (f"# {title}\n\n" if title else "")
    begin, end = _markers(name)
    block = f"{begin}\n{markdown.strip(chr(10))}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + ("\n\n" if text.strip() else "") + block + "\n"
    return write_text_atomic(p, text)
