"""A code agent's search call, shared by the plus tests (one tool, ``python_interpreter``, runs every search)."""

from __future__ import annotations

import json
from typing import Any


def search_call(call_id: str, query: str) -> dict[str, Any]:
    """The assistant message that runs ``wikipedia_search(query=...)`` through the interpreter."""
    code = f"print(wikipedia_search(query='{query}'))"
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "python_interpreter",
                                                         "arguments": json.dumps({"code": code})}}]}
