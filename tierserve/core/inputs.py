"""The input layer: every file tierserve reads goes through here (writing is `tierserve.core.outputs`).

- Bytes are decoded as UTF-8 (a UTF-8 byte-order mark is skipped); anything else, or a NUL byte, is an error
  naming the file and the byte offset of the first bad byte. Trace formats read gzip transparently (by its magic bytes).
- A file that is missing, a folder, or unreadable (permissions, I/O errors) is an error naming it.
- CSV: duplicate columns, rows with more (or fewer) cells than the header, over-long cells and lines, and more
  rows than the request limit are errors naming the row; blank lines are skipped.
- YAML: duplicate keys are refused; YAML 1.1's surprises are switched off (`1_000`, `1:30`, `0x10`, `on`/`yes`
  stay text, so a number field refuses them; `1e3` is a number); alias expansion is counted against a limit
  before anything is built, and never printed; deep nesting is an error, not a RecursionError.
- JSON: duplicate keys are refused.
Sizes are bounded by `tierserve.core.limits` (each message says how to raise its limit).
"""
from __future__ import annotations

import codecs
import csv
import gzip
import json
import os
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tierserve.core import limits
from tierserve.core.errors import ConfigError, InputError
from tierserve.core.gc_tuning import collect_less_often

_CHUNK = 1 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_BOMS = {b"\xff\xfe": "UTF-16 (little-endian)", b"\xfe\xff": "UTF-16 (big-endian)"}


class _Problem(Exception):
    """A file-level problem, turned into the caller's error type by the public functions."""

    def __init__(self, problem: str, value: object = None) -> None:
        super().__init__(problem)
        self.problem, self.value = problem, value


# ---- bytes → text lines ------------------------------------------------------------------------------------

def _not_regular(path: Path) -> str | None:
    """Why `path` cannot be read as a file (a FIFO or device would block or never end), or None."""
    import stat
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None                      # the open that follows names the problem
    if stat.S_ISREG(mode):
        return None
    return ("a FIFO (a pipe would block the run; save the data to a file)" if stat.S_ISFIFO(mode)
            else "a device or socket, not a regular file")


def _open_binary(path: Path, gzip_ok: bool) -> BinaryIO:
    if not path.exists():
        raise _Problem("file not found")
    if path.is_dir():
        raise _Problem("is a folder, not a file")
    odd = _not_regular(path)
    if odd:
        raise _Problem(f"is {odd}")
    try:
        f = open(path, "rb")
        head = f.read(2)
        f.seek(0)
    except OSError as e:
        raise _Problem(f"cannot be read ({e.strerror or e})") from None
    if head == _GZIP_MAGIC:
        if not gzip_ok:
            f.close()
            raise _Problem("gzip-compressed; this file must be plain UTF-8 text")
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    return f


def _decode_problem(e: UnicodeDecodeError, offset: int, compressed: bool) -> _Problem:
    bad = e.object[e.start:e.start + 1]
    where = "of the decompressed data " if compressed else ""
    hint = next((f" (it looks like {name}; save it as UTF-8)" for bom, name in _BOMS.items()
                 if offset == 0 and bytes(e.object[:2]) == bom), "")
    return _Problem(f"not UTF-8 text: byte 0x{bytes(bad).hex()} at byte offset {offset} {where}cannot be "
                    f"decoded{hint}", f"byte offset {offset}")


def _lines(f: BinaryIO, compressed: bool) -> Iterator[str]:
    """Decoded lines (each keeps its '\\n'), with the byte offset of a decoding error and a line-length cap."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    max_line = limits.LINE_CHARS.value
    consumed = 0           # bytes handed to the decoder so far
    buf = ""
    first = True
    while True:
        try:
            chunk = f.read(_CHUNK)
        except OSError as e:
            raise _Problem(f"cannot be read ({e.strerror or e})") from None
        except (EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise _Problem(f"corrupt gzip data ({e})") from None
        final = not chunk
        if first and chunk.startswith(codecs.BOM_UTF8):
            chunk, consumed = chunk[len(codecs.BOM_UTF8):], len(codecs.BOM_UTF8)
        first = False
        nul = chunk.find(b"\x00")          # 0x00 is never part of a longer UTF-8 sequence
        pending = len(decoder.getstate()[0])
        try:
            text = decoder.decode(chunk, final)
        except UnicodeDecodeError as e:
            if nul < 0 or consumed - pending + e.start < consumed + nul:
                raise _decode_problem(e, consumed - pending + e.start, compressed) from None
        if nul >= 0:                          # the first bad byte is a NUL
            at = consumed + nul
            where = " of the decompressed data" if compressed else ""
            raise _Problem(f"not text: a NUL byte at byte offset {at}{where} (binary or corrupt data)",
                           f"byte offset {at}")
        consumed += len(chunk)
        buf += text
        if "\n" in text or final:
            parts = buf.split("\n")
            buf = parts.pop()
            for p in parts:
                if len(p) >= max_line:
                    raise _Problem(f"a line is longer than {limits.LINE_CHARS.allowed()}")
                yield p + "\n"
        if len(buf) >= max_line:
            raise _Problem(f"a line is longer than {limits.LINE_CHARS.allowed()}")
        if final:
            if buf:
                yield buf
            return


@contextmanager
def open_lines(path: str | Path, *, error: type[InputError] = InputError, gzip_ok: bool = False
               ) -> Iterator[Iterator[str]]:
    """The decoded lines of a text file; any file-level problem is `error(file, None, "<file>", …)`."""
    p = Path(path)
    src = str(path)
    try:
        f = _open_binary(p, gzip_ok)
    except _Problem as e:
        raise error(src, None, "<file>", src if e.value is None else e.value, e.problem) from None
    compressed = isinstance(f, gzip.GzipFile)

    def guarded() -> Iterator[str]:
        try:
            yield from _lines(f, compressed)
        except _Problem as e:
            raise error(src, None, "<file>", src if e.value is None else e.value, e.problem) from None

    try:
        yield guarded()
    finally:
        f.close()


def read_text(path: str | Path, field: str, kind: str) -> str:
    """A whole (configuration) file as text: UTF-8, at most the config-bytes limit; ConfigError naming
    `field` and the file otherwise."""
    p = Path(path)
    size_limit = limits.CONFIG_BYTES.value
    try:
        if not p.exists():
            raise _Problem(f"an existing {kind} file (not found)")
        if p.is_dir():
            raise _Problem(f"a {kind} file, not a folder")
        if _not_regular(p):
            raise _Problem(f"a regular {kind} file (this is {_not_regular(p)})")
        try:
            with open(p, "rb") as f:
                data = f.read(size_limit + 1)
        except OSError as e:
            raise _Problem(f"a readable {kind} file (cannot be read: {e.strerror or e})") from None
        if len(data) > size_limit:
            raise _Problem(f"a {kind} file of {limits.CONFIG_BYTES.allowed()}")
        if data.startswith(_GZIP_MAGIC):
            raise _Problem(f"a plain-text {kind} file (this one is gzip-compressed)")
        if data.startswith(codecs.BOM_UTF8):
            data = data[len(codecs.BOM_UTF8):]
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _Problem(f"UTF-8 text ({_decode_problem(e, e.start, False).problem})") from None
    except _Problem as e:
        raise ConfigError(field, str(path), e.problem) from None


# ---- CSV ---------------------------------------------------------------------------------------------------

@dataclass(slots=True)
class CsvTable:
    """A CSV file's header and rows (lists of stripped cells, all as long as the header)."""

    source: str
    header: list[str]
    rows: list[list[str]]

    def index(self, name: str) -> int:
        return self.header.index(name)

    def has(self, name: str) -> bool:
        return name in self.header


def read_csv_table(path: str | Path, required: tuple[str, ...] = (), *, error: type[InputError] = InputError,
                   gzip_ok: bool = False, max_rows: limits.Limit | None = limits.REQUESTS,
                   allow_no_rows: bool = False) -> CsvTable:
    """Header and rows of a CSV file, checked as the module docstring says. Row numbers in errors count data
    rows from 1 (the header is row 0)."""
    src = str(path)
    cell_limit = limits.CELL_CHARS.value
    row_limit = max_rows.value if max_rows is not None else None
    strip = str.strip
    if csv.field_size_limit() <= cell_limit:                  # the csv module's own cap must not come first
        csv.field_size_limit(cell_limit + 1)
    with open_lines(path, error=error, gzip_ok=gzip_ok) as lines, collect_less_often():
        reader = csv.reader(lines)
        header: list[str] | None = None
        width = 0               # the header's cells, once read (> 1: a full row cannot be a blank line)
        rows: list[list[str]] = []
        try:
            for rec in reader:
                if len(rec) == width > 1:                      # the common case, checked as below in fewer steps
                    rec = list(map(strip, rec))
                    if max(map(len, rec)) > cell_limit:
                        raise error(src, len(rows) + 1, "<cell>", f"{max(map(len, rec))} characters",
                                    limits.CELL_CHARS.allowed())
                    if row_limit is not None and len(rows) >= row_limit:
                        raise error(src, len(rows) + 1, "<rows>", f"more than {row_limit:,} rows",
                                    max_rows.allowed())  # type: ignore[union-attr]
                    rows.append(rec)
                    continue
                if not rec or (len(rec) == 1 and rec[0] != "" and not rec[0].strip()):
                    if header is None:                         # the header is a file's first line, always
                        raise error(src, None, "<header>", f"line {reader.line_num}",
                                    "a blank line before the header (the column names must come first)")
                    continue                                   # a blank (or whitespace-only) line is not a row
                rec = [c.strip() for c in rec]
                longest = max(map(len, rec))
                where = 0 if header is None else len(rows) + 1
                if longest > cell_limit:
                    raise error(src, where, "<cell>", f"{longest} characters", limits.CELL_CHARS.allowed())
                if header is None:
                    _check_header(src, rec, error)
                    header = rec
                    width = len(rec)
                    continue
                if len(rec) != len(header):
                    more = "more" if len(rec) > len(header) else "fewer"
                    raise error(src, where, "<row>", rec, f"{len(rec)} cells, {more} than the header's "
                                                          f"{len(header)} columns {header}")
                if row_limit is not None and len(rows) >= row_limit:
                    raise error(src, where, "<rows>", f"more than {row_limit:,} rows",
                                max_rows.allowed())  # type: ignore[union-attr]
                rows.append(rec)
        except csv.Error as e:
            problem = (f"a cell is longer than {limits.CELL_CHARS.allowed()}" if "field limit" in str(e)
                       else f"not valid CSV ({e})")
            raise error(src, None if header is None else len(rows) + 1, "<csv>", f"line {reader.line_num}",
                        problem) from None
    if header is None:
        raise error(src, None, "<header>", None, "empty file (no header)")
    missing = [c for c in required if c not in header]
    if missing:
        raise error(src, 0, missing[0], None, f"missing column (header has {header})")
    if not rows and not allow_no_rows:
        raise error(src, None, "<rows>", None, "file has a header but no data rows")
    return CsvTable(src, header, rows)


def _check_header(src: str, header: list[str], error: type[InputError]) -> None:
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise error(src, 0, name or "<header>", header,
                        f"duplicate column name {name!r} (which one is meant is ambiguous)")
        seen.add(name)


# ---- YAML and JSON mappings --------------------------------------------------------------------------------

def _yaml_loader():
    """A SafeLoader with YAML 1.2 core-schema scalars and duplicate keys refused (built once)."""
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        pass

    # Drop YAML 1.1's implicit int/float/bool rules (which read 1_000, 1:30, 0x10, on/yes/no) for the
    # YAML 1.2 core schema's.
    Loader.yaml_implicit_resolvers = {
        ch: [(tag, rx) for tag, rx in rs if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                                                         "tag:yaml.org,2002:bool")]
        for ch, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                 list("tTfF"))
    Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                   r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
        list("-+0123456789."))

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            "while constructing a mapping", node.start_mark,
                            f"found duplicate key {short_key(key)}", key_node.start_mark)
                    seen[key] = True
                except TypeError:
                    pass  # an unhashable key: SafeConstructor reports it
        return yaml.SafeLoader.construct_mapping(self, node, deep)

    Loader.construct_mapping = construct_mapping  # type: ignore[method-assign]
    return Loader


def short_key(key: Any) -> str:
    from tierserve.core.errors import short_repr
    return short_repr(key, 60)


_LOADER = None


def _expanded_size(root) -> tuple[int, int]:
    """(values after alias expansion, nesting depth) of a composed YAML node graph, without expanding it:
    an aliased node's size is computed once and counted at every place it is used."""
    import yaml

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    expanded: set[int] = set()
    cap = limits.YAML_NODES.value
    while stack:
        node, done = stack.pop()
        key = id(node)
        if key in size:
            continue
        if not done and key in expanded:      # an ancestor reached again: the alias refers to itself
            raise ValueError("a recursive alias (a value that contains itself)")
        children: list[Any] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if not done:
            expanded.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in size)
            continue
        size[key] = min(1 + sum(size.get(id(c), 0) for c in children), cap + 1)
        depth[key] = 1 + max((depth.get(id(c), 0) for c in children), default=0)
    return size[id(root)], depth[id(root)]


MAX_YAML_DEPTH = 64


def parse_yaml(text: str, field: str, source: str) -> Any:
    """Parse YAML text with the rules of the module docstring; ConfigError naming `field` and `source`."""
    import yaml

    global _LOADER
    if _LOADER is None:
        _LOADER = _yaml_loader()
    loader = None
    try:
        loader = _LOADER(text)
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            n, depth = _expanded_size(node)
        except ValueError as e:
            raise ConfigError(field, source, f"YAML without {e}") from None
        if n > limits.YAML_NODES.value:
            raise ConfigError(field, source, f"YAML of {limits.YAML_NODES.allowed()} (aliases are counted "
                                             "each place they are used)")
        if depth > MAX_YAML_DEPTH:
            raise ConfigError(field, source, f"YAML nested at most {MAX_YAML_DEPTH} levels deep (found {depth})")
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ConfigError(field, source, f"valid YAML ({_yaml_problem(e)})") from None
    except RecursionError:
        raise ConfigError(field, source, f"YAML nested at most {MAX_YAML_DEPTH} levels deep") from None
    finally:
        if loader is not None:
            loader.dispose()


def _yaml_problem(e: Exception) -> str:
    """The YAML error in one line: the problem and where, never the document's content."""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    mark = getattr(e, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(problem)


def parse_json(text: str, field: str, source: str) -> Any:
    """Parse JSON text, refusing duplicate keys; ConfigError naming `field` and `source`."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise ValueError(f"duplicate key {short_key(k)}")
            out[k] = v
        return out

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except RecursionError:
        raise ConfigError(field, source, "JSON nested less deeply") from None
    except ValueError as e:
        raise ConfigError(field, source, f"valid JSON ({str(e).splitlines()[0]})") from None


def read_mapping(path: str | Path, field: str, parse: Callable[[str], Any] | str,
                 errors: tuple[type[Exception], ...] = (), kind: str = "YAML") -> dict:
    """A configuration file's top-level mapping (an empty file is an empty mapping).

    `parse` is "yaml", "json", or a function of the text (e.g. json.loads) whose `errors` mean invalid input."""
    text = read_text(path, field, kind)
    src = str(path)
    if parse == "yaml" or getattr(parse, "__module__", "").startswith("yaml"):
        data = parse_yaml(text, field, src)
    elif parse == "json" or parse is json.loads:
        data = parse_json(text, field, src)
    else:
        try:
            data = parse(text)  # type: ignore[operator]
        except errors as e:
            raise ConfigError(field, src, f"valid {kind} ({str(e).splitlines()[0] if str(e) else e})") from None
        except RecursionError:
            raise ConfigError(field, src, f"{kind} nested less deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(field, src, f"a {kind} mapping at the top level")
    return data

