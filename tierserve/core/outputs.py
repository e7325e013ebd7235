"""The output layer: every file tierserve writes goes through here (`output_folder` for a run's folder,
`atomic_path` / `write_text_atomic` for one file). It owns staging, publishing with a manifest, the folder
lock, refusing non-regular targets and the one-line write errors; it reads no input formats (that is
`tierserve.core.inputs`; `tierserve.core.files` re-exports both so older imports keep working).
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tierserve.core.errors import ConfigError, OutputError
from tierserve.core.inputs import _CHUNK, parse_json, read_text

# ---- outputs -----------------------------------------------------------------------------------------------
#
# Every result goes through `output_folder` (a run's folder) or `atomic_path` (one file):
# - a target that exists and is not a regular file (a device node, a FIFO, a socket) is refused, never replaced;
# - a folder run takes a lock (`.tierserve.lock`, flock) and a second run on the same folder is refused, naming
#   the holder's pid;
# - the run writes into a private staging folder inside it (`.tierserve-stage-*`); when the run ends, the files
#   a previous run listed in `manifest.json` are removed, the staged files are renamed in, and `manifest.json`
#   (every file with its size and SHA-256) is written last: a rerun replaces the previous result whole, and a
#   folder without a manifest is not a finished result;
# - an interrupt or error removes only the staging folder (never a file the run did not make); a staging folder
#   a killed run left behind is removed by the next run on that folder (it holds the lock, so the owner is gone);
# - disk-full, quota, read-only and name-too-long errors are one `OutputError` line naming the path.

PARTIAL_SUFFIX = ".partial"
MANIFEST_JSON = "manifest.json"
LOCK_FILE = ".tierserve.lock"
STAGE_PREFIX = ".tierserve-stage-"
_WRITE_ERRNOS = {"ENOSPC": "no space left on the device", "EDQUOT": "the disk quota is exceeded",
                 "EFBIG": "the file is larger than the file system allows", "EROFS": "the file system is read-only",
                 "EACCES": "permission denied", "EPERM": "operation not permitted", "EIO": "an I/O error",
                 "ENAMETOOLONG": "a file name is too long for the file system",
                 "EMLINK": "too many links", "EXDEV": "staging and target are on different file systems"}
_stages: dict[str, Path] = {}     # staging folder -> the folder it publishes to (for messages)


def output_error(e: OSError, path: str | Path) -> OutputError | OSError:
    """The one-line error for a write that failed with `e` (the error itself when it is not a write problem)."""
    import errno
    name = errno.errorcode.get(e.errno or 0, "")
    if name not in _WRITE_ERRNOS:
        return e
    # our own temporary names (`.tierserve-….partial`) mean nothing to the user: the target is named instead
    ours = e.filename and os.path.basename(str(e.filename)).startswith(".tierserve-")
    where = shown(e.filename) if e.filename and not ours else shown(path)
    return OutputError(where, f"cannot write: {_WRITE_ERRNOS[name]} ({name})")


def shown(path: str | Path) -> str:
    """`path` as the user should read it: inside a staging folder, the place it is published to."""
    text = str(path)
    for stage, final in _stages.items():
        if text == stage or text.startswith(stage + os.sep):
            return str(final) + text[len(stage):]
    return text


def is_stage(path: str | Path) -> bool:
    """Whether `path` is the staging folder of a run in progress in this process."""
    return str(path) in _stages


def _refuse_non_regular(path: Path, field: str) -> None:
    import stat
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise ConfigError(field, str(path), f"a path that can be checked ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        what = ("a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a device node" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise ConfigError(field, str(path), f"a regular file or a new name (this is {what}; it is never replaced)")


def _check_name_length(p: Path, field: str) -> None:
    folder = p.parent if str(p.parent) else Path(".")
    try:
        longest = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        longest = 255
    if len(os.fsencode(p.name)) > longest:
        raise ConfigError(field, str(p), f"a file name of at most {longest} bytes (the file system's limit; this "
                                         f"one has {len(os.fsencode(p.name))})")


def check_out_dir(path: str | Path, field: str = "--out") -> Path:
    """Make sure `path` is (or can be made) a folder we can write into, before any work starts."""
    p = Path(path)
    try:
        if p.exists() and not p.is_dir():
            raise ConfigError(field, str(path), "a folder (this is an existing file)")
        p.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".tierserve-write-test-", dir=p)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(field, str(path), f"a folder that can be written ({e.strerror or e})") from None
    return p


def check_out_file(path: str | Path, field: str = "--out") -> Path:
    """Make sure a single output file can be written at `path`: not a folder, device node or FIFO; its name
    within the file system's limit; its folder exists (or is made) and is writable."""
    p = Path(path)
    check_out_dir(p.parent if str(p.parent) else ".", field)
    _check_name_length(p, field)
    if p.is_dir():
        raise ConfigError(field, str(path), "a file path (this is an existing folder)")
    _refuse_non_regular(p, field)
    return p


def _temp_prefix(final: Path) -> str:
    """The temporary-file prefix for writes of `final`: `.tierserve-<digest of its name>-<pid>-` (the pid says
    whose it is; the digest keeps the name short whatever the target's)."""
    import hashlib
    return f".tierserve-{hashlib.sha256(os.fsencode(final.name)).hexdigest()[:12]}-{os.getpid()}-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_dead_temps(final: Path) -> None:
    """Temporary files of earlier writes of `final` whose process is gone (a SIGKILL mid-write leaves one;
    nothing else would ever remove it). Only our own names for this target, and only a dead writer's."""
    prefix = _temp_prefix(final).rsplit("-", 2)[0] + "-"
    try:
        names = os.listdir(final.parent)
    except OSError:
        return
    for name in names:
        if not (name.startswith(prefix) and name.endswith(PARTIAL_SUFFIX)):
            continue
        pid = name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            p = final.parent / name
            if p.is_file() and not p.is_symlink():
                try:
                    p.unlink()
                except OSError:
                    pass


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` to write to; renamed onto `path` only when the block completes, so an
    interrupted write never leaves a file under the final name. A target that is not a regular file is refused.
    Temporary files a killed earlier write of the same target left beside it are removed."""
    final = Path(path)
    _refuse_non_regular(final, shown(final))
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        _remove_dead_temps(final)
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(final), suffix=PARTIAL_SUFFIX, dir=final.parent)
    except OSError as e:
        raise output_error(e, final) from None
    os.close(fd)
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)      # mkstemp makes 0600; the final file gets the usual permissions
    try:
        yield Path(tmp)
        _refuse_non_regular(final, shown(final))     # checked again: it may have appeared meanwhile
        os.replace(tmp, final)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise output_error(e, final) from None
        raise


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` through a temporary file and a rename."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def sha256_of(path: str | Path) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


class FolderLock:
    """An exclusive, non-blocking flock on `folder/.tierserve.lock`; a second holder is refused, naming the first.

    The lock file is removed on release; a lock taken on a file another run has just removed is retried."""

    def __init__(self, folder: Path, field: str = "--out") -> None:
        self.path, self.field, self.fd = folder / LOCK_FILE, field, -1

    def __enter__(self) -> FolderLock:
        import fcntl
        for _ in range(100):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 64).decode("ascii", "replace").strip() or "another process"
                os.close(fd)
                raise ConfigError(self.field, str(self.path.parent),
                                  f"a folder no other run is writing (process {holder} holds {self.path}; wait for "
                                  "it to finish or choose another --out)") from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self.fd = fd
                return self
            os.close(fd)                 # the holder removed it between our open and our lock: take the new one
        raise ConfigError(self.field, str(self.path), "a lock file that stays put (it kept being replaced)")

    def __exit__(self, *exc: object) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = -1


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """`folder/manifest.json` as written by `output_folder`, or None when there is none."""
    p = Path(folder) / MANIFEST_JSON
    if not p.exists():
        return None
    doc = parse_json(read_text(p, MANIFEST_JSON, "JSON"), MANIFEST_JSON, str(p))
    if not (isinstance(doc, dict) and doc.get("written_by") == "tierserve" and isinstance(doc.get("files"), dict)):
        raise ConfigError("--out", str(p), "a folder whose manifest.json is tierserve's (this one is not; it is "
                                           "left alone, so choose another --out)")
    for rel in doc["files"]:           # only names inside the folder are ever removed on its behalf
        if os.path.isabs(rel) or os.path.normpath(rel) != rel or rel.split(os.sep)[0] == "..":
            raise ConfigError("--out", str(p), f"a manifest naming files inside its folder (it names {rel!r})")
    return doc


def _staged_files(stage: Path, whole_only: bool) -> list[str]:
    """Relative paths of the files a run staged (inner locks and staging folders left out; with `whole_only`,
    temporary files too)."""
    found: list[str] = []
    for root, dirs, files in os.walk(stage):
        dirs[:] = sorted(d for d in dirs if not d.startswith(STAGE_PREFIX))
        for name in sorted(files):
            if name == LOCK_FILE or (root == str(stage) and name == MANIFEST_JSON) or (whole_only and (name.endswith(PARTIAL_SUFFIX) or name.endswith(".tmp"))):
                continue
            found.append(os.path.relpath(os.path.join(root, name), stage))
    # summary files vouch for their folder: renamed in after the files they describe
    return sorted(found, key=lambda r: (os.path.basename(r) in ("summary.json", "seeds.json"), r))


def _remove_listed(final: Path, rel: str) -> None:
    p = final / rel
    if p.is_symlink() or not p.is_file():   # a listed name is only ever removed if it is still a plain file
        return
    p.unlink()
    parent = p.parent
    while parent != final:                 # folders the previous run made, now empty
        try:
            parent.rmdir()
        except OSError:
            break
        parent = parent.parent


def _publish(stage: Path, final: Path, complete: bool) -> int:
    files = _staged_files(stage, whole_only=not complete)
    for rel in files:                       # nothing is replaced unless every target is a plain file
        _refuse_non_regular(final / rel, shown(stage / rel))
    entries = _entries(stage, files)
    old = read_manifest(final)
    (final / MANIFEST_JSON).unlink(missing_ok=True)     # from here on the folder vouches for nothing
    remove_unlisted(final, old, entries)
    for rel in files:
        (final / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(stage / rel, final / rel)
    _write_manifest(final, entries, complete)
    return len(files)


def _entries(folder: Path, files: list[str]) -> dict[str, dict[str, Any]]:
    return {rel: {"bytes": (folder / rel).stat().st_size, "sha256": sha256_of(folder / rel)} for rel in files}


def _write_manifest(final: Path, entries: dict[str, dict[str, Any]], complete: bool) -> None:
    doc = {"written_by": "tierserve", "complete": complete, "files": entries}
    write_text_atomic(final / MANIFEST_JSON, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def remove_unlisted(final: Path, old: dict[str, Any] | None, keep: dict[str, Any] | set[str]) -> None:
    """Remove the files a previous result's manifest `old` listed that the new result does not (`keep`)."""
    for rel in (old or {}).get("files", {}):
        if rel not in keep:
            _remove_listed(final, rel)


def withdraw_previous(final: Path) -> None:
    """Under the folder's lock, for a run about to replace the inputs a previous result was computed from (an
    engine's logs rewritten in place): that result's listed files and its manifest.json are removed first, so an
    old result never stands beside new inputs. Files the manifest does not list are left alone."""
    old = read_manifest(final)
    (final / MANIFEST_JSON).unlink(missing_ok=True)
    remove_unlisted(final, old, set())


def publish_in_place(final: Path, files: list[str], old: dict[str, Any] | None) -> None:
    """Vouch for a result written in place (each file atomically, under the folder's lock): the previous result's
    other files are removed and `manifest.json` listing `files` (relative to `final`) is written last. For
    results that must survive SIGKILL part-way (a sweep's points), where a staging folder would lose them."""
    entries = _entries(final, files)
    remove_unlisted(final, old, entries)
    _write_manifest(final, entries, complete=True)


def _remove_stale_stages(final: Path) -> None:
    """Staging folders a killed run left (we hold the lock, so their runs are gone)."""
    import shutil
    for p in final.glob(STAGE_PREFIX + "*"):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)


def _copy_previous(final: Path, stage: Path) -> None:
    """The previous result's files, copied into the staging folder (a resumed run starts from them)."""
    import shutil
    old = read_manifest(final)
    for rel in (old or {}).get("files", {}):
        src = final / rel
        if src.is_file():
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, stage / rel)


@contextmanager
def output_folder(path: str | Path, field: str = "--out", *, keep_on_interrupt: bool = False,
                  start_from_previous: bool = False) -> Iterator[Path]:
    """A private staging folder for a run whose result is the folder `path`, published whole when the block
    ends (see the notes above `PARTIAL_SUFFIX`).

    `keep_on_interrupt`: on Ctrl-C/SIGTERM, the whole files staged so far are published with
    `"complete": false` in the manifest (for studies that resume); otherwise an interrupt publishes nothing.
    `start_from_previous`: the staging folder starts as a copy of the previous result (for `--resume`)."""
    import shutil
    if is_stage(path):                                 # already the staging folder of an enclosing run
        yield Path(path)
        return
    final = check_out_dir(path, field)
    with FolderLock(final, field):
        read_manifest(final)                           # a foreign manifest.json is refused before the run
        _remove_stale_stages(final)
        stage = Path(tempfile.mkdtemp(prefix=STAGE_PREFIX, dir=final))
        key = str(stage)
        _stages[key] = final
        try:
            if start_from_previous:
                _copy_previous(final, stage)
            try:
                yield stage
            except KeyboardInterrupt:
                if keep_on_interrupt:
                    _publish(stage, final, complete=False)
                raise
            _publish(stage, final, complete=True)
        except OSError as e:
            raise output_error(e, final) from None
        finally:
            shutil.rmtree(stage, ignore_errors=True)
            _stages.pop(key, None)
