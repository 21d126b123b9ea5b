"""JSONL files that survive kills, corruption and readers: one object per line.

Records and traces (``experiments.records``, ``experiments.runner``) share
these rules:

- **Append** is one ``os.write`` of a complete line on an ``O_APPEND``
  descriptor, then ``fsync``: concurrent writers never interleave within a
  line, and a kill leaves at most one torn line, the last.
- **Repair** happens only when a file is opened for writing (the writer holds
  the job lock, so nobody else writes it). A torn last line (no trailing
  newline and not a valid object) is expected after a kill; any other
  unreadable line is corruption and is named in a warning (``file:line``).
  Both are moved, byte for byte, to ``<name>.quarantine`` beside the file —
  never deleted — and the file is rewritten atomically (temp file, fsync,
  ``os.replace``, fsync of the directory).
- **Reads** never rewrite: unreadable lines are skipped with a warning naming
  ``file:line``, and a torn tail is ignored (it may also be a line another
  process is writing right now).

Files this creates are 0600 (records and traces hold complete transcripts;
folders come from :func:`contextrender.files.private_dir`, 0700); files that
already exist keep the permissions their owner gave them.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contextrender.files import PRIVATE_FILE

log = logging.getLogger(__name__)

FILE_MODE = PRIVATE_FILE
QUARANTINE_SUFFIX = ".quarantine"

#: raises ValueError when a decoded line is not an acceptable object
Validator = Callable[[Any], None]


def require_object(obj: Any) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")


def quarantine_path(path: str | Path) -> Path:
    """``<name>.quarantine`` beside ``path``; not ``*.jsonl``, so record globs never read it."""
    path = Path(path)
    return path.with_name(path.name + QUARANTINE_SUFFIX)


@dataclass(frozen=True)
class Line:
    """One physical line of a JSONL file (1-based ``number``; ``raw`` without its newline)."""

    number: int
    raw: bytes
    newline: bool  # the line ends with b"\n"
    obj: Any = None
    problem: str | None = None  # why the line is unreadable (None: readable)

    @property
    def torn(self) -> bool:
        """An unreadable last line without its newline: a write cut off by a kill."""
        return self.problem is not None and not self.newline


def scan(data: bytes, validate: Validator = require_object) -> list[Line]:
    """Split ``data`` into lines and decode each; blank lines are left out."""
    out: list[Line] = []
    pos, number = 0, 0
    while pos < len(data):
        number += 1
        nl = data.find(b"\n", pos)
        end = len(data) if nl < 0 else nl
        raw = data[pos:end]
        pos = end + 1
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
            validate(obj)
        except UnicodeDecodeError as e:
            out.append(Line(number, raw, nl >= 0, problem=f"not valid UTF-8 ({e.reason} at byte {e.start})"))
        except json.JSONDecodeError as e:
            out.append(Line(number, raw, nl >= 0, problem=f"invalid JSON at column {e.colno}: {e.msg}"))
        except ValueError as e:
            out.append(Line(number, raw, nl >= 0, problem=str(e)))
        else:
            out.append(Line(number, raw, nl >= 0, obj))
    return out


def read_jsonl(path: str | Path, validate: Validator = require_object) -> list[Any]:
    """The readable objects of ``path`` in file order, without ever modifying it."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for line in scan(data, validate):
        if line.problem is None:
            out.append(line.obj)
        elif line.torn:
            # A kill mid-write, or a writer that is appending this very line now: the
            # next writer moves it to quarantine; a reader has nothing to report.
            log.debug("%s:%d: ignoring a torn last line (%s)", path, line.number, line.problem)
        else:
            log.warning("%s:%d: skipping an unreadable line: %s", path, line.number, line.problem)
    return out


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:  # one write for any normal line; the loop only covers a short write
        view = view[os.write(fd, view):]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append_bytes(path: str | Path, data: bytes) -> None:
    """Append ``data`` with one write on an ``O_APPEND`` descriptor and fsync (file created 0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: a reader sees the old file or the new one, never a mix."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


@dataclass(frozen=True)
class Repair:
    """What opening a file for writing changed (all zero: the file was left untouched)."""

    quarantined: int = 0  # unreadable lines moved to the quarantine file (torn tail included)
    torn_tail: bool = False
    dropped: int = 0  # readable lines the caller's ``keep`` rejected

    @property
    def changed(self) -> bool:
        return bool(self.quarantined or self.dropped)


class JsonlFile:
    """A JSONL file with thread-safe atomic appends, a non-rewriting reader and quarantine repair."""

    def __init__(self, path: str | Path, validate: Validator = require_object) -> None:
        self.path = Path(path)
        self.validate = validate
        self._lock = threading.Lock()

    @property
    def quarantine(self) -> Path:
        return quarantine_path(self.path)

    def read(self) -> list[Any]:
        return read_jsonl(self.path, self.validate)

    def append(self, obj: Any) -> None:
        self.append_line(json.dumps(obj, ensure_ascii=False, sort_keys=True))

    def append_line(self, line: str) -> None:
        """Append one already-serialised line (a newline is added)."""
        if "\n" in line:
            raise ValueError("a JSONL line cannot contain a newline")
        with self._lock:
            append_bytes(self.path, (line + "\n").encode("utf-8"))

    def repair(self, keep: Callable[[Any], bool] | None = None) -> Repair:
        """Open for writing: quarantine unreadable lines, drop readable ones ``keep`` rejects.

        Only the writer of a file may call this (the runner holds the job lock).
        Nothing is rewritten when nothing changes; a readable last line that
        only lacks its newline gets one, so the next append starts a new line.
        """
        with self._lock:
            try:
                data = self.path.read_bytes()
            except FileNotFoundError:
                return Repair()
            lines = scan(data, self.validate)
            bad = [ln for ln in lines if ln.problem is not None]
            good = [ln for ln in lines if ln.problem is None and (keep is None or keep(ln.obj))]
            dropped = sum(1 for ln in lines if ln.problem is None) - len(good)
            torn = any(ln.torn for ln in bad)
            if not bad and not dropped:
                if data and not data.endswith(b"\n"):
                    append_bytes(self.path, b"\n")  # a complete last line written without its newline
                return Repair()
            for ln in bad:
                if ln.torn:
                    log.info("%s:%d: torn last line (%s) moved to %s", self.path, ln.number, ln.problem,
                             self.quarantine)
                else:
                    log.warning("%s:%d: unreadable line (%s) moved to %s", self.path, ln.number, ln.problem,
                                self.quarantine)
            if bad:
                # Quarantine first and durably: a crash before the rewrite leaves the line in
                # both files (a duplicate in quarantine), never in neither.
                append_bytes(self.quarantine, b"".join(ln.raw + b"\n" for ln in bad))
            atomic_write(self.path, b"".join(ln.raw + b"\n" for ln in good))
            return Repair(len(bad), torn, dropped)


__all__ = ["FILE_MODE", "JsonlFile", "Line", "Repair", "append_bytes", "atomic_write", "quarantine_path",
           "read_jsonl", "require_object", "scan"]
