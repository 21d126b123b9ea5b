"""A ReAct agent for AppWorld, written for this project from AppWorld's published description.

AppWorld's ReAct agent (Trivedi et al., 2024) shows the model the task, the
supervisor's identity and the available apps, asks it to write one block of
Python per turn against ``apis.<app>.<api>(...)``, to read API docs through
the ``api_docs`` app before using an API, to get credentials from the
``supervisor`` app, and to finish with ``apis.supervisor.complete_task()``;
each block's printed output is the next observation. The prompt below is our
own wording of that description (AppWorld's prompt files are not used).

Mapping onto the harness:

* each turn's code is a call of the ``execute`` tool (argument ``code``); its
  execution output is that call's tool result — the unit ContextRender scores
  (docs/method.md §1). Models without tool calling may instead put the code in a fenced
  ``python`` block: it is executed the same way and its output is stored as a
  tool result of that turn (an orphan result in the graph); the provider then
  sees it as a user message ``Output: ...`` (:class:`ProviderView`);
* ``code`` may also be a list of strings, joined without separators (the
  offline oracle's references split code around copied values, see
  ``offline.py``; some models emit lists of lines);
* the history the model sees is whatever the active policy renders under B
  (``episode.step``) — exactly where AppWorld's agent trims its messages
  (its ``trimmed_messages``, docs/method.md §8);
* the loop ends when the world reports the task completed, when the model
  stops writing code (after one reminder), at ``max_steps``, or when the
  episode raises a step/cost limit; the caller evaluates in every case.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from contextrender.experiments.runtime.episode import Episode, EpisodeStop

SYSTEM_PROMPT = """\
You are an autonomous assistant who completes everyday tasks for your supervisor by operating the apps on \
their phone through Python code. You work in a loop: in each turn, think briefly about what to do next, \
then call the `execute` tool with a block of Python code. You then see everything the code printed (or the \
error traceback) and continue from there until the task is done.

The environment:
- Every app is reachable as `apis.<app_name>.<api_name>(...)` with keyword arguments. Variables, imports \
and functions you define persist from one code block to the next.
- Never guess an API or its parameters. Look them up first, as often as you need to: \
`apis.api_docs.show_app_descriptions()`, `apis.api_docs.show_api_descriptions(app_name=...)` and \
`apis.api_docs.show_api_doc(app_name=..., api_name=...)`.
- Your supervisor's profile, account passwords, addresses and payment cards come from the `supervisor` app, \
e.g. `apis.supervisor.show_account_passwords()`. Apps with accounts need an access token from their \
`login` API.
- Only printed output comes back to you, so print what you need, and only that. Results of search and \
list APIs are paginated (`page_index`, `page_limit`); loop over pages when you need everything.
- Decide on your own; nobody can answer questions. Change nothing beyond what the task asks for.
- When the task is done, call `apis.supervisor.complete_task()`. If the task asks a question, pass only \
the answer value, e.g. `apis.supervisor.complete_task(answer=3)`. If it cannot be done, call \
`apis.supervisor.complete_task(status="fail")`.

Write one code block per turn. If you cannot call tools, put the code in one ```python fenced block instead.\
"""

NUDGE = ("Your last message contained no code. Continue by calling the `execute` tool with Python code, "
         "or call apis.supervisor.complete_task() if the task is done.")

EXECUTE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "execute",
        "description": ("Run Python code in the task's persistent Python environment (the `apis` object is "
                        "predefined) and return everything it printed, or the error traceback."),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        },
    },
}

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


def task_message(info: dict[str, Any]) -> str:
    """The first user message: supervisor, apps, task (what AppWorld's agent is shown)."""
    sup = info["supervisor"]
    apps = "\n".join(f"- {name}: {text}" for name, text in info["app_descriptions"].items())
    return (f"My name is {sup['first_name']} {sup['last_name']}. My personal email is {sup['email']} and my "
            f"phone number is {sup['phone_number']}.\n\nApps you can use:\n{apps}\n\n"
            f"Task: {info['instruction']}")


def fenced_code(text: str | None) -> str | None:
    """Code from fenced blocks: the ``python``/``py`` ones if any, else all unlabeled ones."""
    if not text:
        return None
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    chosen = [b for lang, b in blocks if lang in ("python", "py", "python3")] or [b for lang, b in blocks if not lang]
    code = "\n\n".join(b.strip("\n") for b in chosen).strip()
    return code or None


def decode_code(arguments: Any) -> tuple[str | None, str | None]:
    """``(code, None)`` from an ``execute`` call's arguments, or ``(None, error text for the model)``."""
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError as e:
        return None, f"Execution failed. The tool arguments are not valid JSON ({e}); send {{\"code\": \"...\"}}."
    if not isinstance(args, dict) or "code" not in args:
        return None, 'Execution failed. The `execute` tool takes one argument: {"code": "<python code>"}.'
    code = args["code"]
    if isinstance(code, list) and all(isinstance(c, str) for c in code):
        code = "".join(code)
    if not isinstance(code, str):
        return None, "Execution failed. `code` must be a string of Python code."
    return code, None


class ProviderView:
    """Wraps the episode's model: orphan tool results (text-mode code) reach it as user messages.

    The graph, the policies and the budget all see the tool result; only the
    provider request changes role so that the transcript stays valid for APIs
    that require every tool message to answer a tool call. Everything else is
    forwarded to the wrapped model (e.g. the oracle's ``hidden_log``).
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Any:
        known: set[str] = set()
        out: list[dict[str, Any]] = []
        for m in messages:
            if m.get("role") == "assistant":
                known.update(tc.get("id") for tc in m.get("tool_calls") or [])
            if m.get("role") == "tool" and m.get("tool_call_id") not in known:
                out.append({"role": "user", "content": f"Output:\n```\n{m.get('content') or ''}\n```"})
            else:
                out.append(m)
        return self._inner.complete(out, tools)


@dataclass
class ReactLog:
    steps: int = 0  # model invocations made by this loop
    executions: int = 0  # code blocks executed in the world
    completed: bool = False  # the world reports the task completed
    status: str = "ok"
    stopped: str | None = None
    text_mode_turns: int = 0
    bad_calls: int = 0
    outputs_chars: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"steps": self.steps, "executions": self.executions, "completed": self.completed}
        if self.stopped:
            d["stopped"] = self.stopped
        if self.text_mode_turns:
            d["text_mode_turns"] = self.text_mode_turns
        if self.bad_calls:
            d["bad_calls"] = self.bad_calls
        return d


def run_react(episode: Episode, world: Any, info: dict[str, Any], max_steps: int = 50,
              system_prompt: str = SYSTEM_PROMPT, max_nudges: int = 1) -> ReactLog:
    """Play one task in an open world (a :class:`~.client.WorkerClient`); return what happened.

    Never evaluates; the caller does, whatever the status.
    """
    log = ReactLog()
    episode.add({"role": "system", "content": system_prompt})
    episode.add({"role": "user", "content": task_message(info)})
    tools = [EXECUTE_TOOL]
    inner = episode.model
    episode.model = ProviderView(inner)
    nudges = 0
    try:
        while not log.completed:
            if log.steps >= max_steps:
                log.status, log.stopped = "step_limit", f"AppWorld agent step limit {max_steps} reached"
                break
            message = episode.step(tools)
            log.steps += 1
            calls = message.get("tool_calls") or []
            if calls:
                nudges = 0
                for tc in calls:
                    fn = tc.get("function") or {}
                    if log.completed:
                        result = "Not executed: the task was already marked complete."
                    elif fn.get("name") != "execute":
                        log.bad_calls += 1
                        result = f"Execution failed. Unknown tool {fn.get('name')!r}; the only tool is `execute`."
                    else:
                        code, error = decode_code(fn.get("arguments"))
                        if code is None:
                            log.bad_calls += 1
                            result = error or ""
                        else:
                            result = _run(world, code, log)
                    episode.add({"role": "tool", "tool_call_id": tc["id"], "content": result})
                continue
            code = fenced_code(message.get("content"))
            if code is not None:
                nudges = 0
                log.text_mode_turns += 1
                result = _run(world, code, log)
                episode.add({"role": "tool", "tool_call_id": f"code-{episode.invocations}", "name": "execute",
                             "content": result})
                continue
            if nudges >= max_nudges:
                log.status, log.stopped = "no_code", "the model stopped writing code before completing the task"
                break
            nudges += 1
            episode.add({"role": "user", "content": NUDGE})
    except EpisodeStop as stop:
        log.status, log.stopped = stop.status, str(stop)
    finally:
        episode.model = inner
    return log


def _run(world: Any, code: str, log: ReactLog) -> str:
    reply = world.execute(code)
    log.executions += 1
    log.completed = log.completed or bool(reply.get("task_completed"))
    output = str(reply.get("output", ""))
    log.outputs_chars.append(len(output))
    return output
