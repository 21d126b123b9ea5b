"""Recorded agent traces: our JSONL, and the result files other harnesses write.

An :class:`Episode` is one agent transcript as OpenAI chat messages — what a
Full-history run saw and emitted; docs/method.md §7 computes Later-Used Result Recall on
such transcripts. Four file formats are read (:data:`FORMATS`):

``contextrender``
    Our JSONL: one ``{"task_id": str, "messages": [OpenAI messages]}`` per line
    (the runner's trace files, ``contextrender export``). Messages are kept as
    recorded; tool-call argument strings stay exactly as the model emitted them.
    The runner's lines also carry the record ``key``; of several valid lines of
    one job and task (a rerun with another config hash), only the last is
    replayed and the earlier ones are excluded (:data:`SUPERSEDED`, still
    validated), as the tables count only the latest record.
``tau2``
    τ²-bench ``Results`` JSON, what ``tau2 run`` writes (``{"timestamp", "info",
    "tasks", "simulations": [{"task_id", "trial", "messages", ...}]}``), read as
    the AGENT saw it: tau2's own rule (``tau2.agent.base.is_valid_agent_history_message``)
    keeps assistant messages, user messages without tool calls and tool
    messages with ``requestor == "assistant"``; the user simulator's own tool
    calls and their results (telecom's phone tools, ``requestor: "user"``) are
    dropped. tau2 stores tool-call arguments parsed (a dict); they become the
    string tau2 itself sends back to the agent's model on every later call,
    ``json.dumps(arguments)`` (``tau2.utils.llm_utils.to_litellm_messages``:
    keys in recorded order, ``", "``/``": "`` separators, ASCII escapes) — the
    model's raw string is not in the file. Tool messages answer ``id``. The
    system prompt is not in the file: when ``info.agent_info.implementation``
    is ``llm_agent`` and tau2 is installed, it is rebuilt with tau2's own
    ``LLMAgent.system_prompt`` from ``info.environment_info.policy`` (exactly
    the text the agent saw); otherwise there is none. Which one applied is in
    the file's summary (``system_prompt``). The orchestrator's fixed greeting
    ("Hi! How can I help you today?") is the agent's first assistant message,
    as in its own history. Episode id: ``<task_id>/trial-<trial>``.
``taubench``
    τ-bench (v1) result files: a JSON list of ``{"task_id": int, "reward",
    "info", "traj": [OpenAI messages], "trial"}`` (``tau_bench/run.py``); the
    trajectory is kept whole (system wiki, user, assistant ``tool_calls``,
    tool messages with ``tool_call_id``). Episode id: ``<task_id>/trial-<trial>``.
``bfcl``
    BFCL multi-turn result files, the ``*_result.json`` JSONL that ``bfcl
    generate`` writes (one ``{"id", "result", "inference_log", ...}`` per line;
    ``bfcl_eval/model_handler/base_handler.py``, ``inference_multi_turn_FC``).
    Per turn, in order: the ``begin_of_turn_query`` messages; then per
    ``step_N`` the model response — a list of ``{name: arguments}`` calls
    becomes one assistant message with those tool calls (ids
    ``bfcl-<turn>-<step>-<k>``, generated since the file has none; string
    arguments kept raw, as the model emitted them; dict arguments JSON-dumped
    with ``ensure_ascii=False``, the project's canonical form), a string a text
    reply — and the ``tool`` outputs answering those calls in order.
    ``state_info`` snapshots, ``handler_log``, ``inference_input`` and
    ``reasoning_content`` (not sent back to the model) are dropped.
    Prompting-mode files (calls as text, results returned as user messages)
    are refused. Episode id: the entry id.

**Detection** is by content, never by file name (:func:`sniff`): the first
JSON value of the file decides — a list of objects with ``traj`` is
``taubench``; an object with ``simulations`` is ``tau2``; an object with
``task_id`` + ``messages`` is ``contextrender``, one with ``inference_log`` (or
``id`` + ``result``) is ``bfcl``. When it decides nothing (a bad first line),
the first later line that is such a record does; a file whose records only
resemble ours (``task_id`` or ``messages``, malformed) is ours, so its lines
are reported one by one; a document cut off mid-way is a broken file (an
error), not a stranger. ``format=`` forces a format.

**Errors** name the place: ``file:line`` for JSONL formats, and for JSON
documents the record's index, ``file: simulations[i]`` (tau2) or
``file: [i]`` (taubench), 0-based. With ``strict`` the first bad record
raises :class:`TraceError`; otherwise bad records are skipped and counted.
Records the source itself marks as not run — a tau2 simulation with
``skipped: true``, a τ-bench record with an empty ``traj`` and an ``error``,
a BFCL entry holding ``"Error during inference: ..."`` — are *excluded*:
counted with their reason, never an error.

**Many files**: :func:`open_traces` takes a file, a directory (every file in
it, recursively, sorted by path; hidden files skipped) or a glob. In a
directory or glob, a file that is not JSON or is JSON of no trace format
(tau2's ``*_results.json`` summaries, run records, BFCL score files) is
ignored and listed with the reason; a named file must be a trace file.
"""

from __future__ import annotations

import glob as globlib
import json
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from contextrender.events import Message, MessageError
from contextrender.experiments.records.jsonl import append_bytes
from contextrender.experiments.records.schema import parse_key
from contextrender.files import private_dir
from contextrender.trace_line import trace_line, trace_line_text

log = logging.getLogger(__name__)

#: Trace file formats (see the module docstring); ``auto`` = recognise by content.
FORMATS: tuple[str, ...] = ("contextrender", "tau2", "taubench", "bfcl")
AUTO = "auto"
#: JSONL formats (one record a line; errors name the line). The others are one JSON document.
JSONL_FORMATS = frozenset({"contextrender", "bfcl"})
#: How a summary names each format: a file's format, not the method that recorded it (an exported session of any
#: method is a ``contextrender`` line).
FORMAT_TITLES = {"contextrender": "trace lines (export, wrap, the harness)", "tau2": "τ²-bench results",
                 "taubench": "τ-bench results", "bfcl": "BFCL results"}


def format_title(fmt: str) -> str:
    """A format as a summary names it (:data:`FORMAT_TITLES`; an unknown one as itself)."""
    return FORMAT_TITLES.get(fmt, fmt)


class TraceError(ValueError):
    """A trace record is malformed; the message names the file, line (or record index) and problem."""


@dataclass(frozen=True)
class Episode:
    """One validated trace record. ``messages`` are OpenAI dicts (ours: the recorded ones, unchanged)."""

    task_id: str
    messages: tuple[dict[str, Any], ...]
    line: int  # 1-based line in a JSONL trace file (0 for records of a JSON document, or not from a file)
    where: str = ""  # the record's place, as errors name it: "file:line" or "file: simulations[i]"
    benchmark: str | None = None  # the benchmark the source records (our key, τ² domain, BFCL category)
    #: the tool definitions the agent was offered (Chat Completions shape), where the source records them: a replay
    #: bills every request with them, as the provider billed it (docs/method.md §14); () when it does not
    tools: tuple[dict[str, Any], ...] = ()

    @property
    def assistant_indices(self) -> tuple[int, ...]:
        """Transcript index of each assistant message; position j is invocation j."""
        return tuple(i for i, m in enumerate(self.messages) if m.get("role") == "assistant")


@dataclass(frozen=True)
class Excluded:
    """A record not replayed, not an error, counted with its reason: one its source marks as not run
    (an error sample), or a runner trace a later one of the same job and task supersedes."""

    reason: str


def validate_messages(messages: Any, where: str) -> list[Message]:
    """Validate a transcript; return the parsed messages or raise :class:`TraceError`.

    Beyond per-message format checks, every tool message must answer a tool
    call made by an earlier assistant message, since a result's invocation
    (and so every age in docs/method.md §4/§7) comes from the call that produced it.
    """
    if not isinstance(messages, list):
        raise TraceError(f"{where}: 'messages' must be a list, got {type(messages).__name__}")
    if not messages:
        raise TraceError(f"{where}: 'messages' is empty")
    parsed: list[Message] = []
    call_ids: set[str] = set()
    for i, raw in enumerate(messages):
        try:
            msg = Message.from_openai(raw, f"{where}: message {i}")
        except MessageError as e:
            raise TraceError(str(e)) from None
        if msg.role == "tool" and msg.tool_call_id not in call_ids:
            raise TraceError(f"{where}: message {i}: tool result for call id {msg.tool_call_id!r}, "
                             "which no earlier assistant message made")
        call_ids.update(c.id for c in msg.tool_calls)
        parsed.append(msg)
    return parsed


#: Why a runner trace line is not replayed when a later valid line holds the same job and task.
SUPERSEDED = "superseded by a later trace of the same job and task (the tables count the latest record too)"


def _job_task_of(obj: Any, episode: Episode) -> tuple[str, str] | None:
    """(job and task of a runner line's key, the episode's task id), or None for a line without a key."""
    parts = parse_key(obj.get("key")) if isinstance(obj, dict) else None
    return None if parts is None else (parts.job_task, episode.task_id)


def parse_episode(obj: Any, where: str, line: int = 0) -> Episode:
    """Validate one decoded line of our JSONL."""
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in ("task_id", "messages") if k not in obj]
    if missing:
        raise TraceError(f"{where}: missing key(s) {', '.join(missing)}")
    task_id = obj["task_id"]
    if not isinstance(task_id, str) or not task_id:
        raise TraceError(f"{where}: 'task_id' must be a non-empty string, got {task_id!r}")
    validate_messages(obj["messages"], where)
    tools = obj.get("tools", [])
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise TraceError(f"{where}: 'tools' must be a list of tool definitions (JSON objects), as the agent's "
                         "requests carried them; leave the key out when the trace has none")
    parts = parse_key(obj.get("key"))
    return Episode(task_id, tuple(obj["messages"]), line, where, parts.benchmark or None if parts else None,
                   tuple(tools))


def _episode(task_id: str, messages: list[dict[str, Any]], where: str, line: int = 0,
             benchmark: str | None = None) -> Episode:
    validate_messages(messages, where)
    return Episode(task_id, tuple(messages), line, where, benchmark)


def _trial_id(task_id: Any, trial: Any) -> str:
    return f"{task_id}/trial-{trial}" if trial is not None else str(task_id)


# -- τ² -------------------------------------------------------------------------------

def _tau2_llm_agent() -> Any:
    """tau2's ``LLMAgent`` class. Importing tau2 the first time logs through loguru (a missing .env,
    litellm's cache settings), which says nothing about the file being read: tau2's own messages are
    disabled during that import, and the caller's activation state is put back after it — exactly,
    so a caller who had disabled "tau2" (or everything) keeps it so. loguru has no public way to read
    that state: the restore uses its core's ``activation_list`` and ``enabled`` (loguru 0.7); where
    they are missing, "tau2" is simply enabled again. Sinks, levels and every other module's messages
    are not touched."""
    import sys

    if "tau2.agent.llm_agent" in sys.modules:
        return sys.modules["tau2.agent.llm_agent"].LLMAgent
    logger: Any = None
    try:
        from loguru import logger
    except ImportError:  # tau2 depends on loguru: without it, the import below fails on its own
        pass
    core: Any = getattr(logger, "_core", None)
    saved = None
    if core is not None and all(hasattr(core, a) for a in ("activation_list", "enabled", "lock")):
        with core.lock:
            saved = (list(core.activation_list), dict(core.enabled))
    if logger is not None:
        logger.disable("tau2")
    try:
        from tau2.agent.llm_agent import LLMAgent
    finally:
        if saved is not None:
            with core.lock:  # loguru itself replaces both objects whole when activation changes
                core.activation_list, core.enabled = saved
        elif logger is not None:
            logger.enable("tau2")
    return LLMAgent


def _tau2_system_prompt(info: Any) -> tuple[str | None, str]:
    """(the agent's system prompt or None, what was done): rebuilt only when it is certain."""
    info = info if isinstance(info, dict) else {}
    agent = (info.get("agent_info") or {}).get("implementation")
    policy = (info.get("environment_info") or {}).get("policy")
    if agent != "llm_agent":
        return None, f"none (agent {agent!r}: only llm_agent's prompt is rebuilt)"
    if not isinstance(policy, str) or not policy:
        return None, "none (the file's info holds no policy)"
    try:
        LLMAgent = _tau2_llm_agent()
    except ImportError as e:
        return None, f"none (tau2 is not installed: {e})"
    # tau2's own property, evaluated on the file's policy: the exact text LLMAgent put first.
    prompt = LLMAgent.system_prompt.fget(SimpleNamespace(domain_policy=policy))  # type: ignore[attr-defined]
    return prompt, "tau2 LLMAgent.system_prompt with the file's policy"


def _tau2_arguments(args: Any) -> str:
    # What tau2 sends back to the agent's model for its own earlier calls (llm_utils.to_litellm_messages).
    return args if isinstance(args, str) else json.dumps(args)


def tau2_messages(raw: Any, where: str, system: str | None = None) -> list[dict[str, Any]]:
    """A τ² simulation's ``messages`` as the agent saw them, as OpenAI dicts (see the module docstring)."""
    if not isinstance(raw, list):
        raise TraceError(f"{where}: 'messages' must be a list, got {type(raw).__name__}")
    flat: list[tuple[int, Any]] = []
    for k, m in enumerate(raw):
        if isinstance(m, dict) and m.get("role") == "tool" and isinstance(m.get("tool_messages"), list):
            flat.extend((k, t) for t in m["tool_messages"])  # a MultiToolMessage, if a writer kept one
        else:
            flat.append((k, m))
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    unnamed: list[str] = []  # generated ids of calls recorded without one, answered in order
    for k, m in flat:
        at = f"{where}: messages[{k}]"
        if not isinstance(m, dict):
            raise TraceError(f"{at}: expected an object, got {type(m).__name__}")
        role = m.get("role")
        if role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": m.get("content")}
            calls = m.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list):
                    raise TraceError(f"{at}: 'tool_calls' must be a list")
                out_calls = []
                for c, tc in enumerate(calls):
                    if not isinstance(tc, dict) or not isinstance(tc.get("name"), str):
                        raise TraceError(f"{at}: tool_calls[{c}] needs a string 'name'")
                    if "arguments" not in tc:
                        raise TraceError(f"{at}: tool_calls[{c}] has no 'arguments'")
                    cid = tc.get("id")
                    if not cid:
                        cid = f"tau2-{k}-{c}"
                        unnamed.append(cid)
                    out_calls.append({"id": cid, "type": "function",
                                      "function": {"name": tc["name"], "arguments": _tau2_arguments(tc["arguments"])}})
                if out_calls:
                    msg["tool_calls"] = out_calls
            out.append(msg)
        elif role == "user":
            if m.get("tool_calls") is not None:
                continue  # the user simulator acting on its own tools: the agent never sees it
            out.append({"role": "user", "content": m.get("content")})
        elif role == "tool":
            if m.get("requestor", "assistant") != "assistant":
                continue  # the result of a user-side tool call
            cid = m.get("id") or (unnamed.pop(0) if unnamed else "")
            if not cid:
                raise TraceError(f"{at}: a tool message without 'id' and no earlier call without one")
            out.append({"role": "tool", "tool_call_id": cid, "content": m.get("content") or ""})
        elif role == "system":
            continue  # never part of the agent's history (tau2 keeps the agent's prompt in its own state)
        else:
            raise TraceError(f"{at}: 'role' must be assistant, user, tool or system, got {role!r}")
    return out


def _tau2_simulation(sim: Any, where: str, system: str | None, benchmark: str | None) -> Episode | Excluded:
    if not isinstance(sim, dict):
        raise TraceError(f"{where}: expected a simulation object, got {type(sim).__name__}")
    task_id, trial = sim.get("task_id"), sim.get("trial")
    if not isinstance(task_id, (str, int)) or isinstance(task_id, bool) or task_id == "":
        raise TraceError(f"{where}: 'task_id' must be a non-empty string, got {task_id!r}")
    if sim.get("skipped") is True and not sim.get("messages"):
        return Excluded(f"skipped by tau2 ({sim.get('termination_reason', 'error')})")
    if "messages" not in sim:
        raise TraceError(f"{where}: missing key 'messages'")
    messages = tau2_messages(sim["messages"], where, system)
    if not any(m["role"] != "system" for m in messages):
        raise TraceError(f"{where}: no message the agent saw")
    return _episode(_trial_id(task_id, trial), messages, where, benchmark=benchmark)


# -- τ-bench v1 -----------------------------------------------------------------------

def _taubench_record(rec: Any, where: str) -> Episode | Excluded:
    if not isinstance(rec, dict):
        raise TraceError(f"{where}: expected a result object, got {type(rec).__name__}")
    missing = [k for k in ("task_id", "traj") if k not in rec]
    if missing:
        raise TraceError(f"{where}: missing key(s) {', '.join(missing)}")
    task_id = rec["task_id"]
    if not isinstance(task_id, (str, int)) or isinstance(task_id, bool) or task_id == "":
        raise TraceError(f"{where}: 'task_id' must be an integer or a non-empty string, got {task_id!r}")
    traj = rec["traj"]
    if traj == [] and isinstance(rec.get("info"), dict) and "error" in rec["info"]:
        return Excluded("the task raised (tau_bench/run.py records traj=[] and the error)")
    if not isinstance(traj, list):
        raise TraceError(f"{where}: 'traj' must be a list, got {type(traj).__name__}")
    return _episode(_trial_id(task_id, rec.get("trial")), traj, where)


# -- BFCL -----------------------------------------------------------------------------

def _bfcl_category(entry_id: str) -> str:
    return entry_id.split(":")[0].rsplit("_", 1)[0]  # multi_turn_base_12 -> multi_turn_base (bfcl_eval sort_key)


def bfcl_messages(log_: Any, where: str) -> list[dict[str, Any]]:
    """A BFCL ``inference_log`` as OpenAI messages (see the module docstring)."""
    if not isinstance(log_, list):
        raise TraceError(f"{where}: 'inference_log' must be a list, got {type(log_).__name__}")
    out: list[dict[str, Any]] = []
    turn = -1
    for e, entry in enumerate(log_):
        if isinstance(entry, list):
            continue  # state_info snapshots of the environment, before and after each turn
        if not isinstance(entry, dict) or "begin_of_turn_query" not in entry:
            raise TraceError(f"{where}: inference_log[{e}]: expected a turn object with 'begin_of_turn_query'")
        turn += 1
        query = entry["begin_of_turn_query"]
        if not isinstance(query, list):
            raise TraceError(f"{where}: inference_log[{e}].begin_of_turn_query must be a list")
        for q, m in enumerate(query):
            if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
                raise TraceError(f"{where}: inference_log[{e}].begin_of_turn_query[{q}]: expected a "
                                 "system/user/assistant message")
            out.append({"role": m["role"], "content": m.get("content")})
        steps = sorted((k for k in entry if k.startswith("step_")), key=lambda k: int(k[5:]) if k[5:].isdigit() else -1)
        for step in steps:
            at = f"{where}: inference_log[{e}].{step}"
            items = entry[step]
            if not isinstance(items, list):
                raise TraceError(f"{at} must be a list")
            pending: list[str] | None = []  # call ids awaiting their output; None after a text reply
            for it in items:
                role = it.get("role") if isinstance(it, dict) else None
                if role == "assistant":
                    content = it.get("content")
                    if isinstance(content, list):
                        calls = []
                        for k, c in enumerate(content):
                            if not isinstance(c, dict) or len(c) != 1:
                                raise TraceError(f"{at}: call {k} must be one {{name: arguments}} object")
                            (name, args), = c.items()
                            calls.append({"id": f"bfcl-{turn}-{step[5:]}-{k}", "type": "function", "function": {
                                "name": name,
                                "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}})
                        out.append({"role": "assistant", "content": None, "tool_calls": calls} if calls
                                   else {"role": "assistant", "content": ""})
                        pending = [str(c["id"]) for c in calls]
                    elif content is None or isinstance(content, str):
                        out.append({"role": "assistant", "content": content})
                        pending = None
                    else:
                        raise TraceError(f"{at}: the model response must be a list of calls or a string, "
                                         f"got {type(content).__name__}")
                elif role == "tool":
                    if pending is None:
                        raise TraceError(f"{at}: tool outputs after a text response: a prompting-mode result "
                                         "(calls written as text, results sent back as user messages); only "
                                         "function-calling (FC) result files can be replayed")
                    if not pending:
                        raise TraceError(f"{at}: more tool outputs than calls")
                    content = it.get("content")
                    out.append({"role": "tool", "tool_call_id": pending.pop(0),
                                "content": content if isinstance(content, str) else json.dumps(content)})
                elif role in ("handler_log", "inference_input", "state_info"):
                    continue
                else:
                    raise TraceError(f"{at}: unknown entry role {role!r}")
    return out


def _bfcl_record(obj: Any, where: str, line: int) -> Episode | Excluded:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    entry_id = obj.get("id")
    if not isinstance(entry_id, str) or not entry_id:
        raise TraceError(f"{where}: 'id' must be a non-empty string, got {entry_id!r}")
    if "inference_log" not in obj:
        result = obj.get("result")
        if isinstance(result, str) and result.startswith("Error during inference"):
            return Excluded("inference error recorded by BFCL")
        raise TraceError(f"{where}: no 'inference_log' (a single-turn category? only multi-turn result files "
                         "hold the tool outputs)")
    return _episode(entry_id, bfcl_messages(obj["inference_log"], where), where, line,
                    f"bfcl_{_bfcl_category(entry_id)}")


def _contextrender_record(obj: Any, where: str, line: int) -> Episode:
    return parse_episode(obj, where, line)


_LINE_PARSERS = {"contextrender": _contextrender_record, "bfcl": _bfcl_record}


# -- detection ------------------------------------------------------------------------

def classify_record(value: Any) -> str | None:
    """The format whose record (or document) ``value`` is, or None."""
    if isinstance(value, list):
        return "taubench" if value and isinstance(value[0], dict) and "traj" in value[0] else None
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("simulations"), list):
        return "tau2"
    if "task_id" in value and "messages" in value:
        return "contextrender"
    if "inference_log" in value or ("id" in value and "result" in value):
        return "bfcl"
    return None


@dataclass(frozen=True)
class Sniffed:
    """What a file's content says: its format, or (format None) why it is not a trace file."""

    format: str | None
    reason: str = ""
    broken: bool = False  # starts like JSON but nothing in it parses: a malformed trace file, not a stranger


def _keys(value: Any) -> str:
    if isinstance(value, dict):
        return "keys " + ", ".join(sorted(map(str, value))[:8])
    return type(value).__name__


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _looks_like_ours(value: Any) -> bool:
    """A record of our JSONL missing something (a bad line of ours, not another format)."""
    return isinstance(value, dict) and ("task_id" in value or "messages" in value) and "traj" not in value


def sniff(path: str | Path, max_lines: int = 1000) -> Sniffed:
    """Recognise a file's trace format by its content (module docstring: Detection).

    The first JSON value decides when it is a document or a record of a known
    format; otherwise the first of the next ``max_lines`` lines that is. A file
    whose records only resemble ours (``task_id`` or ``messages`` present,
    malformed) is ours, so its bad lines are reported line by line.
    """
    data = Path(path).read_bytes()
    text = data.decode("utf-8", "replace").lstrip("\ufeff")
    start = len(text) - len(text.lstrip())
    if start == len(text):
        return Sniffed(None, "empty")
    if text[start] not in "[{":
        return Sniffed(None, "not JSON")
    values: list[Any] = []
    first_error, spans_lines = "", False
    try:
        values.append(json.JSONDecoder().raw_decode(text, start)[0])
    except json.JSONDecodeError as e:
        first_error = (f"invalid JSON at line {e.lineno}, column {e.colno}: {e.msg} (a file cut off while it was "
                       "written?)")
        first_line = text[start:].split("\n", 1)[0]
        # One document spanning lines, cut or corrupt (unless a later line proves the file is JSONL).
        spans_lines = e.lineno > text[:start].count("\n") + 1 and not _parses(first_line)
    if values and classify_record(values[0]):
        return Sniffed(classify_record(values[0]))
    for n, line in enumerate(text.splitlines()):  # a JSONL file whose first record is bad: a later one decides
        if n >= max_lines:
            break
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(value, (dict, list)):
            continue  # a bare string or number on a line is no record
        values.append(value)
        if classify_record(value) in JSONL_FORMATS:
            return Sniffed(classify_record(value))
    if any(_looks_like_ours(v) for v in values):
        return Sniffed("contextrender")
    if values and not spans_lines:
        return Sniffed(None, f"JSON of no trace format ({_keys(values[0])})")
    return Sniffed(None, first_error, broken=True)


# -- reading one file -----------------------------------------------------------------

def shown_path(path: str | Path) -> str:
    """How a replay output names a file: relative to the working directory when the file is under it
    (so results written from a checkout name repository paths, not a home directory), else absolute."""
    p = Path(path).resolve()
    try:
        cwd = Path.cwd().resolve()
    except OSError:  # the working directory was removed
        return str(p)
    if cwd == Path(cwd.anchor):  # from the root, "relative" would hide nothing and read as a repo path
        return str(p)
    try:
        return p.relative_to(cwd).as_posix()
    except ValueError:
        return str(p)


@dataclass
class TraceReader:
    """Iterates one trace file's valid episodes.

    ``format`` None: recognised by content (:func:`sniff`). With ``strict`` the
    first bad record raises :class:`TraceError`; otherwise bad records are
    logged, skipped and counted in ``skipped`` (their errors in ``errors``).
    Records the source marks as not run are counted in ``excluded``. Blank
    lines are ignored and not counted. Counts are complete once iteration has
    finished. After :meth:`load`, passes yield the episodes it kept and read
    the file no more.
    """

    path: Path
    strict: bool = True
    format: str | None = None
    skipped: int = 0
    errors: list[str] = field(default_factory=list)
    episodes: int = 0
    excluded: Counter[str] = field(default_factory=Counter)
    notes: dict[str, Any] = field(default_factory=dict)  # e.g. the τ² system prompt rule that applied
    #: no "not replayed" warning after a pass (a validation pass before the replay, which warns itself)
    quiet: bool = False
    #: the episodes :meth:`load` read, which later passes yield instead of reading the file
    loaded: list[Episode] | None = field(default=None, init=False, repr=False)
    #: a JSONL file's non-blank lines, as the last complete pass counted them (None before one)
    lines: int | None = field(default=None, init=False, repr=False)
    #: the warnings the last pass gives when it ends, as ``log.warning`` arguments
    _said: list[tuple[Any, ...]] = field(default_factory=list, init=False, repr=False)
    #: the skips already warned of: a file read twice (validated, then replayed) warns of each once
    _warned: set[str] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        if self.format is not None and self.format not in FORMATS:
            raise ValueError(f"unknown trace format {self.format!r}; known: {', '.join(FORMATS)} (or {AUTO})")

    def resolve_format(self) -> str:
        """The file's format: the forced one, or recognised by content (TraceError if none fits)."""
        if self.format is None:
            s = sniff(self.path)
            if s.format is None:
                if s.broken:
                    raise TraceError(f"{self.path}: {s.reason}")
                raise TraceError(f"{self.path}: not a trace file of a known format ({s.reason}); known: "
                                 f"{', '.join(FORMATS)} (force one with --trace-format, or trace_format= in the Hydra replay)")
            self.format = s.format
        return self.format

    def __iter__(self) -> Iterator[Episode]:
        if self.loaded is not None:
            yield from self.loaded  # the counts and notes stay those of the pass that loaded them
        else:
            yield from self._read()
        if not self.quiet:
            for said in self._said:
                log.warning(*said)

    def load(self) -> list[Episode]:
        """Read and validate the whole file now and keep its episodes; later passes read the file no more.

        Raises as a pass does (with ``strict``, :class:`TraceError` at the first bad record). It warns of
        nothing it left out: the next pass, which yields the kept episodes, does. Every episode stays
        in memory while the reader does.
        """
        self.loaded = None
        self.loaded = list(self._read())
        return self.loaded

    def _read(self) -> Iterator[Episode]:
        """One pass over the file; its counts, notes and warnings start afresh."""
        self.skipped, self.errors, self.episodes, self.excluded, self._said = 0, [], 0, Counter(), []
        try:
            fmt = self.resolve_format()
        except TraceError as e:
            if self.strict:
                raise
            self._skip(e)
            return
        records = self._lines(fmt) if fmt in JSONL_FORMATS else self._document(fmt)
        for item in records:
            if isinstance(item, Excluded):
                self.excluded[item.reason] += 1
            else:
                self.episodes += 1
                yield item
        if self.excluded:
            self._said.append(("%s: %d record(s) not replayed: %s", self.path, sum(self.excluded.values()),
                               "; ".join(f"{n} {r}" for r, n in self.excluded.items())))

    def _skip(self, e: TraceError) -> None:
        self.skipped += 1
        self.errors.append(str(e))
        if str(e) not in self._warned:
            self._warned.add(str(e))
            log.warning("skipping %s", e)

    def _lines(self, fmt: str) -> Iterator[Episode | Excluded]:
        parse = _LINE_PARSERS[fmt]
        latest = self._latest_lines() if fmt == "contextrender" else {}
        configs: dict[str, list[str]] = {}  # job -> config hash of each replayed line
        newest: dict[str, str] = {}  # job -> config of its last line as first written (not a restored one)
        self.lines, lines = None, 0
        with open(self.path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                if not raw.strip():
                    continue
                lines += 1
                where = f"{self.path}:{lineno}"
                try:
                    obj = self._decode(raw, where)
                    episode = parse(obj, where, lineno)  # a superseded line is still validated
                    if latest and isinstance(episode, Episode) and (key := parse_key(obj.get("key"))) is not None:
                        if not obj.get("restored") or key.job not in newest:
                            newest[key.job] = key.config
                        if latest.get((key.job_task, episode.task_id), lineno) != lineno:
                            yield Excluded(SUPERSEDED)
                            continue
                        configs.setdefault(key.job, []).append(key.config)
                    yield episode
                except TraceError as e:
                    if self.strict:
                        raise
                    self._skip(e)
        self.lines = lines
        self._note_mixed_configs(configs, newest)

    def _note_mixed_configs(self, configs: dict[str, list[str]], newest: dict[str, str]) -> None:
        """Say when a runner trace file's replayed lines come from several configs of one job.

        A rerun under another config appends to the same file, and each task's latest line is the
        one replayed; a task the rerun has not reached (or that ended in an infrastructure error,
        which writes no trace) still replays its older config's line. Records say the same
        (``mixed_config_notes``, in the tables' notes). The newest config is that of the job's last line
        as first written: a line the runner wrote again from its graph (``"restored": true``) says
        nothing of when its config ran."""
        mixed = {job: Counter(hashes) for job, hashes in configs.items() if len(set(hashes)) > 1}
        if not mixed:
            self.notes.pop("mixed_configs", None)
            return
        self.notes["mixed_configs"] = {job: dict(c) for job, c in mixed.items()}
        for job, c in mixed.items():
            new = newest[job]
            self._said.append(("%s: job %s replays lines of %d configs: %d task(s) of the newest (%s), %d of "
                               "older ones its rerun has not reached (rerun the job to bring every task to one "
                               "config)", self.path, job, len(c), c[new], new[:10], sum(c.values()) - c[new]))

    def _latest_lines(self) -> dict[tuple[str, str], int]:
        """Runner trace lines: the last VALID line of each job and task (the key without its config
        hash, and the episode's task id).

        A job rerun with another config (a changed weight, model setting or embedding under the same
        method name) appends its traces to the same file; like the tables (``analysis.tables.dedupe``),
        replay takes the latest trace of each task, so no task is counted twice. A line that does not
        decode or validate supersedes nothing (the main pass reports it), so a broken rerun line never
        hides the good one before it."""
        latest: dict[tuple[str, str], int] = {}
        with open(self.path, "rb") as f:
            for lineno, raw in enumerate(f, start=1):
                if b'"key"' not in raw:
                    continue
                try:
                    obj = self._decode(raw, "")
                    episode = parse_episode(obj, "", lineno)
                except TraceError:
                    continue
                job_task = _job_task_of(obj, episode)
                if job_task is not None:
                    latest[job_task] = lineno
        return latest

    @staticmethod
    def _decode(raw: bytes, where: str) -> Any:
        try:
            text = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as e:
            raise TraceError(f"{where}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceError(f"{where}: invalid JSON at column {e.colno}: {e.msg}") from None

    def _document(self, fmt: str) -> Iterator[Episode | Excluded]:
        try:
            doc = self._load_document()
            records, parse = self._records(fmt, doc)
        except TraceError as e:  # the whole file is unreadable: one skipped record
            if self.strict:
                raise
            self._skip(e)
            return
        for where, rec in records:
            try:
                yield parse(rec, where)
            except TraceError as e:
                if self.strict:
                    raise
                self._skip(e)

    def _load_document(self) -> Any:
        try:
            text = self.path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise TraceError(f"{self.path}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
        try:
            return json.loads(text.lstrip("\ufeff"))
        except json.JSONDecodeError as e:
            hint = (f"; the file holds several JSON values (JSONL?), not the one document a {self.format} file is"
                    if e.msg == "Extra data" else "")
            raise TraceError(f"{self.path}:{e.lineno}: invalid JSON at column {e.colno}: {e.msg}{hint}") from None

    def _records(self, fmt: str, doc: Any) -> tuple[list[tuple[str, Any]], Any]:
        if fmt == "tau2":
            if not isinstance(doc, dict) or not isinstance(doc.get("simulations"), list):
                raise TraceError(f"{self.path}: not a τ² Results file (expected an object with a 'simulations' "
                                 f"list, got {_keys(doc)})")
            info = doc.get("info")
            domain = ((info or {}).get("environment_info") or {}).get("domain_name") if isinstance(info, dict) else None
            benchmark = f"tau2_{domain}" if isinstance(domain, str) and domain else None
            system, how = _tau2_system_prompt(info)
            self.notes.update({"system_prompt": how, "domain": domain})
            sims = [(f"{self.path}: simulations[{i}]", s) for i, s in enumerate(doc["simulations"])]
            return sims, lambda rec, where: _tau2_simulation(rec, where, system, benchmark)
        if not isinstance(doc, list):  # taubench
            raise TraceError(f"{self.path}: not a τ-bench result file (expected a JSON list, got {_keys(doc)})")
        return [(f"{self.path}: [{i}]", r) for i, r in enumerate(doc)], _taubench_record

    def summary(self) -> dict[str, Any]:
        """What this file gave (the replay output's ``sources.files`` entry)."""
        out: dict[str, Any] = {"path": shown_path(self.path), "format": self.format, "episodes": self.episodes,
                               "skipped": self.skipped}
        if self.excluded:
            out["excluded"] = dict(self.excluded)
        out.update(self.notes)
        return out


def read_traces(path: str | Path, strict: bool = True, format: str | None = None) -> TraceReader:
    """Validated episodes of one trace file (iterate the result); ``format`` None = by content.

    Errors name the line (``file:line: message i: problem``) or the record
    (``file: simulations[i]: ...``). With ``strict=False`` bad records are
    skipped and counted in ``.skipped``.
    """
    return TraceReader(Path(path), strict, format)


def count_lines(path: str | Path) -> int:
    """Non-blank lines in a trace file (a progress-bar total; bad lines included)."""
    with open(path, "rb") as f:
        return sum(1 for raw in f if raw.strip())


# -- many files -----------------------------------------------------------------------

_GLOB_CHARS = frozenset("*?[")


def _candidates(spec: str | Path) -> tuple[list[Path], bool]:
    """(files, named): the files ``spec`` names; ``named`` when it is one file named outright."""
    path = Path(spec).expanduser()
    if path.is_file():
        return [path], True
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file()
                 and not any(part.startswith(".") for part in p.relative_to(path).parts)]
        return sorted(files), False
    text = str(spec)
    if _GLOB_CHARS & set(text):
        out: list[Path] = []
        for match in sorted(globlib.glob(str(Path(text).expanduser()), recursive=True)):
            m = Path(match)
            out.extend([m] if m.is_file() else _candidates(m)[0] if m.is_dir() else [])
        if out:
            return sorted(dict.fromkeys(out)), False
        raise FileNotFoundError(f"{spec}: no file matches this pattern")
    raise FileNotFoundError(f"{spec}: no such trace file or directory")


@dataclass
class TraceSet:
    """The episodes of every trace file a path, directory or glob names, file after file."""

    readers: list[TraceReader]
    ignored: list[dict[str, str]] = field(default_factory=list)  # files seen but not trace files, with why

    def __iter__(self) -> Iterator[Episode]:
        for r in self.readers:
            yield from r

    @property
    def skipped(self) -> int:
        return sum(r.skipped for r in self.readers)

    @property
    def errors(self) -> list[str]:
        return [e for r in self.readers for e in r.errors]

    def load(self) -> None:
        """Read and validate every file now (:meth:`TraceReader.load`), so the replay reads none again.

        With ``strict`` a bad record fails here, before anything the replay needs is built.
        """
        for r in self.readers:
            r.load()

    def total_hint(self) -> int | None:
        """Records to expect (a progress-bar total): JSONL lines; None when a JSON document is among them."""
        if any(r.format not in JSONL_FORMATS for r in self.readers):
            return None
        return sum(r.lines if r.loaded is not None and r.lines is not None else count_lines(r.path)
                   for r in self.readers)

    def recorded_benchmarks(self) -> set[str | None]:
        """The benchmark each file's first record names (None: the file names none); reads one record a file
        (none of a loaded one)."""
        out: set[str | None] = set()
        for r in self.readers:
            if r.loaded is not None:
                out.add(r.loaded[0].benchmark if r.loaded else None)
                continue
            probe = TraceReader(r.path, strict=False, format=r.format, quiet=True)
            probe._warned = r._warned  # the probe's skips are the reader's own: each is warned of once
            out.add(next((e.benchmark for e in probe), None))
        return out

    def summary(self) -> dict[str, Any]:
        """``{"files": [per-file summary], "ignored": [{"path", "reason"}]}`` for the replay output."""
        return {"files": [r.summary() for r in self.readers], "ignored": list(self.ignored)}


def open_traces(spec: str | Path | Sequence[str | Path], format: str | None = None, strict: bool = True) -> TraceSet:
    """The trace files ``spec`` names: a file, a directory (recursively), a glob, or a list of those.

    ``format``: one of :data:`FORMATS` forces it (``None``/``"auto"``: by
    content). A named file must be a trace file (else :class:`TraceError`, or
    with ``strict=False`` a skipped file); in a directory or glob, files that
    are not JSON or are JSON of no trace format are ignored and listed in
    ``.ignored``. Raises :class:`FileNotFoundError` for a path or pattern that
    names nothing and :class:`ValueError` when no trace file remains.
    """
    fmt = None if format in (None, "", AUTO) else str(format)
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"unknown trace format {format!r}; known: {', '.join(FORMATS)} (or {AUTO})")
    specs = [spec] if isinstance(spec, (str, Path)) else list(spec)
    if not specs:
        raise ValueError("no trace path given")
    readers: list[TraceReader] = []
    ignored: list[dict[str, str]] = []
    seen: set[Path] = set()
    for s in specs:
        files, named = _candidates(s)
        for p in files:
            if p.resolve() in seen:
                continue
            seen.add(p.resolve())
            if named:
                if p.stat().st_size == 0 or not p.read_bytes().strip():
                    # Recall over zero events is undefined, not a result: an empty file is a mistake to report.
                    raise ValueError(f"{p}: the trace file is empty; there is nothing to replay")
                readers.append(TraceReader(p, strict, fmt))
                continue
            sniffed = sniff(p)
            if sniffed.format is None and not sniffed.broken:
                ignored.append({"path": shown_path(p), "reason": sniffed.reason})
                continue
            readers.append(TraceReader(p, strict, fmt))  # a broken one fails (or is skipped) when read
    if not readers:
        listing = "; ".join(f"{i['path']}: {i['reason']}" for i in ignored[:5]) or "no files"
        raise ValueError(f"{', '.join(map(str, specs))}: no trace file ({listing})")
    for i in ignored:
        log.info("not a trace file, ignored: %s (%s)", i["path"], i["reason"])
    return TraceSet(readers, ignored)


def write_trace(path: str | Path, task_id: str, messages: Sequence[dict[str, Any]]) -> None:
    """Append one episode as one line, validated first.

    The line goes out in a single ``write`` on an ``O_APPEND`` descriptor and
    is fsync-ed, so concurrent writers do not interleave within a line and a
    crash leaves at most a truncated last line (which ``strict=False`` skips).
    """
    msgs = list(messages)
    parse_episode(trace_line(task_id, msgs), f"trace for task {task_id!r}")
    line = trace_line_text(task_id, msgs, allow_nan=False) + "\n"
    private_dir(Path(path).parent)
    append_bytes(path, line.encode("utf-8"))  # created 0600: a trace is a complete transcript


__all__ = ["AUTO", "FORMATS", "Episode", "Excluded", "TraceError", "TraceReader", "TraceSet", "bfcl_messages",
           "classify_record", "count_lines", "open_traces", "parse_episode", "read_traces", "sniff",
           "tau2_messages", "validate_messages", "write_trace"]
