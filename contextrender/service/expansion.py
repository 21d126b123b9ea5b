"""The expand tool inside the service: the bounded loop the proxy runs (docs/service.md, "The expand tool").

When a render's markers can carry handles (a method with the ``expand`` option, such as ``contextrender_plus``),
the proxy adds ``contextrender_expand`` to the tools the model sees, from the session's first request on. An answer that calls
it is not the client's: the service answers each call from the graph (:meth:`ContextService.expand`), appends the
round — the model's turn and the results — at the end of the request, so everything before it stays the bytes
the provider has cached, and asks the upstream again. Only an answer without expand calls reaches the client.

The loop is bounded. At most :data:`MAX_ROUNDS` rounds are answered; the calls of one more get a tool error
saying the cap is reached, and an upstream that still calls the tool gets :class:`Stop` (a 502 in the API's
error shape), not a hang. The rounds together add at most ``share`` × B tokens of history, and the request with
them stays within B: when the render and the rounds would exceed it, the history is rendered again at B minus
the rounds (a new prefix, once) before they are appended.

A call the model made beside an expand call in the same answer is neither run nor shown to the client: the round
sent back holds the expand calls only, and the model makes its own calls again, now with what it read back. The
client sees calls only in the final answer, so none runs twice.

This module knows the rounds as OpenAI-format messages and each API's wire pieces through a :class:`Wire` (each
defined in that API's own module); it knows nothing of HTTP. The proxy runs the loop over HTTP, ``wrap`` over the
wrapped client's own calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from contextrender import expand as expand_tool
from contextrender.service.results import RenderResult

if TYPE_CHECKING:  # the service needs the method registry: each API's wire module imports Wire without it
    from contextrender.service.sessions import ContextService

#: Rounds of expand calls answered per client request; one more gets the cap's error, then :class:`Stop`.
MAX_ROUNDS = 4
#: The response header saying how many expansions answered the request (absent when none).
EXPANSIONS_HEADER = "x-contextrender-expansions"
#: The response header saying how many times the rounds did not fit beside the render, so the history was rendered
#: again at B minus the rounds (a new prefix for the provider's cache; absent when none).
RERENDERS_HEADER = "x-contextrender-expand-rerenders"


class Stop(Exception):
    """The upstream kept calling the expand tool past the cap: the request ends with this message as an error."""


@dataclass(frozen=True)
class Wire:
    """One API's pieces of the loop (each defined in that API's own module).

    ``history``: the request field the rounds are appended to. ``tool``: the tool's definition in the API's
    shape; ``tool_name``: the name of a ``tools`` entry. ``whole``: a whole JSON answer's raw answer (its message,
    content blocks or output items); ``streamed``: the same from the API's stream assembler. ``round``: what one
    answered round appends (raw answer, per answered call id its text and whether it is an error).
    """

    history: str
    tool: Callable[[], dict[str, Any]]
    tool_name: Callable[[Any], str | None]
    whole: Callable[[Any], Any]
    streamed: Callable[[Any], Any]
    round: Callable[[Any, Mapping[str, tuple[str, bool]]], list[Any]]


def offers(res: RenderResult) -> bool:
    """Whether the request rendered as ``res`` gets the tool: its method's markers carry handles. From the session's
    first request on, so the tools — the front of the prompt a provider caches — never change mid-session (adding
    the tool when the history first exceeds B would re-write the whole cached prompt, tools and system prompt
    included, once per session)."""
    return res.expand


def with_tool(body: Mapping[str, Any], wire: Wire) -> dict[str, Any]:
    """``body`` with the tool added at the end of its ``tools`` (once)."""
    tools = list(body.get("tools") or [])
    if not any(wire.tool_name(t) == expand_tool.TOOL_NAME for t in tools):
        tools.append(wire.tool())
    return {**body, "tools": tools}


def _call_name(call: Any) -> str | None:
    fn = call.get("function") if isinstance(call, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    return name if isinstance(name, str) else None


def expand_calls(message: Mapping[str, Any] | None) -> list[tuple[str, Any]]:
    """(call id, arguments) of each expand call in an OpenAI-format assistant message, in order."""
    out = []
    for call in (message or {}).get("tool_calls") or []:
        if _call_name(call) == expand_tool.TOOL_NAME and isinstance(call.get("id"), str):
            out.append((call["id"], (call.get("function") or {}).get("arguments")))
    return out


@dataclass
class Loop:
    """One client request's expand rounds: answers each round's calls, keeps what they append, and says when the
    history must be rendered again to stay within B.

    ``fwd``: the body forwarded for the current render (without the tool); :meth:`body` is what goes upstream next.
    """

    service: ContextService
    res: RenderResult
    wire: Wire
    fwd: dict[str, Any]
    budget: int
    share: float = expand_tool.DEFAULT_SHARE
    max_rounds: int = MAX_ROUNDS
    rounds: int = 0
    expanded: int = 0  # expansions answered (errors not counted)
    added: int = 0  # history tokens the rounds add
    rerendered: int = 0  # times the history was rendered again to leave room for the rounds
    appended: list[Any] = field(default_factory=list)

    @property
    def cap(self) -> int:
        """The history tokens all rounds together may add."""
        return int(self.budget * self.share)

    def body(self) -> dict[str, Any]:
        """The request to send: the forwarded render, the tool, and the rounds so far at the end."""
        out = with_tool(self.fwd, self.wire)
        if self.appended:
            out[self.wire.history] = [*list(self.fwd.get(self.wire.history) or []), *self.appended]
        return out

    def answer(self, message: Mapping[str, Any], raw: Any) -> int | None:
        """Answer the expand calls of ``message`` (the upstream's answer in OpenAI format; ``raw`` as the API gave
        it) and append the round. Returns the budget to render the history again at when the render and the rounds
        would exceed B (the caller then sets :attr:`fwd` to that render's body), else None. Raises :class:`Stop`
        past the cap. Blocking (it reads and writes the graph): run it off the event loop."""
        calls = expand_calls(message)
        self.rounds += 1
        if self.rounds > self.max_rounds + 1:
            raise Stop(f"the upstream kept calling {expand_tool.TOOL_NAME} after {self.max_rounds} rounds were "
                       f"answered and the next was told the cap was reached; the request is ended here")
        sid = self.res.session
        asked = {"role": "assistant", "content": message.get("content"),
                 "tool_calls": [c for c in message.get("tool_calls") or [] if c.get("id") in dict(calls)]}
        spent = self.service.count_messages(sid, [asked])
        answers: dict[str, tuple[str, bool]] = {}
        for cid, arguments in calls:
            if self.rounds > self.max_rounds:
                text, error = (f"error: the cap of {self.max_rounds} expansion rounds per request is reached; "
                               "answer with what is shown"), True
            else:
                room = self.cap - self.added - spent
                try:
                    got = self.service.expand(sid, arguments, max_tokens=room, at=self.res.stored)
                except expand_tool.ExpandError as e:
                    text, error = f"error: {e}", True
                else:
                    text, error = got.text, False
                    self.expanded += 1
            answers[cid] = (text, error)
            spent += self.service.count_messages(sid, [{"role": "tool", "tool_call_id": cid, "content": text}])
        self.added += spent
        self.appended += self.wire.round(raw, answers)
        if self.res.tokens + self.added > self.budget:
            return max(1, self.budget - self.added)
        return None

    def rendered_again(self, res: RenderResult, fwd: dict[str, Any]) -> None:
        """The history was rendered again (at the budget :meth:`answer` asked for): the rounds follow it."""
        self.res, self.fwd = res, fwd
        self.rerendered += 1


__all__ = ["EXPANSIONS_HEADER", "MAX_ROUNDS", "RERENDERS_HEADER", "Loop", "Stop", "Wire", "expand_calls", "offers", "with_tool"]
