"""The paper's motivating example, live: what ContextRender renders under B, and why.

``python -m contextrender.experiments.studies.demo [--budget N] [--graph PATH] [--embedding local|hashing]``

Records the dinner-bill transcript (docs/method.md §3.1) into a persistent context graph
one message at a time, renders ContextRender before every invocation, and at
the final invocation prints every tool result's scores (age, reuse c_t,
relevance s_t, U_t, greedy pick) beside what Prune keeps under the same budget.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from contextrender import ContextGraph, ContextRender, make_embedder, offline
from contextrender.experiments.fixtures.scenarios import DINNER_BILL_BUDGET, DINNER_BILL_CONTACT_SEQ, dinner_bill
from contextrender.explain import explain_table
from contextrender.registry import build_policy, method_config
from contextrender.render import Scope


def _out(line: str = "") -> None:
    sys.stdout.write(line + "\n")


def _write_view(messages: list[dict], budget: int, embedder: object, path: Path) -> None:
    """The Figure 2 picture of this run: ContextRender beside Prune, opened on the contact search."""
    from contextrender.files import open_private
    from contextrender.view import browser, chromium, method_view, render_html

    data = method_view(messages, ["contextrender", "prune"], budget, session_id="dinner-bill", embedder=embedder)
    with open_private(path, "w") as f:
        f.write(render_html(data))
    _out(f"\nThe session's view (open in a browser): {path}")
    if chromium() is None:
        _out("(Chromium not installed: no PNG of the view; apt-get install -y chromium)")
        return
    png = path.with_suffix(".png")
    browser(path, fragment=f"t={len(data.invocations) - 1}&seq={DINNER_BILL_CONTACT_SEQ}&only=1", screenshot=png)
    _out(f"and a picture of it, on the contact search and the calls that reuse it: {png}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=int, default=DINNER_BILL_BUDGET, help="history budget B in tokens")
    ap.add_argument("--graph", type=Path, default=None, help="graph file (default: a temporary one)")
    ap.add_argument("--embedding", default="local", choices=["local", "hashing"])
    ap.add_argument("--view", type=Path, default=Path("results/view/dinner_bill.html"),
                    help="also write the session's HTML view here (contextrender view), and a PNG of it beside "
                         "it when Chromium is installed")
    args = ap.parse_args(argv)
    offline.enable()
    budget = args.budget
    graph_path = args.graph or Path(tempfile.mkdtemp(prefix="cr-demo-")) / "graph.sqlite"

    embedder = make_embedder(args.embedding)
    cr = ContextRender(embedder=embedder)
    prune = build_policy(method_config("prune"))
    messages = dinner_bill()
    with ContextGraph(graph_path) as graph:
        session = graph.session(f"dinner-bill-B{budget}")
        if len(session):
            _out(f"resuming the session stored in {graph_path}")
        _out(f"Dinner-bill transcript (docs/method.md §3.1), history budget B = {budget} tokens, graph {graph_path}\n")
        _out(f"{'t':>3} {'Tok(H_full)':>11} {'rendered':>8} {'results shown':>14}   last tool call")
        for i, msg in enumerate(messages):
            if i < len(session):
                continue
            if msg["role"] == "assistant":
                sel = cr.select(session, budget)
                n_res = len(Scope.of(session).history_results(session))
                call = (msg.get("tool_calls") or [{}])[0].get("function", {}).get("name", "(answer)")
                _out(f"{session.next_invocation:>3} {Scope.of(session).full_tokens(session):>11} "
                     f"{sel.rendered.tokens:>8} {len(sel.rendered.visible):>6} of {n_res:<6}   → {call}")
            session.add(msg)

        t = session.next_invocation
        sel = cr.select(session, budget)
        pr = prune.render(session, budget)
        _out(f"\nFinal invocation t = {t}: the request to Nancy. Tok(H_full) = "
             f"{Scope.of(session).full_tokens(session)}, B = {budget}.")
        _out("Why each tool result is or is not rendered (U = recency + reuse + relevance, docs/method.md §4; "
             "R = U − 0.5·D, docs/method.md §5):\n")
        _out(explain_table(sel, compare={"Prune": pr}, notes={DINNER_BILL_CONTACT_SEQ: "← contact search"}))
        _out("\nReuse edges into the contact search (Tool-Flow Analysis, docs/method.md §3):")
        for e in session.reuse_edges():
            if e.source == DINNER_BILL_CONTACT_SEQ:
                where = "text" if e.part < 0 else f"tool call {e.part}"
                _out(f"  message {e.op_seq} ({where}) reused {e.value!r}")
        kept = DINNER_BILL_CONTACT_SEQ in sel.rendered.visible
        _out(f"\nContextRender renders {sel.rendered.tokens} ≤ {budget} tokens and "
             f"{'KEEPS' if kept else 'drops'} the contact search (Nancy's address is in it); "
             f"Prune renders {pr.tokens} tokens and "
             f"{'keeps' if DINNER_BILL_CONTACT_SEQ in pr.visible else 'DROPS'} it.")
        messages_so_far = session.openai_messages()
    if args.view:
        _write_view(messages_so_far, budget, embedder, args.view)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
