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


def write_section(path: str | Path, name: str, markdown: str, title: str = "") -> Path:
    """Put `markdown` in section `name` of the document at `path` (created with `title` if absent)."""
    p = Path(path)
    text = p.read_text(encoding="utf-8") if p.exists() else (f"# {title}\n\n" if title else "")
    begin, end = _markers(name)
    block = f"{begin}\n{markdown.strip(chr(10))}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + ("\n\n" if text.strip() else "") + block + "\n"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p
