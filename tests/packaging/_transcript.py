"""A small, deterministic agent transcript (OpenAI format) that overflows a few-hundred-token budget.

Each tool result carries an id that a later call reuses (a reuse event for
Later-Used Result Recall, docs/method.md §7) plus filler, so budgeted policies must drop
some results and replay has events to score.
"""

from __future__ import annotations

import json
from typing import Any

TASK = "Find the invoice for the roommate's rent and email the total to the landlord."


def agent_transcript(turns: int = 8, filler_words: int = 30) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful agent. Use the tools."},
                                  {"role": "user", "content": TASK}]
    prev_id: str | None = None
    for i in range(turns):
        args: dict[str, Any] = {"query": f"invoice page {i}"}
        if prev_id is not None:
            args["after"] = prev_id  # reuses a value from the previous result
        cid = f"call_{i:03d}"
        msgs.append({"role": "assistant", "content": f"Step {i}: searching.", "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": "search_invoices", "arguments": json.dumps(args)}}]})
        prev_id = f"INV_{7000 + 37 * i}"
        filler = " ".join(f"line{i}_{k} amount {k * 13 % 97}.00" for k in range(filler_words))
        msgs.append({"role": "tool", "tool_call_id": cid,
                     "content": f"id={prev_id} total={120 + i}.50 USD; {filler}"})
    # The last turn also reuses the first result's id: an older reuse event.
    msgs.append({"role": "assistant", "content": f"The total of {prev_id} (after INV_7000) is {120 + turns - 1}.50 USD."})
    msgs.append({"role": "user", "content": "Now email it to the landlord."})
    return msgs


def trace_lines() -> list[str]:
    """Two episodes of a replay trace file (``{"task_id", "messages"}`` per line)."""
    return [json.dumps({"task_id": "rent-a", "messages": agent_transcript(8)}),
            json.dumps({"task_id": "rent-b", "messages": agent_transcript(5, filler_words=20)})]
