"""The one-way import rule (scripts/check_layers.py) and its picture, docs/import_graph.svg, kept current."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _layers():
    spec = importlib.util.spec_from_file_location("check_layers", REPO / "scripts" / "check_layers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_layers"] = module
    spec.loader.exec_module(module)
    return module


def test_imports_run_one_way():
    assert _layers().check() == []


def test_the_analysis_layer_imports_the_harness_under_its_package_name():
    """What grep on folder names cannot see: analysis/ imports contextrender.experiments (the harness)."""
    found = _layers().edges()
    assert found[("analysis", "harness")] > 0 and ("harness", "analysis") not in found
    assert ("service", "harness") not in found and ("harness", "service") not in found


def test_the_committed_picture_is_current(tmp_path):
    """make check redraws docs/import_graph.svg; the committed one must be what the imports are now."""
    fresh = tmp_path / "import_graph.svg"
    layers = _layers()
    layers.ROOT = REPO  # draw() writes under ROOT
    layers.draw(fresh)
    committed = (REPO / "docs" / "import_graph.svg").read_text(encoding="utf-8")
    assert fresh.read_text(encoding="utf-8") == committed, "run `make check` and commit docs/import_graph.svg"
