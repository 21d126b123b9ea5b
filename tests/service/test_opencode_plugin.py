"""The opencode plugin's transform hook, run by node's test runner against a live server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from contextrender.graph import OMISSION_MARKER
from contextrender.service.server import create_app

from .conftest import history_tokens, serve

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "integrations" / "opencode"
BUDGET = 1500


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_opencode_plugin_transform(service, tmp_path):
    out = tmp_path / "rendered.json"
    with serve(create_app(service=service)) as url:
        env = {**os.environ, "CONTEXTRENDER_URL": url, "CR_TEST_BUDGET": str(BUDGET), "CR_TEST_OUT": str(out)}
        proc = subprocess.run(["node", "--test", "contextrender.test.mjs"], cwd=PLUGIN_DIR, env=env,
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "# fail 0" in proc.stdout and "# skipped 0" in proc.stdout
    # What opencode would send (converted back to OpenAI form) is within B.
    rendered = json.loads(out.read_text())
    assert history_tokens(rendered) <= BUDGET
    assert any(OMISSION_MARKER in (m.get("content") or "") for m in rendered)
    stored = list(service.transcript("opencode-ses_test").messages)
    assert stored[0]["role"] == "user" and sum(m["role"] == "tool" for m in stored) > 10
