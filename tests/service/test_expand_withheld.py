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
        assert not MARKER_HANDLE.search(json.dumps(plain.messages))
        again = svc.render("s", messages=msgs, budget=B, method="contextrender_plus", offer_expand=True)
        assert _shortened(again.messages)[1] > 0  # offered again: the session's handles come back
    finally:
        svc.close()
