"""smolagents adapter: a Model wrapper whose input goes through ContextRender (docs/method.md §9).

smolagents rebuilds the model input from the agent's memory at every step
(system prompt, task, then per step: the model output, a ``tool-call``
message and a ``tool-response`` observation). :class:`ContextRenderModel`
wraps any smolagents ``Model``: before each ``generate`` / ``generate_stream``
it syncs that list into a ContextRender session and passes the inner model
the rendered history — the agent's own ``ChatMessage`` objects, with an
omitted observation's text replaced by its marker. Copy-paste example::

    # terminal: contextrender serve --port 8765 --embedding local
    from smolagents import ToolCallingAgent, LiteLLMModel, WebSearchTool
    from contextrender.adapters.smolagents import ContextRenderModel

    model = ContextRenderModel(LiteLLMModel(model_id="gpt-4.1"), url="http://127.0.0.1:8765",
                               budget=6000, method="contextrender_plus")
    agent = ToolCallingAgent(tools=[WebSearchTool()], model=model)
    agent.run("Find the release year of ...")
    print(model.last_render.tokens, model.last_render.session)

Graph mapping: a step's model output and its ``tool-call`` message form one
assistant message (tool calls parsed from smolagents' ``Calling tools:``
text, so ids and arguments are the real ones); the step's observation is the
tool result of its first call; an error observation without a call stays a
user message. Ages therefore count agent steps (docs/method.md §4). Without
``session_id`` the session key is derived from the system prompt and the
task; re-running a task forks (``key~N``) as soon as the runs differ.
Pass ``client=InProcessClient(ContextService(...))`` to skip HTTP.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from smolagents.models import ChatMessage, MessageRole, Model

from contextrender.adapters._common import derive_session_key
from contextrender.adapters.http_client import ContextRenderClient, RenderResult

_CALLING = "Calling tools:"


def _role(m: Any) -> str:
    role = m.get("role") if isinstance(m, dict) else getattr(m, "role", None)
    return str(getattr(role, "value", role))


def _text(m: Any) -> str:
    content = m.get("content") if isinstance(m, dict) else getattr(m, "content", None)
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")


def _parse_calls(text: str, fallback_id: str) -> list[dict[str, Any]]:
    """Tool calls from smolagents' ``"Calling tools:\\n[{...}]"`` text (a Python literal)."""
    calls: list[dict[str, Any]] = []
    body = text[len(_CALLING):].strip() if text.startswith(_CALLING) else text
    try:
        parsed = ast.literal_eval(body)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        parsed = None
    if isinstance(parsed, list):
        for k, tc in enumerate(parsed):
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict):
                continue
            args = fn.get("arguments")
            if not isinstance(args, str):
                args = json.dumps(args, ensure_ascii=False, sort_keys=False, default=str)
            calls.append({"id": str(tc.get("id") or f"{fallback_id}-{k}"), "type": "function",
                          "function": {"name": str(fn.get("name") or "tool"), "arguments": args}})
    if not calls:  # unparseable: one opaque call carrying the text
        calls.append({"id": fallback_id, "type": "function", "function": {"name": "tool", "arguments": body}})
    return calls


def smolagents_to_openai(messages: list[Any]) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """smolagents model input → (graph messages, source indices of each graph message)."""
    out: list[dict[str, Any]] = []
    origins: list[list[int]] = []
    pending: list[str] = []  # call ids of the latest tool-call message, awaiting its observation
    for i, m in enumerate(messages):
        role, text = _role(m), _text(m)
        if role == MessageRole.TOOL_CALL.value:
            calls = _parse_calls(text, f"smol-{i}")
            prev = out[-1] if out else None
            if prev is not None and prev["role"] == "assistant" and "tool_calls" not in prev and origins[-1] == [i - 1]:
                prev["tool_calls"] = calls  # the same step's model output: one assistant message
                origins[-1].append(i)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": calls})
                origins.append([i])
            pending = [c["id"] for c in calls]
            continue
        if role == MessageRole.TOOL_RESPONSE.value and pending:
            out.append({"role": "tool", "tool_call_id": pending[0], "content": text})
        elif role == MessageRole.ASSISTANT.value:
            out.append({"role": "assistant", "content": text})
        elif role == MessageRole.SYSTEM.value:
            out.append({"role": "system", "content": text})
        else:  # user, or an observation with no call (a parsing error)
            out.append({"role": "user", "content": text})
        origins.append([i])
        pending = []
    return out, origins


def _with_text(m: Any, text: str) -> Any:
    parts = [{"type": "text", "text": text}]
    if isinstance(m, dict):
        return {**m, "content": parts}
    return ChatMessage(role=m.role, content=parts, tool_calls=m.tool_calls)


def rendered_to_smolagents(messages: list[Any], graph_msgs: list[dict[str, Any]], origins: list[list[int]],
                           result: RenderResult) -> list[Any]:
    """The render as the agent's own messages; only changed bodies are rebuilt."""
    out: list[Any] = []
    for msg, seq in zip(result.messages, result.layout, strict=True):
        text = msg.get("content") or ""
        if seq is None:
            role = MessageRole.SYSTEM if msg.get("role") == "system" else MessageRole.USER
            out.append(ChatMessage(role=role, content=[{"type": "text", "text": text}]))
        elif (graph_msgs[seq].get("content") or "") != text and len(origins[seq]) == 1:
            out.append(_with_text(messages[origins[seq][0]], text))
        else:
            out.extend(messages[j] for j in origins[seq])
    return out


class ContextRenderModel(Model):
    """Wraps a smolagents ``Model``; every call sees the ContextRender rendering of its input."""

    def __init__(self, model: Model, client: Any = None, *, url: str | None = None, budget: int = 6000,
                 method: str = "contextrender", overrides: dict[str, Any] | None = None,
                 session_id: str | None = None) -> None:
        super().__init__(flatten_messages_as_text=getattr(model, "flatten_messages_as_text", False),
                         tool_name_key=getattr(model, "tool_name_key", "name"),
                         tool_arguments_key=getattr(model, "tool_arguments_key", "arguments"),
                         model_id=getattr(model, "model_id", None))
        self.model = model
        self.client = client if client is not None else ContextRenderClient(url)
        self.budget = budget
        self.method = method
        self.overrides = overrides
        self.session_id = session_id
        self.last_render: RenderResult | None = None

    def render(self, messages: list[Any]) -> list[Any]:
        """Sync ``messages`` (the agent's full input) and return the rendered list."""
        graph_msgs, origins = smolagents_to_openai(list(messages))
        key = self.session_id or derive_session_key(graph_msgs, prefix="smolagents")
        result = self.client.render(key, messages=graph_msgs, budget=self.budget, method=self.method,
                                    overrides=self.overrides, on_conflict="fork")
        self.last_render = result
        return rendered_to_smolagents(list(messages), graph_msgs, origins, result)

    def generate(self, messages: list[Any], stop_sequences: list[str] | None = None,
                 response_format: dict[str, str] | None = None, tools_to_call_from: list[Any] | None = None,
                 **kwargs: Any) -> ChatMessage:
        return self.model.generate(self.render(messages), stop_sequences=stop_sequences,
                                   response_format=response_format, tools_to_call_from=tools_to_call_from, **kwargs)

    def parse_tool_calls(self, message: ChatMessage) -> ChatMessage:
        return self.model.parse_tool_calls(message)

    @property
    def supports_stop_parameter(self) -> bool:
        return self.model.supports_stop_parameter

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes this wrapper lacks; generate_stream exists iff the inner model has it.
        inner = self.__dict__.get("model")
        if inner is None:
            raise AttributeError(name)
        attr = getattr(inner, name)
        if name == "generate_stream":
            def generate_stream(messages: list[Any], *args: Any, **kwargs: Any) -> Any:
                return attr(self.render(messages), *args, **kwargs)
            return generate_stream
        return attr


__all__ = ["ContextRenderModel", "rendered_to_smolagents", "smolagents_to_openai"]
