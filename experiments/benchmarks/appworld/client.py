"""Main-env side of the AppWorld worker protocol (see :mod:`.worker` for the protocol).

AppWorld pins pydantic 1, so it lives in its own venv (``.venv-appworld``,
made by ``scripts/setup_appworld.sh``) and runs in worker processes. A
:class:`WorkerClient` owns one process: it spawns it, sends one request at a
time and waits for the reply with a per-request timeout (a worker that times
out or dies is killed and the call raises :class:`WorkerError`). A
:class:`WorkerPool` hands out idle workers for one data root so parallel
episodes (the runner's ``workers``) each get their own world.

Paths, all inside the repository unless overridden:

* interpreter: ``CONTEXTRENDER_APPWORLD_PYTHON`` or ``<repo>/.venv-appworld/bin/python``;
* AppWorld root (holds ``data/`` and ``experiments/outputs``):
  ``APPWORLD_ROOT`` or ``<repo>/.appworld``; offline tasks: ``<repo>/.appworld/offline``;
* ``APPWORLD_CACHE`` (where ``appworld install`` unpacks its tests): ``<repo>/.appworld/cache``.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import queue
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[3]
WORKER_SCRIPT = Path(__file__).resolve().with_name("worker.py")
SETUP_SCRIPT = REPO_ROOT / "scripts" / "setup_appworld.sh"
APPWORLD_VERSION = "0.1.3.post1"
PROTOCOL_VERSION = 1

#: default per-operation timeouts in seconds (AppWorld's own execution timeout is 100 s)
TIMEOUTS: dict[str, float] = {
    "ready": 180.0, "task_ids": 120.0, "open": 300.0, "execute": 240.0, "evaluate": 300.0,
    "close": 120.0, "build_offline": 1800.0, "ping": 30.0, "shutdown": 30.0,
}


class AppWorldUnavailable(RuntimeError):
    """The AppWorld venv is missing and could not be created."""


class WorkerError(RuntimeError):
    """A worker request failed (``remote_type`` is the exception type raised inside the worker)."""

    def __init__(self, message: str, remote_type: str = "", remote_traceback: str = "") -> None:
        super().__init__(message)
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback


def appworld_python() -> Path:
    override = os.environ.get("CONTEXTRENDER_APPWORLD_PYTHON")
    return Path(override) if override else REPO_ROOT / ".venv-appworld" / "bin" / "python"


def default_root() -> Path:
    env = os.environ.get("APPWORLD_ROOT")
    return Path(env) if env else REPO_ROOT / ".appworld"


def offline_root() -> Path:
    return REPO_ROOT / ".appworld" / "offline"


def appworld_cache() -> Path:
    env = os.environ.get("APPWORLD_CACHE")
    return Path(env) if env else REPO_ROOT / ".appworld" / "cache"


_setup_lock = threading.Lock()
_shared_lock = threading.Lock()
_shared_pools: dict[tuple[str, int | None], WorkerPool] = {}


def ensure_appworld(auto_setup: bool = True) -> Path:
    """Return the AppWorld interpreter, running ``scripts/setup_appworld.sh`` first if it is missing."""
    python = appworld_python()
    with _setup_lock:
        if _installed(python):
            return python
        if not auto_setup or os.environ.get("CONTEXTRENDER_APPWORLD_PYTHON"):
            raise AppWorldUnavailable(
                f"AppWorld is not installed at {python}. Run `bash scripts/setup_appworld.sh` "
                f"(creates .venv-appworld with appworld=={APPWORLD_VERSION}; needs PyPI access once).")
        log.warning("AppWorld venv missing; running %s (one-time, about a minute)", SETUP_SCRIPT)
        proc = subprocess.run(["bash", str(SETUP_SCRIPT)], cwd=REPO_ROOT, capture_output=True, text=True)
        if proc.returncode != 0 or not _installed(python):
            raise AppWorldUnavailable(
                f"`bash scripts/setup_appworld.sh` failed (exit {proc.returncode}); run it yourself to see why.\n"
                f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}")
        return python


def _installed(python: Path) -> bool:
    stamp = python.parent.parent / f".installed-appworld-{APPWORLD_VERSION}"
    return python.exists() and stamp.exists()


class WorkerClient:
    """One worker process bound to one AppWorld root."""

    def __init__(self, root: str | Path, python: str | Path | None = None,
                 timeouts: dict[str, float] | None = None) -> None:
        self.root = Path(root).resolve()
        self.python = Path(python) if python else ensure_appworld()
        self.timeouts = {**TIMEOUTS, **(timeouts or {})}
        self._next_id = 1
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=200)
        self._lock = threading.Lock()
        self.root.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(APPWORLD_ROOT=str(self.root), APPWORLD_CACHE=str(appworld_cache()),
                   PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPATH", None)  # the main venv's paths must not leak into the AppWorld venv
        env.pop("VIRTUAL_ENV", None)
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            [str(self.python), str(WORKER_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=str(self.root), env=env, text=True, encoding="utf-8", bufsize=1)
        threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines), daemon=True).start()
        threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True).start()
        hello = self._read(0, self.timeouts["ready"], "ready")
        self.info: dict[str, Any] = hello
        if hello.get("protocol") != PROTOCOL_VERSION:
            self.kill()
            raise WorkerError(f"worker speaks protocol {hello.get('protocol')}, expected {PROTOCOL_VERSION}")
        self.startup_seconds = time.perf_counter() - started

    # -- plumbing ----------------------------------------------------------------

    @staticmethod
    def _pump(stream: Any, lines: queue.Queue[str | None]) -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)  # EOF

    def _drain(self, stream: Any) -> None:
        for line in stream:
            self._stderr.append(line.rstrip("\n"))
            log.debug("appworld worker %s: %s", self.proc.pid, line.rstrip())

    def stderr_tail(self, n: int = 30) -> str:
        return "\n".join(list(self._stderr)[-n:])

    def _read(self, rid: int, timeout: float, op: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise WorkerError(f"AppWorld worker timed out after {timeout:.0f}s on {op!r}; killed it.\n"
                                  f"stderr tail:\n{self.stderr_tail()}", "Timeout")
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                code = self.proc.wait(timeout=10)
                raise WorkerError(f"AppWorld worker exited (code {code}) during {op!r}.\n"
                                  f"stderr tail:\n{self.stderr_tail()}", "WorkerDied")
            try:
                reply = json.loads(line)
            except json.JSONDecodeError:
                log.warning("non-protocol line from AppWorld worker: %r", line[:200])
                continue
            if reply.get("id") != rid:
                log.warning("dropping stale reply %s (waiting for %s)", reply.get("id"), rid)
                continue
            if not reply.get("ok"):
                err = reply.get("error") or {}
                raise WorkerError(f"{op}: {err.get('type')}: {err.get('message')}", err.get("type", ""),
                                  err.get("traceback", ""))
            return reply.get("result") or {}

    def request(self, op: str, timeout: float | None = None, **args: Any) -> dict[str, Any]:
        with self._lock:
            if not self.alive:
                raise WorkerError(f"AppWorld worker is not running (op {op!r})", "WorkerDied")
            rid = self._next_id
            self._next_id += 1
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"id": rid, "op": op, "args": args}, ensure_ascii=False) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError) as e:
                raise WorkerError(f"AppWorld worker pipe closed: {e}\n{self.stderr_tail()}", "WorkerDied") from e
            return self._read(rid, timeout if timeout is not None else self.timeouts.get(op, 300.0), op)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        if self.alive:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def close(self) -> None:
        """Ask the worker to exit; kill it if it does not."""
        if self.alive:
            try:
                self.request("shutdown")
                self.proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 — shutting down anyway
                pass
        self.kill()

    def __enter__(self) -> WorkerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- operations ------------------------------------------------------------------

    def task_ids(self, dataset: str, difficulty: int | None = None) -> list[str]:
        return list(self.request("task_ids", dataset=dataset, difficulty=difficulty)["task_ids"])

    def open(self, task_id: str, **kwargs: Any) -> dict[str, Any]:
        return self.request("open", task_id=task_id, **{k: v for k, v in kwargs.items() if v is not None})

    def execute(self, code: str) -> dict[str, Any]:
        return self.request("execute", code=code)

    def evaluate(self) -> dict[str, Any]:
        return self.request("evaluate")

    def close_world(self, keep_outputs: bool = False) -> None:
        self.request("close", keep_outputs=keep_outputs)


class WorkerPool:
    """Idle workers for one root; ``with pool.worker() as w:`` gives a worker to one episode.

    Workers are reused across episodes (each ``open`` closes the previous
    world) and replaced after ``max_uses`` episodes or any failure. At most
    ``size`` workers exist at once (None: one per concurrent episode).
    """

    def __init__(self, root: str | Path, size: int | None = None, max_uses: int = 25,
                 timeouts: dict[str, float] | None = None) -> None:
        self.root = Path(root)
        self.size = size
        self.max_uses = max_uses
        self.timeouts = timeouts
        self._idle: list[tuple[WorkerClient, int]] = []
        self._count = 0
        self._cond = threading.Condition()
        self._closed = False

    @contextmanager
    def worker(self) -> Iterator[WorkerClient]:
        client, uses = self._acquire()
        ok = False
        try:
            yield client
            ok = True
        finally:
            self._release(client, uses + 1, healthy=ok and client.alive)

    def _acquire(self) -> tuple[WorkerClient, int]:
        with self._cond:
            while True:
                if self._closed:
                    raise WorkerError("worker pool is closed")
                if self._idle:
                    return self._idle.pop()
                if self.size is None or self._count < self.size:
                    self._count += 1
                    break
                self._cond.wait()
        try:
            return WorkerClient(self.root, timeouts=self.timeouts), 0
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def _release(self, client: WorkerClient, uses: int, healthy: bool) -> None:
        retire = not healthy or uses >= self.max_uses
        if retire:
            client.close()
        with self._cond:
            if retire or self._closed:
                self._count -= 1
                if not retire:
                    client.close()
            else:
                self._idle.append((client, uses))
            self._cond.notify()

    @property
    def closed(self) -> bool:
        return self._closed

    @classmethod
    def shared(cls, root: str | Path, size: int | None = None) -> WorkerPool:
        """One pool per (root, size) per process, so consecutive jobs of a Hydra multirun
        (same process) reuse warm workers instead of paying start-up and first-open again."""
        key = (str(Path(root).resolve()), size)
        with _shared_lock:
            pool = _shared_pools.get(key)
            if pool is None or pool.closed:
                pool = _shared_pools[key] = cls(root, size=size)
                atexit.register(pool.close)
            return pool

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
            self._cond.notify_all()
        for client, _ in idle:
            client.close()

    def __del__(self) -> None:  # best effort: never leave worker processes behind
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
