"""Files that hold transcripts: private permissions and single-writer locks.

Graph files, run records and traces hold complete agent transcripts, so
what this project creates is readable by its owner only (files 0600,
folders 0700); files and folders that already exist keep the permissions
their owner gave them. :func:`hold_lock` is an advisory ``flock`` that a
second writer cannot take: it refuses with the holder's pid, host and start
time instead of letting two writers interleave.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import stat
import time
from pathlib import Path
from typing import IO, Any

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None  # type: ignore[assignment]

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


class LockedError(RuntimeError):
    """Another process (or another object in this one) holds the lock."""


def private_dir(path: str | Path) -> Path:
    """Create ``path`` and its missing parents if needed; every folder this creates is 0700."""
    p = Path(path)
    missing = []
    q = p
    while not q.is_dir():
        missing.append(q)
        if q.parent == q:
            break
        q = q.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:
            pass
    return p


def private_file(path: str | Path) -> Path:
    """Create ``path`` empty with mode 0600 if it does not exist (its folder with :func:`private_dir`)."""
    p = Path(path)
    private_dir(p.parent)
    try:
        fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_FILE)
    except FileExistsError:
        return p
    os.close(fd)
    return p


def open_private(path: str | Path, mode: str = "a", encoding: str | None = "utf-8") -> IO[Any]:
    """``open(path, mode)``, creating the file 0600 first if it does not exist."""
    private_file(path)
    return open(path, mode, encoding=None if "b" in mode else encoding)


def write_private(path: str | Path, text: str, *, append: bool = False, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` (after what it holds, with ``append``) as a new 0600 file, atomically.

    A symlink at ``path`` (dangling or not) is refused, never followed: the text goes into a fresh file
    created next to it with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600, which then replaces ``path``
    (``os.replace``: readers see the old file or the new one, never half of one; a link put there in
    between is replaced, not followed). Returns the path.

    Raises:
        OSError: ``path`` is a symlink or not a regular file, or the write failed (nothing replaced).
    """
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, f"{p} is a symlink; refusing to write through it (remove it or choose "
                                   "another file)")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, f"{p} is not a regular file")
    private_dir(p.parent if str(p.parent) else Path("."))
    data = text.encode(encoding)
    if append and st is not None:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as old:
            data = old.read() + data
    nofollow = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = p.with_name(f".{p.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | nofollow, PRIVATE_FILE)
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - 100 collisions of 32 random bits
        raise OSError(errno.EEXIST, f"cannot create a temporary file next to {p}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return p


#: (st_dev, st_ino) of every file this process holds with :func:`hold_identity_lock` -> who holds it.
_HELD: dict[tuple[int, int], str] = {}


def _flock_holder(dev: int, ino: int) -> str:
    """The pid holding a ``flock`` on the file (dev, ino), from ``/proc/locks`` (Linux), else ``?``."""
    want = f"{os.major(dev):02x}:{os.minor(dev):02x}:{ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == want:
                    return parts[4]
    except OSError:
        pass
    return "?"


class IdentityLock:
    """An exclusive ``flock`` on a file itself, so every name of it (hard links, symlinks) is refused."""

    def __init__(self, fd: int, key: tuple[int, int]) -> None:
        self._fd: int | None = fd
        self.key = key

    def close(self) -> None:
        if self._fd is not None:
            _HELD.pop(self.key, None)
            os.close(self._fd)  # releases the flock
            self._fd = None


def hold_identity_lock(path: str | Path, *, what: str) -> IdentityLock:
    """Take an exclusive, non-blocking ``flock`` on the existing file ``path``, keyed by what the file is
    (``st_dev``, ``st_ino``) rather than by its name: a hard link or a symlink to a held file is refused too.

    A file this process already holds is refused without opening it again (closing a second descriptor
    of a SQLite file would drop its POSIX locks). Close the returned lock to release it.
    """
    st = os.stat(path)
    key = (st.st_dev, st.st_ino)
    if key in _HELD:
        raise LockedError(f"{what} is in use by pid {os.getpid()} on {socket.gethostname()} (this process: "
                          f"{_HELD[key]}); close it first or use another file")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        st2 = os.fstat(fd)
        key = (st2.st_dev, st2.st_ino)  # what was opened (the name may have changed since the stat)
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LockedError(f"{what} is in use by pid {_flock_holder(*key)} (the same file, under this or another "
                          "name: a hard link or a symlink to it); stop that process or use another file") from None
    except BaseException:
        os.close(fd)
        raise
    _HELD[key] = f"{what}"
    return IdentityLock(fd, key)


def hold_lock(path: str | Path, *, what: str) -> IO[Any]:
    """Take an exclusive, non-blocking ``flock`` on ``path``; return the open file (close it to release).

    The file records the holder (pid, host, start time) so that a refused
    writer can say who has it. The lock dies with its process, so a killed
    holder never leaves a stale lock behind.
    """
    # The lock is named after the real path, so a symlink or another spelling of the same file
    # cannot take a second lock on it.
    p = private_file(Path(os.path.realpath(path)))
    f = open(p, "r+", encoding="utf-8")
    if fcntl is None:  # pragma: no cover
        return f
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = json.loads(f.read() or "{}")
        except json.JSONDecodeError:
            holder = {}
        f.close()
        since = holder.get("since")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
        raise LockedError(f"{what} is in use by pid {holder.get('pid', '?')} on {holder.get('host', '?')} "
                          f"(since {when}; lock file {p}); stop that process or use another file") from None
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}))
    f.flush()
    return f


__all__ = ["IdentityLock", "LockedError", "PRIVATE_DIR", "PRIVATE_FILE", "hold_identity_lock", "hold_lock",
           "open_private", "private_dir", "private_file", "write_private"]
