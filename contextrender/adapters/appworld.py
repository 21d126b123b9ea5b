"""AppWorld ReAct adapter: ``trimmed_messages`` rendered by ContextRender (docs/method.md §8, §9).

AppWorld's ReAct agent (in its ``experiments`` code) keeps ``self.messages``
— the instruction prefix (prompt and demonstrations, ``num_instruction_messages``
of them, the last being the task), then alternating assistant turns (a code
block each) and user turns ``"Output:\\n```...```"`` carrying the execution
output — and sends ``self.trimmed_messages`` to the model. This mixin
overrides that property: it syncs ``self.messages`` into a ContextRender
session and returns the rendered history, in AppWorld's own message dicts.

Mapping (the paper: a tool result is "the execution output of one code block"):

- the instruction prefix before the task message is sent as system messages,
  so it is outside B like a system prompt (docs/method.md §1); the task message is the
  first user message (x in q_t);
- each later assistant message becomes an assistant message with one
  synthetic tool call ``execute`` (id ``appworld-<n>``); its text stays the
  content, so TFA scans the code as an operation;
- a user message starting with ``Output:`` right after an assistant turn
  becomes that call's tool result; other user messages stay user messages.

An omitted output comes back as a user message holding the omission marker.
No AppWorld import is needed; use it as the first base class::

    from contextrender.adapters.appworld import ContextRenderTrimMixin
    from <appworld experiments react module> import ReActAgent   # AppWorld's class

    class ContextRenderReActAgent(ContextRenderTrimMixin, ReActAgent):
        cr_url = "http://127.0.0.1:8765"   # `contextrender serve --port 8765`
        cr_budget = 6000
        cr_method = "contextrender"

Session ids: ``cr_session_id`` if set, else ``appworld-<task_id>`` when the
agent has ``self.world.task_id``, else a hash of the instruction prefix. A
re-run that diverges from a stored run continues in a fork (``id~N``).
"""

from __future__ import annotations

import copy
from typing import Any

from contextrender.adapters._common import derive_session_key
from contextrender.adapters.http_client import ContextRenderClient, RenderResult

OBSERVATION_PREFIX = "Output:"
TOOL_NAME = "execute"


def appworld_to_openai(messages: list[dict[str, Any]], num_instruction_messages: int | None = None,
                       observation_prefix: str = OBSERVATION_PREFIX) -> tuple[list[dict[str, Any]], list[str]]:
    """AppWorld ReAct messages → (graph messages, kind of each); one graph message per AppWorld message.

    The conversion looks only backwards, so a message converts the same way
    at every later call (the graph is append-only).
    """
    n_instr = num_instruction_messages
    if n_instr is None:  # no count: everything up to the first user message is the prefix
        first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"), 0)
        n_instr = first_user + 1
    out: list[dict[str, Any]] = []
    kinds: list[str] = []
    open_call: str | None = None
    n_calls = 0
    for i, m in enumerate(messages):
        role = m.get("role")
        content = m.get("content") or ""
        if not isinstance(content, str):
            content = str(content)
        if i < n_instr - 1:
            out.append({"role": "system", "content": content})
            kinds.append("prefix")
        elif i == n_instr - 1:
            out.append({"role": "user", "content": content})
            kinds.append("task")
        elif role == "assistant":
            call_id = f"appworld-{n_calls}"
            n_calls += 1
            out.append({"role": "assistant", "content": content,
                        "tool_calls": [{"id": call_id, "type": "function",
                                        "function": {"name": TOOL_NAME, "arguments": "{}"}}]})
            kinds.append("assistant")
            open_call = call_id
        elif role == "user" and open_call is not None and content.startswith(observation_prefix):
            out.append({"role": "tool", "tool_call_id": open_call, "content": content})
            kinds.append("output")
            open_call = None
        else:
            out.append({"role": role if role in ("system", "user") else "user", "content": content})
            kinds.append("user")
    return out, kinds


def rendered_to_appworld(messages: list[dict[str, Any]], result: RenderResult) -> list[dict[str, Any]]:
    """The rendered history as AppWorld message dicts (originals, with changed bodies replaced)."""
    out: list[dict[str, Any]] = []
    for msg, seq in zip(result.messages, result.layout, strict=True):
        text = msg.get("content") or ""
        if seq is None:
            out.append({"role": "user" if msg.get("role") == "tool" else msg.get("role", "user"), "content": text})
            continue
        orig = copy.deepcopy(messages[seq])
        if (orig.get("content") or "") != text:
            orig["content"] = text
        out.append(orig)
    return out


class ContextRenderTrimMixin:
    """Overrides ``trimmed_messages`` with a ContextRender render of ``self.messages``."""

    cr_url: str | None = None  # None: $CONTEXTRENDER_URL or http://127.0.0.1:8765
    cr_client: Any = None  # a ContextRenderClient / InProcessClient; built from cr_url if None
    cr_budget: int = 6000
    cr_method: str = "contextrender"
    cr_overrides: dict[str, Any] | None = None
    cr_session_id: str | None = None
    cr_observation_prefix: str = OBSERVATION_PREFIX
    cr_last_render: RenderResult | None = None

    def cr_session_key(self) -> str:
        if self.cr_session_id:
            return self.cr_session_id
        task_id = getattr(getattr(self, "world", None), "task_id", None)
        if task_id:
            return f"appworld-{task_id}"
        n = getattr(self, "num_instruction_messages", None) or 1
        return derive_session_key(list(getattr(self, "messages", []))[:n], prefix="appworld")

    def _cr_client(self) -> Any:
        if self.cr_client is None:
            self.cr_client = ContextRenderClient(self.cr_url)
        return self.cr_client

    @property
    def trimmed_messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = list(getattr(self, "messages", []))
        graph_msgs, _ = appworld_to_openai(messages, getattr(self, "num_instruction_messages", None),
                                           self.cr_observation_prefix)
        result = self._cr_client().render(self.cr_session_key(), messages=graph_msgs, budget=self.cr_budget,
                                          method=self.cr_method, overrides=self.cr_overrides, on_conflict="fork")
        self.cr_last_render = result
        return rendered_to_appworld(messages, result)


__all__ = ["ContextRenderTrimMixin", "appworld_to_openai", "rendered_to_appworld"]
