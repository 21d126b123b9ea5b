"""AppWorld worker: one process, one world at a time, driven over JSON lines.

Run it with the AppWorld venv's interpreter, as a script (never ``-m``)::

    APPWORLD_ROOT=<root> .venv-appworld/bin/python experiments/benchmarks/appworld/worker.py

It imports only the standard library and ``appworld`` (which pins pydantic 1
and cannot share the main venv). :mod:`.client` spawns and drives it.

Protocol (version 1)
--------------------
UTF-8 JSON, one object per line. The worker owns the real stdout for the
protocol; anything AppWorld prints goes to stderr.

* On start the worker sends ``{"id": 0, "ok": true, "result": {"ready": true,
  "protocol": 1, "appworld_version": ..., "root": ..., "pid": ...}}``.
* Request: ``{"id": <int>, "op": <str>, "args": {...}}``. Requests are served
  one at a time, in order.
* Response: ``{"id": <same>, "ok": true, "result": {...}}`` or
  ``{"id": <same>, "ok": false, "error": {"type": ..., "message": ...,
  "traceback": ...}}``. A failed request leaves the worker usable.

Operations:

``task_ids {dataset, difficulty?}`` → ``{"task_ids": [...]}``
    ``appworld.load_task_ids`` on ``<root>/data/datasets/<dataset>.txt``.
``open {task_id, experiment_name?, max_interactions?, timeout_seconds?, random_seed?}``
    Opens ``appworld.AppWorld(task_id, ...)`` (closing any open world first).
    → ``{"task_id", "instruction", "supervisor": {first_name, last_name, email,
    phone_number}, "app_descriptions": {app: text}, "datetime", "difficulty",
    "scenario_id", "experiment_name"}``.
``execute {code}`` → ``{"output": str, "task_completed": bool}``
    ``world.execute(code)``: AppWorld's own safety guard, timeout and output.
``evaluate {}`` → ``{"success", "difficulty", "num_tests", "passes", "failures"}``
    ``world.evaluate()``, i.e. ``appworld.evaluator.evaluate_task``: the task's
    own ``ground_truth/evaluation.py`` against the start and end databases.
``close {keep_outputs?}`` → ``{"closed": bool}``
    Closes the world; its output folder under
    ``<root>/experiments/outputs/<experiment_name>`` is removed unless kept.
``build_offline {spec}`` → ``{"root", "task_ids"}``
    Builds a data root with AppWorld's own classes (see ``offline.py``):
    base DBs via ``ModelCollection`` + ``SQLModel.create_db``, API docs via
    ``ApiDocCollection.build().save()``, task folders via ``Task.save`` with
    DB changes relative to the base and ``GroundTruth`` (evaluation code,
    solution, test data, metadata). Run it in a fresh worker.
``ping {}`` → ``{"pong": true}``; ``shutdown {}`` → replies, then exits.

The world's clock is frozen by AppWorld (freezegun) while a world is open, so
the worker never times anything; the client does.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import traceback
from typing import Any

PROTOCOL_VERSION = 1

# Running as a script puts this folder first on sys.path; its modules (client,
# agent, ...) must never shadow anything AppWorld imports.
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or os.getcwd()) == _HERE:
    sys.path.pop(0)

# AppWorld's ground-truth writer shells out to ``ruff``: find the venv's own.
_BIN = os.path.dirname(sys.executable)
os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")


def _protocol_stream() -> Any:
    """Keep the real stdout for protocol lines; send everything else to stderr."""
    sys.stdout.flush()
    fd = os.dup(1)
    os.dup2(2, 1)
    return os.fdopen(fd, "w", encoding="utf-8", buffering=1)


class Worker:
    def __init__(self) -> None:
        import appworld  # noqa: F401  (heavy; done once, before "ready")

        self.world: Any = None
        self.experiment_name: str | None = None
        self.opened = 0

    # -- operations ----------------------------------------------------------------

    def op_ping(self) -> dict[str, Any]:
        return {"pong": True}

    def op_task_ids(self, dataset: str, difficulty: int | None = None) -> dict[str, Any]:
        from appworld import load_task_ids

        return {"task_ids": list(load_task_ids(dataset_name=dataset, difficulty=difficulty))}

    def op_open(self, task_id: str, experiment_name: str | None = None, max_interactions: int | None = None,
                timeout_seconds: int | None = None, random_seed: int | None = None) -> dict[str, Any]:
        from appworld import AppWorld
        from appworld.task import task_id_to_generator_id

        self.op_close()
        self.opened += 1
        name = experiment_name or f"contextrender-{os.getpid()}-{self.opened}"
        kwargs: dict[str, Any] = {"task_id": task_id, "experiment_name": name}
        if max_interactions is not None:
            kwargs["max_interactions"] = max_interactions
        if timeout_seconds is not None:
            kwargs["timeout_seconds"] = timeout_seconds
        if random_seed is not None:
            kwargs["random_seed"] = random_seed
        world = AppWorld(**kwargs)
        self.world, self.experiment_name = world, name
        task = world.task
        sup = task.supervisor
        gt = task.ground_truth
        return {
            "task_id": task_id,
            "instruction": task.instruction,
            "supervisor": {k: sup[k] for k in ("first_name", "last_name", "email", "phone_number")},
            "app_descriptions": dict(task.app_descriptions),
            "datetime": task.datetime.isoformat(),
            "difficulty": gt.metadata.get("difficulty") if gt is not None else None,
            "scenario_id": task_id_to_generator_id(task_id),
            "experiment_name": name,
        }

    def _world(self) -> Any:
        if self.world is None:
            raise RuntimeError("no world is open; send 'open' first")
        return self.world

    def op_execute(self, code: str) -> dict[str, Any]:
        world = self._world()
        output = world.execute(code)
        return {"output": output, "task_completed": bool(world.task_completed())}

    def op_evaluate(self) -> dict[str, Any]:
        tracker = self._world().evaluate(suppress_errors=True)
        d = tracker.to_dict(stats_only=False)
        return {
            "success": bool(d["success"]),
            "difficulty": d["difficulty"],
            "num_tests": d["num_tests"],
            "passes": [{"requirement": p["requirement"], "label": p.get("label")} for p in d["passes"]],
            "failures": [{"requirement": f["requirement"], "label": f.get("label"), "trace": f.get("trace", "")}
                         for f in d["failures"]],
        }

    def op_close(self, keep_outputs: bool = False) -> dict[str, Any]:
        if self.world is None:
            return {"closed": False}
        world, self.world = self.world, None
        try:
            world.close()
        finally:
            if not keep_outputs and self.experiment_name:
                shutil.rmtree(world.base_output_directory, ignore_errors=True)
            self.experiment_name = None
        return {"closed": True}

    def op_build_offline(self, spec: dict[str, Any]) -> dict[str, Any]:
        return build_offline(spec)

    # -- loop --------------------------------------------------------------------

    def handle(self, request: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        rid = request.get("id")
        op = request.get("op")
        args = request.get("args") or {}
        if op == "shutdown":
            self.op_close()
            return {"id": rid, "ok": True, "result": {"bye": True}}, True
        fn = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        if fn is None:
            return {"id": rid, "ok": False, "error": {"type": "UnknownOp", "message": f"unknown op {op!r}",
                                                      "traceback": ""}}, False
        try:
            return {"id": rid, "ok": True, "result": fn(**args)}, False
        except BaseException as e:  # noqa: BLE001 — every failure is a reply
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            return {"id": rid, "ok": False, "error": {"type": type(e).__name__, "message": str(e),
                                                      "traceback": traceback.format_exc(limit=20)}}, False


# -- offline data root (AppWorld's own writers) --------------------------------------


def _resolve(value: Any, refs: dict[str, int]) -> Any:
    """Spec values: ``{"$ref": key}`` → id of an earlier record, ``{"$datetime": iso}`` → datetime."""
    from datetime import datetime

    if isinstance(value, dict) and set(value) == {"$ref"}:
        return refs[value["$ref"]]
    if isinstance(value, dict) and set(value) == {"$datetime"}:
        return datetime.fromisoformat(value["$datetime"])
    if isinstance(value, list):
        return [_resolve(v, refs) for v in value]
    return value


def _create_records(models: Any, records: list[dict[str, Any]], refs: dict[str, int]) -> None:
    for rec in records:
        model = models[rec["app"]][rec["model"]]
        fields = {k: _resolve(v, refs) for k, v in rec["fields"].items()}
        obj = model.create_save(**fields)
        if rec.get("key"):
            refs[rec["key"]] = obj.id


def build_offline(spec: dict[str, Any]) -> dict[str, Any]:
    """Write ``<root>/data`` for the spec's tasks with AppWorld's own classes.

    Layout produced (the one ``appworld download data`` ships):
    ``data/base_dbs/<app>.db`` (+ ``model_hashes.json``),
    ``data/api_docs/{standard,function_calling,openapi}/<app>.json``,
    ``data/tasks/<id>/{specs.json, dbs/<app>.jsonl, ground_truth/...}``,
    ``data/datasets/<name>.txt``.
    """
    from datetime import datetime

    from appworld.apps import get_all_apps
    from appworld.apps.api_lib import set_local_date_and_time, unset_local_date_and_time
    from appworld.common.path_store import path_store

    data = path_store.data
    if os.path.exists(data):
        shutil.rmtree(data)
    os.makedirs(data)
    apps = list(get_all_apps())
    freezer = set_local_date_and_time(datetime.fromisoformat(spec["datetime"]))  # deterministic created_at fields
    try:
        refs, base_dir = _save_base(spec, apps)
        task_ids = [_save_task(t, spec, refs, base_dir, apps) for t in spec["tasks"]]
        # 4. Dataset files.
        datasets = os.path.join(data, "datasets")
        os.makedirs(datasets, exist_ok=True)
        for name, ids in spec["datasets"].items():
            with open(os.path.join(datasets, f"{name}.txt"), "w", encoding="utf-8") as f:
                f.write("".join(f"{i}\n" for i in ids))
    finally:
        unset_local_date_and_time(freezer)
    return {"root": path_store.root, "task_ids": task_ids}


def _save_base(spec: dict[str, Any], apps: list[Any]) -> tuple[dict[str, int], str]:
    """1. The base DBs (every app's schema, then the shared records, saved in full) and 2. the API docs as
    files; returns the records' ids by key and the base DBs' directory."""
    from appworld.apps import get_all_apps
    from appworld.apps.model_lib import CachedDBHandler, get_db_home_path
    from appworld.collections.api_docs import ApiDocCollection
    from appworld.collections.models import ModelCollection

    memory_base = ":memory:contextrender_offline_base"
    base = ModelCollection.load(to_db_home_path=memory_base, from_db_home_path=memory_base,
                                load_apps=apps, create_db=True)
    refs: dict[str, int] = {}
    _create_records(base, spec["base_records"], refs)
    # The api_docs app serves its docs from its own DB: fill it from the docs
    # generated from the apps' code (what the released base DB holds).
    docs = ApiDocCollection.build(load_apps=tuple(get_all_apps(skip_admin=True)))
    for app_name, api_name_to_doc in docs.items():
        for doc in api_name_to_doc.values():
            base.api_docs.ApiDoc.create_save(
                app_name_=app_name, api_name=doc["api_name"], path=doc["path"], method=doc["method"],
                description=doc["description"], parameters=doc["parameters"],
                response_schemas=doc["response_schemas"])
    base_dir = get_db_home_path(storage_type="disk", type="base")
    base.save(db_home_path=base_dir, format="full", app_names=list(apps), delete_if_exists=True,
              save_model_hashes=True)
    base.close()
    CachedDBHandler.reset()
    docs.save()  # the same docs as files (all three formats, as released)
    return refs, base_dir


def _save_task(t: dict[str, Any], spec: dict[str, Any], refs: dict[str, int], base_dir: str,
               apps: list[Any]) -> str:
    """3. One task: its DB changes relative to the base, its specs and its ground truth; returns its id."""
    from datetime import datetime

    from appworld.apps import get_all_apps
    from appworld.apps.admin.models import MainUserMunch
    from appworld.apps.model_lib import CachedDBHandler, get_db_home_path
    from appworld.collections.models import ModelCollection
    from appworld.common.constants import DB_VERSION
    from appworld.ground_truth import GroundTruth
    from appworld.task import Task

    task_id = t["id"]
    memory_task = get_db_home_path(storage_type="memory", type="task_input", task_id=task_id)
    models = ModelCollection.load(to_db_home_path=memory_task, from_db_home_path=base_dir, load_apps=apps)
    task_refs = dict(refs)
    _create_records(models, t["records"], task_refs)
    sup = t["supervisor"]
    task = Task(
        id=task_id, instruction=t["instruction"],
        supervisor=MainUserMunch({k: sup[k] for k in ("first_name", "last_name", "email", "phone_number")}),
        datetime=datetime.fromisoformat(t.get("datetime") or spec["datetime"]),
        allowed_apps=list(get_all_apps(skip_admin=True)), db_version=DB_VERSION, model_collection=models)
    g = t["ground_truth"]
    task.ground_truth = GroundTruth(
        task_id=task_id, required_apps=g["required_apps"], public_data=g.get("public_data", {}),
        private_data=g.get("private_data", {}), answer=g.get("answer"),
        evaluation_code=g["evaluation_code"], solution_code=g["solution_code"],
        compiled_solution_code=g["solution_code"], generator_code=g.get("generator_code", ""),
        test_data=g["test_data"],
        # num_solution_code_lines given, so AppWorld needs no `black` to count lines.
        metadata={"difficulty": g["difficulty"], "num_solution_code_lines": g["num_solution_code_lines"]},
    )
    task.save(model_collection_format="changes", ground_truth_mode="minimal")
    task.close()
    CachedDBHandler.reset()
    return task_id


def main() -> int:
    out = _protocol_stream()

    def send(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj, ensure_ascii=False) + "\n")
        out.flush()

    try:
        worker = Worker()
        import appworld

        send({"id": 0, "ok": True, "result": {"ready": True, "protocol": PROTOCOL_VERSION,
                                              "appworld_version": appworld.__version__,
                                              "root": os.environ.get("APPWORLD_ROOT"), "pid": os.getpid()}})
    except BaseException as e:  # noqa: BLE001
        send({"id": 0, "ok": False, "error": {"type": type(e).__name__, "message": str(e),
                                              "traceback": traceback.format_exc(limit=20)}})
        return 1
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as e:
            send({"id": None, "ok": False, "error": {"type": "BadRequest", "message": str(e), "traceback": ""}})
            continue
        reply, stop = worker.handle(request)
        send(reply)
        if stop:
            break
    try:
        worker.op_close()
    except Exception:  # noqa: BLE001 — exiting anyway
        pass
    return 0


if __name__ == "__main__":
    code = main()
    # Interpreter teardown after a world was open takes seconds (AppWorld's caches);
    # everything is saved and closed by now, so leave at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
