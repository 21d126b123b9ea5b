"""The expand tool is offered per request, not per session: a request that does not carry the tool (an assistant
prefill, ``wrap(expand=False)``, Anthropic's stream helper) renders as if it had never been offered, even in a
session where earlier requests offered it — no handles in its markers, nothing held back as one expansion away."""

from __future__ import annotations

import json
from typing import Any

from contextrender import HashingEmbedder
from contextrender.expand import MARKER_HANDLE
from contextrender.graph import OMISSION_MARKER
from contextrender.service.sessions import ContextService

B = 600


def _history(n: int = 6) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Use the tools."},
                                  {"role": "user", "content": "Look the records up."}]
    for k in range(n):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{k}", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"k": k})}}]})
        notes = [f"The registry keeps entry {i} of record {k} under review until the audit closes." for i in range(12)]
        msgs.append({"role": "tool", "tool_call_id": f"c{k}",
                     "content": json.dumps({"record_id": f"REC_{k}_ALPHA", "notes": notes})})
    return msgs


def _shortened(messages: Any) -> tuple[int, int]:
    """(tool messages that are markers or shortened forms, those of them naming a handle)."""
    texts = [m.get("content") or "" for m in messages if m.get("role") == "tool"]
    short = [t for t in texts if t.startswith(OMISSION_MARKER[:-1])]
    return len(short), sum(bool(MARKER_HANDLE.search(t)) for t in short)


def _any_handle(messages: Any) -> bool:
    return any(MARKER_HANDLE.search(m.get("content") or "") for m in messages if isinstance(m.get("content"), str))


def test_a_request_without_the_tool_gets_no_handles_in_an_offered_session(tmp_path):
    svc = ContextService(str(tmp_path / "g.sqlite"), embedder=HashingEmbedder(dim=256), default_budget=B)
    try:
        msgs = _history()
        offered = svc.render("s", messages=msgs, budget=B, method="contextrender_plus", offer_expand=True)
        short, handled = _shortened(offered.messages)
        assert offered.expand and short > 0 and handled == short
        plain = svc.render("s", messages=msgs, budget=B, method="contextrender_plus", offer_expand=False)
        short, handled = _shortened(plain.messages)
        assert not plain.expand and short > 0 and handled == 0
        assert not _any_handle(plain.messages)  # not in id forms' headers either
        again = svc.render("s", messages=msgs, budget=B, method="contextrender_plus", offer_expand=True)
        assert _shortened(again.messages)[1] > 0  # offered again: the session's handles come back
    finally:
        svc.close()


def test_requests_with_and_without_the_tool_interleaved_never_mix_their_markers(tmp_path):
    """A session whose requests alternate (a Messages prefill between ordinary turns, a stream helper beside create):
    each render continues the last render of its own kind, so a request without the tool never carries a handle
    and one with it never holds a result back without one (the cache-aware render's appended and late paths)."""
    svc = ContextService(str(tmp_path / "g.sqlite"), embedder=HashingEmbedder(dim=256), default_budget=B)
    try:
        msgs = _history(10)
        checked = 0
        for k, n in enumerate(range(6, len(msgs) + 1, 2)):  # one more call and result each time, the kind alternating
            offer = k % 2 == 0
            r = svc.render("s", messages=msgs[:n], budget=B, method="contextrender_plus", offer_expand=offer)
            short, handled = _shortened(r.messages)
            assert handled == (short if offer else 0), (n, offer, short, handled)
            assert offer or not _any_handle(r.messages), n
            checked += short
        assert checked > 10
    finally:
        svc.close()
