"""The session view: the dinner-bill picture of the paper's Figure 2, from its embedded data, in a
real headless Chromium, from the CLI and from the server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
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
from contextrender.view import ViewWindow, browser, chromium, method_view, render_html, view_data

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
    # Every invocation, as a library caller may ask (the service and the CLI draw at most MAX_VIEW_INVOCATIONS).
    page_file.write_text(render_html(method_view(msgs, ["contextrender", "prune"], 4000,
                                                 window=ViewWindow.everything())), encoding="utf-8")
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
    assert data["policies"] == ["contextrender_plus", "prune"] and data["session"] == "dinner"
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


# -- bounded views: a window of invocations, limits as JSON errors, off the event loop -------------


def _long_session(n_turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Audit everything."}]
    for i in range(n_turns):
        msgs += [{"role": "assistant", "content": f"Reading part {i}.", "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": f"read_{i % 7}",
                                                             "arguments": json.dumps({"ref": f"REC_{max(i - 9, 0):05d}"})}}]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": f"REC_{i:05d} links REC_{max(i - 9, 0):05d} "
                                                                   + "pad " * 60}]
    return msgs


class _Counting:
    """A policy that counts its renders and the longest history it was asked to render."""

    def __init__(self, inner) -> None:
        self.inner, self.calls, self.longest = inner, 0, 0
        self.name = inner.name
        if callable(getattr(inner, "select", None)):
            self.select = self._select

    def _note(self, session) -> None:
        self.calls += 1
        self.longest = max(self.longest, len(session))

    def _select(self, session, budget):
        self._note(session)
        return self.inner.select(session, budget)

    def render(self, session, budget):
        self._note(session)
        return self.inner.render(session, budget)


def test_a_view_renders_only_its_window():
    from contextrender.view import DEFAULT_VIEW_INVOCATIONS

    msgs = _long_session(5000)  # 10,002 messages, 5,001 invocations
    emb = HashingEmbedder(dim=64)
    policies = {m: _Counting(build_policy(method_config(m), embedder=emb)) for m in ("contextrender", "prune")}
    data = view_data(msgs, policies, 4000).to_json()
    assert [p.calls for p in policies.values()] == [DEFAULT_VIEW_INVOCATIONS] * 2  # not one per invocation
    assert [i["t"] for i in data["invocations"]] == list(range(5001 - DEFAULT_VIEW_INVOCATIONS, 5001))
    assert data["window"]["invocations"] == 5001 and data["window"]["messages"] == len(msgs)
    # The page holds the window's messages and the earlier results its renders show, not the session.
    assert len(data["messages"]) < 6 * DEFAULT_VIEW_INVOCATIONS
    assert all(len(codes) == len(data["results"]) for codes in data["states"]["prune"])
    # A window at the start renders short histories only.
    early = {m: _Counting(build_policy(method_config(m), embedder=emb)) for m in ("prune",)}
    data = view_data(msgs, early, 4000, window=ViewWindow(start=0, end=9)).to_json()
    assert early["prune"].calls == 10 and early["prune"].longest < 25
    assert [i["t"] for i in data["invocations"]] == list(range(10))


def test_a_window_draws_what_the_whole_view_draws():
    emb = HashingEmbedder(dim=64)
    msgs = dinner_bill()
    whole = method_view(msgs, ["contextrender", "prune"], 3000, embedder=emb, window=ViewWindow.everything()).to_json()
    part = method_view(msgs, ["contextrender", "prune"], 3000, embedder=emb, window=ViewWindow(5, 9)).to_json()
    assert [i["t"] for i in part["invocations"]] == [5, 6, 7, 8, 9]
    index = {r["seq"]: r["index"] for r in whole["results"]}
    for p in ("contextrender", "prune"):
        for k, inv in enumerate(part["invocations"]):
            assert part["tokens"][p][k] == whole["tokens"][p][inv["t"]]
            for r in part["results"]:
                assert part["states"][p][k][r["index"]] == whole["states"][p][inv["t"]][index[r["seq"]]], (p, inv, r)
    last3 = method_view(msgs, ["prune"], 3000, embedder=emb, window=ViewWindow(last=3)).to_json()
    assert [i["t"] for i in last3["invocations"]] == [i["t"] for i in whole["invocations"][-3:]]


class _GatedEmbedder(HashingEmbedder):
    """Blocks in embed_documents, once armed, until released: the view is mid-work while /health is asked."""

    def __init__(self) -> None:
        super().__init__(dim=64)
        self.armed, self.entered, self.release = False, threading.Event(), threading.Event()

    def embed_documents(self, texts):
        if self.armed:
            self.entered.set()
            self.release.wait(60)
        return super().embed_documents(texts)


def test_the_service_view_of_a_10000_message_session_is_bounded_and_off_the_event_loop(tmp_path, monkeypatch):
    from contextrender.view import DEFAULT_VIEW_INVOCATIONS, MAX_VIEW_INVOCATIONS

    emb = _GatedEmbedder()
    svc = ContextService(str(tmp_path / "g.sqlite"), embedder=emb, default_budget=4000, warm=False)
    msgs = _long_session(5000)
    try:
        with serve(create_app(service=svc)) as url, httpx.Client(base_url=url, timeout=120) as c:
            for k in range(0, len(msgs), 2000):  # built through the real API, like any client would
                assert c.post("/sessions/big/messages", json=msgs[k:k + 2000]).status_code == 200
            emb.armed = True
            box: dict = {}
            viewer = threading.Thread(target=lambda: box.setdefault("r", c.get("/sessions/big/view?methods=contextrender,prune")))
            viewer.start()
            assert emb.entered.wait(60), "the view never embedded"
            health = httpx.get(f"{url}/health", timeout=10)  # while the view's replay is blocked mid-way
            assert health.status_code == 200 and "r" not in box
            emb.armed = False
            emb.release.set()
            viewer.join(120)
            r = box["r"]
            assert r.status_code == 200
            _page, data = _parse(r.text)
            assert len(data["invocations"]) == DEFAULT_VIEW_INVOCATIONS and data["window"]["invocations"] == 5001
            transcript = len(json.dumps(msgs))
            assert len(r.content) < transcript / 4  # the page grows with the window, not the session
            # Limits: a window too wide is 422, a page too large 413; both JSON, naming how to narrow them.
            r = c.get(f"/sessions/big/view?from=0&to={MAX_VIEW_INVOCATIONS + 50}")
            assert r.status_code == 422 and r.headers["content-type"].startswith("application/json")
            assert f"at most {MAX_VIEW_INVOCATIONS}" in r.json()["detail"] and "from/to or last" in r.json()["detail"]
            for q in ("from=6000", "last=0", "from=9&to=3", "from=1&last=2", "to=-1"):
                r = c.get(f"/sessions/big/view?{q}")
                assert r.status_code == 422 and isinstance(r.json()["detail"], str), q
            assert c.get("/sessions/big/view?last=3").status_code == 200
            monkeypatch.setattr("contextrender.view.MAX_VIEW_BYTES", 50_000)
            r = c.get("/sessions/big/view?last=40")
            assert r.status_code == 413 and "50000-byte limit" in r.json()["detail"]
            assert "from/to or last" in r.json()["detail"]
    finally:
        emb.release.set()
        svc.close()


def test_cli_view_takes_a_window(tmp_path, capsys):
    from contextrender.cli import main

    graph = tmp_path / "g.sqlite"
    with ContextGraph(graph) as g:
        g.session("long").extend(_long_session(300))
    out = tmp_path / "v.html"
    base = ["view", "long", "--graph", str(graph), "--budget", "3000", "--methods", "prune", "--embedding",
            "hashing", "--out", str(out)]
    assert main([*base, "--last", "4"]) == 0
    assert [i["t"] for i in _parse(out.read_text(encoding="utf-8"))[1]["invocations"]] == [297, 298, 299, 300]
    assert main([*base, "--from", "10", "--to", "12"]) == 0
    assert [i["t"] for i in _parse(out.read_text(encoding="utf-8"))[1]["invocations"]] == [10, 11, 12]
    assert main([*base, "--from", "0", "--to", "299"]) == 2
    assert "at most 200" in capsys.readouterr().err
