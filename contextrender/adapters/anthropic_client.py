"""``contextrender.wrap`` for Anthropic clients (``anthropic.Anthropic``, ``AsyncAnthropic``).

    client = contextrender.wrap(anthropic.Anthropic(), budget=6000)
    client.messages.create(model=..., max_tokens=..., system=..., messages=messages, tools=tools)  # as before

What the proxy's ``POST /v1/messages`` does, without the HTTP hop
(:mod:`contextrender.service.anthropic_messages`): each ``messages.create`` and ``messages.stream``
converts ``system`` and ``messages`` to the OpenAI-format history the graph stores, syncs and renders
it under B like a chat completion, sends the render as the caller's own Messages API messages (kept
messages and blocks untouched, so ``cache_control`` and thinking blocks go as given; tool pairs kept
together) with every other argument unchanged, and records the answer. A stream (``stream=True``, or
the ``messages.stream(...)`` helper, whose events, text stream and final message are the SDK's own)
is recorded once the answer has its ``stop_reason``, before the event that says so reaches the caller.
Each answer's ``usage`` as billed (``message_start`` and ``message_delta`` for a stream, read once the stream
has ended) is recorded too: ``client.contextrender.last.usage`` and ``client.contextrender.usage()``. With a method
whose markers carry handles (``contextrender_plus``), ``messages.create`` offers the ``contextrender_expand`` tool and
answers it in the wrapper's bounded loop (:class:`~contextrender.wrapper._Expanding`; docs/service.md, "The expand
tool"); the ``messages.stream`` helper does not.

Everything else on the client (``messages.count_tokens``, ``messages.batches``, ``beta``,
``with_raw_response`` views, ``models``…) is the wrapped client's own, not rendered.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from contextrender.billing import PromptUsage
from contextrender.events import MessageError
from contextrender.service import anthropic_messages
from contextrender.service.errors import InvalidMessages
from contextrender.service.results import RenderResult
from contextrender.service.streams import AnthropicStreamAssembler
from contextrender.wrapper import (
    AsyncRecordingStream,
    ContextRenderState,
    ExpandingCall,
    LastRender,
    RecordingStream,
    WrappedClient,
    _Expanding,
    _is_async,
    _plain,
    _Recorder,
    usage_object,
)

log = logging.getLogger(__name__)


def is_anthropic_client(client: Any) -> bool:
    """Whether ``client`` is an Anthropic one: ``messages.create`` and no ``chat.completions``."""
    return (callable(getattr(getattr(client, "messages", None), "create", None))
            and not hasattr(getattr(client, "chat", None), "completions"))


def _plain_message(m: Any) -> Any:
    """A message as a dict whose content blocks are dicts (the SDK's answer blocks dumped as the SDK sends
    them); the caller's own object when it already is one."""
    m = _plain(m)
    content = m.get("content") if isinstance(m, dict) else None
    if not isinstance(content, list) or all(isinstance(b, dict) for b in content):
        return m
    return {**m, "content": [_plain(b) for b in content]}


def _system(system: Any) -> Any:
    """``system`` as :func:`~contextrender.service.anthropic_messages.to_openai` takes it (absent: None)."""
    if system is None or isinstance(system, str):
        return system
    if isinstance(system, (list, tuple)):
        return [_plain(b) for b in system]
    if type(system).__name__ in ("Omit", "NotGiven"):  # the SDK's "not given" sentinels
        return None
    return system  # refused, naming it, by the conversion


def prepare(state: ContextRenderState, system: Any, messages: Iterable[Any]) -> tuple[str, list[Any]]:
    """Sync and render a Messages API conversation; return (session id, the messages to send).

    Raises:
        MessageError: ``system`` or ``messages`` are not the Messages API's (nothing stored or sent).
    """
    res, sent = _prepare(state, system, messages)
    return res.session, sent


def _prepare(state: ContextRenderState, system: Any, messages: Iterable[Any], *, offer_expand: bool = False,
             budget: int | None = None) -> tuple[RenderResult, list[Any]]:
    """:func:`prepare`, returning the render; ``offer_expand``: this call answers the expand tool (the expand loop),
    ``budget``: the one to render at (default B)."""
    original = list(messages)
    plain = [_plain_message(m) for m in original]
    try:
        converted = anthropic_messages.to_openai(_system(system), plain)
    except InvalidMessages as e:
        raise MessageError(e.message) from None
    res = state.render(list(converted.messages), offer_expand=offer_expand, budget=budget)
    own = {id(p): m for p, m in zip(plain, original, strict=True)}
    sent = [own.get(id(m), m) for m in anthropic_messages.forwarded_messages(plain, converted, res)]
    state.remember(res, sent)
    return res, sent


def _ends_with_user(messages: list[Any]) -> bool:
    """Whether a Messages API request ends with the user's turn (an assistant prefill is continued by the model,
    not answered: no expand loop runs on it)."""
    last = _plain(messages[-1]) if messages else None
    return isinstance(last, Mapping) and last.get("role") == "user"


def _answer(out: Any) -> dict[str, Any] | None:
    """The OpenAI-format assistant message of a Messages API answer (an SDK ``Message`` or a dict)."""
    content = out.get("content") if isinstance(out, Mapping) else getattr(out, "content", None)
    if not isinstance(content, list):
        return None
    try:
        return anthropic_messages.assistant_message([_plain(b) for b in content])
    except InvalidMessages as e:
        log.warning("answer not recorded: %s", e.message)
        return None


def _recorder(state: ContextRenderState, sid: str, render: LastRender | None = None) -> _Recorder:
    return _Recorder(state, sid, AnthropicStreamAssembler, "messages", render)


def _record_usage(state: ContextRenderState, render: LastRender | None, out: Any) -> None:
    """A whole answer's usage (an SDK ``Message``'s or a dict's ``usage``) as billed, recorded for its call."""
    state.record_usage(render, "messages", anthropic_messages.prompt_usage(usage_object(out)), streamed=False)


def _record_through(stream: Any, recorder: _Recorder, asynchronous: bool) -> None:
    """Make the SDK's stream helper read its events through a recording stream (its events, text stream
    and final message stay the SDK's own)."""
    raw = getattr(stream, "_raw_stream", None)
    if raw is None:
        log.warning("session %s: this SDK's stream helper has no raw stream to read; the answer is not recorded "
                    "(the next call's history carries it)", recorder.sid)
        return
    stream._raw_stream = AsyncRecordingStream(raw, recorder) if asynchronous else RecordingStream(raw, recorder)


class _StreamManager:
    """``messages.stream(...)`` of a sync client: the SDK's manager over the rendered messages."""

    def __init__(self, inner: Any, recorder: _Recorder) -> None:
        self._inner = inner
        self._recorder = recorder

    def __enter__(self) -> Any:
        stream = self._inner.__enter__()
        _record_through(stream, self._recorder, asynchronous=False)
        return stream

    def __exit__(self, *exc: Any) -> Any:
        return self._inner.__exit__(*exc)


class _AsyncStreamManager:
    """``messages.stream(...)`` of an async client: renders (off the event loop) when entered."""

    def __init__(self, state: ContextRenderState, stream: Any, args: tuple[Any, ...], messages: Iterable[Any],
                 kwargs: dict[str, Any]) -> None:
        self._state, self._stream, self._args, self._messages, self._kwargs = state, stream, args, messages, kwargs
        self._inner: Any = None

    async def __aenter__(self) -> Any:
        sid, sent = await asyncio.to_thread(prepare, self._state, self._kwargs.get("system"), self._messages)
        render = self._state.render_of(sid)
        self._inner = self._stream(*self._args, messages=sent, **self._kwargs)
        stream = await self._inner.__aenter__()
        _record_through(stream, _recorder(self._state, sid, render), asynchronous=True)
        return stream

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._inner.__aexit__(*exc) if self._inner is not None else None


class Messages:
    """``client.messages``: ``create`` and ``stream`` rendered, everything else the client's."""

    def __init__(self, inner: Any, state: ContextRenderState) -> None:
        self._inner = inner
        self._state = state

    def create(self, *args: Any, messages: Iterable[Any], **kwargs: Any) -> Any:
        """The client's ``messages.create`` with ``messages`` rendered under the budget; same arguments, same
        result (a stream comes back as a recording stream yielding the SDK's events).

        Raises:
            MessageError: ``system`` or ``messages`` are not the Messages API's (nothing stored or sent).
            GraphError: the wrapper is closed, or another writer holds the session.
        """
        fn = self._inner.create
        stream = bool(kwargs.get("stream"))
        history = list(messages)
        if _is_async(fn):
            return self._acreate(fn, args, history, kwargs, stream)
        res, sent = _prepare(self._state, kwargs.get("system"), history, offer_expand=self._offers(history, kwargs))
        loop = self._expand_loop(res, sent, kwargs)
        if loop is not None:
            return _Expanding(self._state, loop, fn, args, kwargs, self._expanding(loop, history, kwargs)).run()
        render = self._state.render_of(res.session)
        return self._finish(fn(*args, messages=sent, **kwargs), res.session, stream, render)

    async def _acreate(self, fn: Any, args: tuple[Any, ...], history: list[Any], kwargs: dict[str, Any],
                       stream: bool) -> Any:
        res, sent = await asyncio.to_thread(_prepare, self._state, kwargs.get("system"), history,
                                            offer_expand=self._offers(history, kwargs))
        loop = self._expand_loop(res, sent, kwargs)
        if loop is not None:
            return await _Expanding(self._state, loop, fn, args, kwargs,
                                    self._expanding(loop, history, kwargs)).arun()
        render = self._state.render_of(res.session)
        out = fn(*args, messages=sent, **kwargs)
        if inspect.isawaitable(out):
            out = await out
        return await self._afinish(out, res.session, stream, render)

    async def _afinish(self, out: Any, sid: str, stream: bool, render: LastRender | None) -> Any:
        if stream:
            return self._finish(out, sid, stream, render)  # wrapping a stream does no I/O
        msg = _answer(out)
        if msg is not None:
            await asyncio.to_thread(self._state.record, sid, msg)
        await asyncio.to_thread(_record_usage, self._state, render, out)
        return out

    # -- the expand tool (docs/service.md, "The expand tool") -----------------------------

    def _offers(self, history: list[Any], kwargs: Mapping[str, Any]) -> bool:
        """Whether this call may offer the expand tool: ``wrap(expand=True)``, ``tools`` a list or not given, and
        the request ends with the user's turn."""
        return self._state.offers_expand(kwargs) and _ends_with_user(history)

    def _expand_loop(self, res: RenderResult, sent: list[Any], kwargs: Mapping[str, Any]) -> Any:
        if not _ends_with_user(sent):
            return None
        return self._state.expand_loop(res, anthropic_messages.WIRE, sent, kwargs)

    def _expanding(self, loop: Any, history: list[Any], kwargs: Mapping[str, Any]) -> ExpandingCall:
        """The Messages API side of the expand loop (:class:`~contextrender.wrapper.ExpandingCall`)."""
        stream, sid, state = bool(kwargs.get("stream")), loop.res.session, self._state

        def whole(out: Any) -> tuple[dict[str, Any] | None, Any, PromptUsage | None]:
            return _answer(out), anthropic_messages.answer_content(_plain(out)), \
                anthropic_messages.prompt_usage(usage_object(out))

        def rerender(budget: int) -> tuple[RenderResult, list[Any]]:
            res, sent = _prepare(state, kwargs.get("system"), history, offer_expand=True, budget=budget)
            return res, sent

        return ExpandingCall(
            streaming=lambda out: stream, whole=whole, assembler=AnthropicStreamAssembler,
            finish=lambda out, render: self._finish(out, sid, stream, render),
            afinish=lambda out, render: self._afinish(out, sid, stream, render),
            rerender=rerender, api="messages", stream=stream)

    def _finish(self, out: Any, sid: str, stream: bool, render: LastRender | None) -> Any:
        if stream and hasattr(out, "__aiter__"):
            return AsyncRecordingStream(out, _recorder(self._state, sid, render))
        if stream and hasattr(out, "__iter__"):
            return RecordingStream(out, _recorder(self._state, sid, render))
        msg = _answer(out)
        if msg is not None:
            self._state.record(sid, msg)
        _record_usage(self._state, render, out)
        return out

    def stream(self, *args: Any, messages: Iterable[Any], **kwargs: Any) -> Any:
        """The client's ``messages.stream`` helper over the rendered messages; the answer is recorded as it
        completes. Sync: rendered now; async: when the manager is entered."""
        fn = self._inner.stream
        if _is_async(self._inner.create):  # an async client: its stream helper is entered with ``async with``
            return _AsyncStreamManager(self._state, fn, args, list(messages), kwargs)
        sid, sent = prepare(self._state, kwargs.get("system"), messages)
        return _StreamManager(fn(*args, messages=sent, **kwargs), _recorder(self._state, sid))  # render: just taken

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class AnthropicWrappedClient(WrappedClient):
    """An Anthropic client whose ``messages.create`` and ``messages.stream`` render the history
    (:func:`contextrender.wrap`); ``contextrender`` and closing as :class:`~contextrender.wrapper.WrappedClient`."""

    def __init__(self, client: Any, state: ContextRenderState) -> None:
        super().__init__(client, state)
        self._messages: Messages | None = None

    @property
    def messages(self) -> Messages:
        if self._messages is None:
            self._messages = Messages(self._client.messages, self.contextrender)
        return self._messages

    def __dir__(self) -> list[str]:
        return sorted(set(dir(self._client)) | {"messages", "contextrender", "wrapped"})


__all__ = ["AnthropicWrappedClient", "Messages", "is_anthropic_client", "prepare"]
