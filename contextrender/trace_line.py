"""The replay trace line: one episode's transcript as one JSON object.

``{"task_id": str, "messages": [OpenAI messages]}``; the harness's lines also
carry the episode's record ``key`` (after ``task_id``), the tool definitions the
agent was offered (``tools``, Chat Completions shape, after ``messages``: a replay
bills each request with them, as the provider did) and, for a line written again
from the job's graph, ``"restored": true`` (last; the graph keeps no tool
definitions, so a restored line has none). Every writer of a
trace line builds it here — the runner, its restore, ``write_trace``,
``contextrender export`` and the service's export endpoint — so the line the
trace readers (``experiments/evaluation/traces.py``) parse has one shape.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def trace_line(task_id: str, messages: Sequence[dict[str, Any]], *, key: str | None = None,
               tools: Sequence[dict[str, Any]] | None = None, restored: bool = False) -> dict[str, Any]:
    """The line as an object: ``task_id``, then ``key`` when given, ``messages``, ``tools`` when given (and not
    empty), then ``restored`` when set.

    The order is the order the fields are written in, which readers do not rely on but diffs
    of trace files do.
    """
    line: dict[str, Any] = {"task_id": task_id}
    if key is not None:
        line["key"] = key
    line["messages"] = list(messages)
    if tools:
        line["tools"] = list(tools)
    if restored:
        line["restored"] = True
    return line


def trace_line_text(task_id: str, messages: Sequence[dict[str, Any]], *, key: str | None = None,
                    tools: Sequence[dict[str, Any]] | None = None, restored: bool = False,
                    allow_nan: bool = True) -> str:
    """:func:`trace_line` as its JSON text, without the newline; non-ASCII text stays as it is.

    ``allow_nan=False`` refuses a NaN or infinity (ValueError), which strict JSON readers reject.
    """
    return json.dumps(trace_line(task_id, messages, key=key, tools=tools, restored=restored), ensure_ascii=False,
                      allow_nan=allow_nan)


__all__ = ["trace_line", "trace_line_text"]
