"""The session view: the dinner-bill picture of the paper's Figure 2, from its embedded data, in a
real headless Chromium, from the CLI and from the server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from contextrender import HashingEmbedder
from contextrender.experiments.fixtures.scenarios import DINNER_BILL_BUDGET, DINNER_BILL_CONTACT_SEQ, dinner_bill
from contextrender.graph import ContextGraph
from contextrender.registry import build_policy, method_config
from contextrender.service.server import create_app
from contextrender.service.sessions import ContextService
from contextrender.view import browser, chromium, method_view, render_html, view_data

from .conftest import serve

REPO = Path(__file__).resolve().parents[2]
NANCY = "nancy.ritter@gmail.com"


class _Page(HTMLParser):
    """The embedded data block and the elements of a page (tag, attributes)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: dict[str, str] = {}
        self.external: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.elements.append((tag, a))
        if tag == "script":
            self._in = a.get("id") or "inline"
            self.scripts.setdefault(self._in, "")
            if a.get("src"):
                self.external.append(str(a["src"]))
        if tag == "link" and a.get("href"):
            self.external.append(str(a["href"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in is not None:
            self.scripts[self._in] += data


def _parse(html_text: str) -> tuple[_Page, dict]:
    page = _Page()
    page.feed(html_text)
    return page, json.loads(page.scripts["cr-data"])


@pytest.fixture(scope="module")
def dinner_html() -> str:
    emb = HashingEmbedder(dim=256)
    policies = {m: build_policy(method_config(m), embedder=emb) for m in ("contextrender", "prune")}
    return render_html(view_data(dinner_bill(), policies, DINNER_BILL_BUDGET, session_id="dinner-bill"))


def test_dinner_bill_view_holds_figure_2(dinner_html):
    page, data = _parse(dinner_html)
    assert page.external == []  # self-contained: no src/href fetch at all
    script = page.scripts["inline"]
    # The script fetches nothing: no network APIs, and no URL but the SVG namespace identifier.
    assert not re.search(r"fetch\(|XMLHttpRequest|WebSocket|import\(|sendBeacon|\.src\s*=", script)
    assert set(re.findall(r"https?://[^\s\"']+", script)) <= {"http://www.w3.org/2000/svg"}
    contact = next(r for r in data["results"] if r["seq"] == DINNER_BILL_CONTACT_SEQ)
    assert contact["tool"] == "phone__search_contacts" and contact["invocation"] == 8  # the paper's Turn 8
    msg = next(m for m in data["messages"] if m["seq"] == DINNER_BILL_CONTACT_SEQ)
    assert NANCY in msg["text"]  # Nancy's address, still needed at the last turn
    # Reuse edges from the two payment requests back to the contact search, labelled with their values.
    into = {(e["op"], e["value"]) for e in data["edges"] if e["source"] == DINNER_BILL_CONTACT_SEQ}
    ops = sorted({op for op, _ in into})
    turns = [next(m["invocation"] for m in data["messages"] if m["seq"] == op) for op in ops]
    assert turns == [14, 16] and ("gmail.com" in {v for _, v in into}) and any("troy_solo" == v for _, v in into)
    calls = [next(m for m in data["messages"] if m["seq"] == op)["calls"][0]["name"] for op in ops]
    assert calls == ["venmo__create_payment_request"] * 2
    # Each policy's state at the final invocation (the request to Nancy): ContextRender keeps it, Prune does not.
    k = contact["index"]
    final = len(data["invocations"]) - 1
    assert data["states"]["contextrender"][final][k] == "F" and data["states"]["prune"][final][k] == "O"
    # The scores behind it, for ContextRender: reused (c_t > 0), picked.
    age, c_t, s_t, u_t, sim, pick, reason = data["scores"]["contextrender"][final][k]
    assert age == 10 and c_t > 0 and reason == "p" and pick is not None and 0 <= sim <= 1
    assert data["scores"]["prune"][final] is None  # no per-result scores for Prune
    # Before the search ran, the result is "later" for both policies.
    first = data["invocations"][0]
    assert data["states"]["prune"][0][k] == "-" and first["seq"] < DINNER_BILL_CONTACT_SEQ
    # Recall events (docs/method.md §7) with a hit/miss per policy.
    ev = [i for i, e in enumerate(data["recall"]["events"]) if e[1] == DINNER_BILL_CONTACT_SEQ]
    assert ev and all(data["recall"]["hits"][p][i] in (0, 1) for p in data["policies"] for i in ev)
    # Call readiness: the calls that needed a value only a tool result held, and what each policy hid from them.
    # Venmo's password (from the supervisor's password list, many turns back): Prune dropped it, ContextRender not.
    calls = data["readiness"]["calls"]
    k = next(i for i, c in enumerate(calls) if c[2] == "venmo__login")
    assert calls[k][3] == ["Jf1#vS6kDm"] and data["messages"][calls[k][4][0]]["role"] == "tool"
    assert data["readiness"]["missing"]["prune"][k] == ["Jf1#vS6kDm"]
    assert data["readiness"]["missing"]["contextrender"][k] == []
    assert len(data["readiness"]["missing"]["prune"]) == len(calls) >= 10


def test_view_data_matches_the_policies_own_renders():
    # The states are what the policy rendered before each assistant message, not a reconstruction.
    emb = HashingEmbedder(dim=64)
    msgs = dinner_bill()
    data = method_view(msgs, ["contextrender"], 3000, embedder=emb).to_json()
    s = ContextGraph().session("check")
    policy = build_policy(method_config("contextrender"), embedder=emb)
    t = 0
    for m in msgs:
        if m["role"] == "assistant":
            visible = policy.render(s, 3000).visible
            codes = data["states"]["contextrender"][t]
            for r in data["results"]:
                assert (codes[r["index"]] == "F") == (r["seq"] in visible), (t, r["seq"])
            assert data["tokens"]["contextrender"][t] == policy.render(s, 3000).tokens
            t += 1
        s.add(m)


def test_data_cannot_break_out_of_its_script_block():
    evil = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "</script><script>alert(1)</script> & <b>"}]
    html_text = render_html(method_view(evil, ["prune"], 100))
    assert html_text.count("<script") == 2 and "alert(1)</script>" not in html_text
    _page, data = _parse(html_text)
    assert data["messages"][2]["text"].startswith("</script><script>")  # intact once parsed


chromium_missing = pytest.mark.skipif(chromium() is None, reason="Chromium is not installed: .ci/run installs "
                                      "Debian's chromium package; locally `apt-get install -y chromium`")


@chromium_missing
def test_chromium_draws_nodes_and_edges(tmp_path, dinner_html):
    page_file = tmp_path / "view.html"
    page_file.write_text(dinner_html, encoding="utf-8")
    dom = browser(page_file, dump_dom=True, fragment=f"seq={DINNER_BILL_CONTACT_SEQ}")
    page = _Page()
    page.feed(dom)
    body = next(a for t, a in page.elements if t == "body")
    assert body.get("data-ready") == "1"
    rows = [a for t, a in page.elements if t == "div" and "msg" in (a.get("class") or "").split()]
    assert len(rows) == len(dinner_bill())
    edges = [a for t, a in page.elements if t == "path" and "edge" in (a.get("class") or "")]
    into = [a for a in edges if a.get("data-source") == str(DINNER_BILL_CONTACT_SEQ)]
    assert {a["data-value"] for a in into} >= {"gmail.com", "troy_solo"}
    assert any("selected" in (a.get("class") or "") for a in into)  # the focused result's edges stand out
    badges = {(a.get("data-policy"), a.get("data-seq")): a.get("data-state") for t, a in page.elements
              if t == "span" and "state" in (a.get("class") or "").split()}
    assert badges[("contextrender", str(DINNER_BILL_CONTACT_SEQ))] == "full"
    assert badges[("prune", str(DINNER_BILL_CONTACT_SEQ))] == "omitted"
    # The details panel holds the scores of the selected result for both policies.
    assert any(t == "tr" and a.get("data-policy") == "contextrender" for t, a in page.elements)
    # Each needing call carries a readiness badge per policy; Prune left the Venmo login without its password.
    ready = [(a.get("data-policy"), a.get("class")) for t, a in page.elements
             if t == "span" and "ready" in (a.get("class") or "").split()]
    assert ("prune", "ready not-ready") in ready and ("contextrender", "ready is-ready") in ready
    assert not any(p == "contextrender" and "not-ready" in c for p, c in ready)


@chromium_missing
def test_a_500_result_session_opens(tmp_path):
    msgs = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Audit everything."}]
    for i in range(500):
        msgs += [{"role": "assistant", "content": f"Reading part {i}.", "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": f"read_{i % 7}", "arguments": json.dumps({"i": i})}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"REC_{i:04d} links REC_{max(i - 9, 0):04d} "
                                                                   + "pad " * 60}]
    page_file = tmp_path / "big.html"
    page_file.write_text(render_html(method_view(msgs, ["contextrender", "prune"], 4000)), encoding="utf-8")
    dom = browser(page_file, dump_dom=True)
    assert 'data-ready="1"' in dom and dom.count('class="msg ') == len(msgs)


def test_cli_view_from_a_graph_and_from_a_trace_file(tmp_path):
    graph = tmp_path / "g.sqlite"
    with ContextGraph(graph) as g:
        g.session("dinner").extend(dinner_bill())
    out = tmp_path / "v.html"
    proc = subprocess.run([sys.executable, "-m", "contextrender.cli", "view", "dinner", "--graph", str(graph),
                           "--budget", str(DINNER_BILL_BUDGET), "--embedding", "hashing", "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    _page, data = _parse(out.read_text(encoding="utf-8"))
    assert data["policies"] == ["contextrender", "prune"] and data["session"] == "dinner"
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"task_id": "dinner-trace", "messages": dinner_bill()}) + "\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "contextrender.cli", "view", str(trace), "--budget", "3000",
                           "--methods", "prune", "--embedding", "hashing", "--out", str(tmp_path / "t.html")],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert _parse((tmp_path / "t.html").read_text(encoding="utf-8"))[1]["session"] == "dinner-trace"
    bad = subprocess.run([sys.executable, "-m", "contextrender.cli", "view", "nope", "--graph", str(graph),
                          "--budget", "300", "--embedding", "hashing"], capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert bad.returncode == 2 and "no session 'nope'" in bad.stderr


def test_server_serves_the_same_page(tmp_path):
    svc = ContextService(str(tmp_path / "g.sqlite"), embedder=HashingEmbedder(dim=64), default_budget=3000)
    try:
        svc.sync("dinner", dinner_bill())
        with serve(create_app(service=svc)) as url:
            r = httpx.get(f"{url}/sessions/dinner/view?budget={DINNER_BILL_BUDGET}&methods=contextrender,prune")
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
            _page, data = _parse(r.text)
            assert data["budget"] == DINNER_BILL_BUDGET and len(data["results"]) == 19
            assert httpx.get(f"{url}/sessions/nope/view").status_code == 404
            assert httpx.get(f"{url}/sessions/dinner/view?methods=no_such").status_code == 422
            assert httpx.get(f"{url}/sessions/dinner/view?methods=a,b,c").status_code == 422
            # A cross-site page cannot load it (the guard runs first).
            assert httpx.get(f"{url}/sessions/dinner/view", headers={"sec-fetch-site": "cross-site"}).status_code == 403
        assert len(svc.transcript("dinner").messages) == len(dinner_bill())  # nothing written by the view
    finally:
        svc.close()
