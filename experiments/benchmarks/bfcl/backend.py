"""Executable BFCL multi-turn environment built on bfcl-eval's backend classes.

BFCL itself executes model calls by rewriting them into Python source and
calling ``eval`` (``multi_turn_utils.execute_multi_turn_func_call``), keeping
instances in module globals. We reuse only its backend classes (stdlib +
mpmath) and dispatch calls directly, which gives the same results without
``eval`` and without global state. Result strings follow BFCL's rules so what
a model sees here is what it would see on the leaderboard:

* ``str`` results pass through, ``dict`` results are ``json.dumps``-ed (falling
  back to ``str``), anything else is ``str``-ed;
* any exception becomes ``"Error during execution: <message>"``, and an unknown
  function reads like the ``NameError`` BFCL's ``eval`` would raise.

Known deliberate deviations from BFCL's string pipeline: BFCL's regex rewrite
also touches ``name(`` inside string literals, and it refuses names such as
``kill``/``exit`` with a different message; neither occurs in ground truth.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import inspect
import json
from collections.abc import Callable
from typing import Any, NamedTuple

from bfcl_eval.constants.executable_backend_config import (
    CLASS_FILE_PATH_MAPPING,
    STATELESS_CLASSES,
)

from contextrender.experiments.benchmarks.bfcl.data import BFCLTask

__all__ = [
    "BFCLEnvironment",
    "ExecutedCall",
    "MULTI_TURN_CLASSES",
    "format_result",
    "parse_call_string",
]

#: Backends used by the multi-turn categories. BFCL's web-search and memory
#: classes are left out: they need packages that ``--no-deps`` skips.
MULTI_TURN_CLASSES: tuple[str, ...] = (
    "GorillaFileSystem",
    "MathAPI",
    "MessageAPI",
    "TwitterAPI",
    "TicketAPI",
    "TradingBot",
    "TravelAPI",
    "VehicleControlAPI",
)

_ERROR_PREFIX = "Error during execution: "


class ExecutedCall(NamedTuple):
    """One executed call, as recorded in ``BFCLEnvironment.log``."""

    turn: int
    name: str
    arguments: dict[str, Any]
    result: str


def _backend_class(class_name: str) -> type:
    if class_name not in MULTI_TURN_CLASSES:
        raise ValueError(f"unsupported BFCL backend class {class_name!r}")
    # Imported by module name: bfcl_eval's package __init__ files are empty, so
    # this pulls in only the backend module (and its long_context data file).
    module = importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name])
    return getattr(module, class_name)


@functools.cache
def _parameter_names(function_name: str) -> tuple[str, ...] | None:
    """Parameter names of a backend method, for mapping positional arguments.

    Method names are unique across the multi-turn backends, so the name alone
    identifies the method.
    """
    if function_name.startswith("_"):
        return None
    for class_name in MULTI_TURN_CLASSES:
        method = getattr(_backend_class(class_name), function_name, None)
        if callable(method):
            params = list(inspect.signature(method).parameters)
            return tuple(params[1:])  # drop ``self``
    return None


def parse_call_string(call: str) -> tuple[str, dict[str, Any]]:
    """Parse a BFCL call string such as ``"cd(folder='document')"``.

    Arguments must be Python literals (checked with ``ast.literal_eval``; the
    text is never evaluated). Positional arguments, which some ground-truth
    entries use (``sort('final_report.pdf')``), are mapped to keyword names via
    the backend method's signature so the result can be emitted as a
    structured tool call.

    Raises:
        ValueError: if ``call`` is not a single call of a plain name with
            literal arguments, or positional arguments cannot be named.
    """
    try:
        node = ast.parse(call.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"not a call expression: {call!r}") from e
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a call of a plain function name: {call!r}")
    name = node.func.id

    arguments: dict[str, Any] = {}
    if node.args:
        params = _parameter_names(name)
        if params is None:
            raise ValueError(f"cannot name positional arguments of unknown function {name!r}")
        if len(node.args) > len(params):
            raise ValueError(f"too many positional arguments for {name}: {call!r}")
        for param, arg in zip(params, node.args, strict=False):
            arguments[param] = _literal(arg, call)
    for keyword in node.keywords:
        if keyword.arg is None:
            raise ValueError(f"**kwargs are not supported: {call!r}")
        if keyword.arg in arguments:
            raise ValueError(f"argument {keyword.arg!r} given twice: {call!r}")
        arguments[keyword.arg] = _literal(keyword.value, call)
    return name, arguments


def _literal(node: ast.expr, call: str) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError as e:
        raise ValueError(f"non-literal argument in {call!r}: {ast.unparse(node)}") from e


def format_result(value: Any) -> str:
    """Render a backend return value the way BFCL feeds it back to the model."""
    if type(value) is str:  # exact type check, as BFCL does
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except Exception:  # e.g. objects inside the dict
            return str(value)
    return str(value)


def _same(a: Any, b: Any, seen: set[tuple[int, int]]) -> bool:
    """Structural equality of two backend states (copies: their objects differ by identity, and backend
    value objects such as the file system's directories define no equality; parent links make cycles)."""
    if type(a) is not type(b):
        return False
    key = (id(a), id(b))
    if key in seen:
        return True
    if isinstance(a, dict):
        seen.add(key)
        return a.keys() == b.keys() and all(_same(a[k], b[k], seen) for k in a)
    if isinstance(a, (list, tuple)):
        seen.add(key)
        return len(a) == len(b) and all(_same(x, y, seen) for x, y in zip(a, b, strict=True))
    if hasattr(a, "__dict__") and not callable(a):
        seen.add(key)
        return _same(vars(a), vars(b), seen)
    try:
        return bool(a == b)
    except Exception:  # an exotic value that cannot compare: say it changed
        return False


class BFCLEnvironment:
    """The backend instances of one task, initialised as BFCL initialises them.

    Every executed call is appended to ``log`` tagged with the current turn;
    the checker reads it to find the model's results, so harnesses should call
    ``begin_turn`` before running each turn's calls.
    """

    def __init__(self, task: BFCLTask) -> None:
        self.task = task
        self.instances: dict[str, Any] = {}
        self._methods: dict[str, Callable[..., Any]] = {}
        self.turn = 0
        self.log: list[ExecutedCall] = []
        for class_name in task.involved_classes:
            instance = _backend_class(class_name)()
            if class_name not in STATELESS_CLASSES:
                # Deep copy: backends mutate their config in place, and the task
                # must stay reusable for the ground-truth environment.
                config = copy.deepcopy(task.initial_config.get(class_name, {}))
                instance._load_scenario(config, long_context=task.long_context)
            self.instances[class_name] = instance
            for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
                if not name.startswith("_"):
                    self._methods[name] = method  # later classes win, as in BFCL

    @property
    def function_names(self) -> frozenset[str]:
        """Names callable in this environment (public backend methods)."""
        return frozenset(self._methods)

    def begin_turn(self, turn_index: int) -> None:
        """Tag subsequent calls with ``turn_index`` (turns only move forward)."""
        if turn_index < self.turn:
            raise ValueError(f"turn {turn_index} is before current turn {self.turn}")
        self.turn = turn_index

    def execute(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one call and return BFCL's result string; never raises."""
        method = self._methods.get(name)
        if method is None:
            result = f"{_ERROR_PREFIX}name '{name}' is not defined"
        elif not isinstance(arguments, dict):
            result = f"{_ERROR_PREFIX}arguments must be an object, got {type(arguments).__name__}"
        else:
            try:
                # Copy so later edits by the caller can't alias backend state
                # (BFCL's eval builds fresh objects from source text).
                result = format_result(method(**copy.deepcopy(arguments)))
            except Exception as e:  # backend bugs and bad arguments alike
                result = f"{_ERROR_PREFIX}{e}"
        self.log.append(ExecutedCall(self.turn, name, copy.deepcopy(arguments), result))
        return result

    def read_only(self, name: str, arguments: dict[str, Any]) -> bool:
        """Whether a call has no side effect: run on a copy of its backend instance, it leaves every
        attribute as it was — BFCL's state check (which compares the public ones) and the private ones too
        (``cd`` moves the file system's current directory, which later calls depend on). BFCL marks no
        function read-only itself. Unknown functions and calls that fail are not read-only."""
        method = self._methods.get(name)
        if method is None or not isinstance(arguments, dict):
            return False
        instance = getattr(method, "__self__", None)  # a bound method of one backend instance
        if instance is None:
            return False
        before = copy.deepcopy(instance)
        trial = copy.deepcopy(instance)
        try:
            getattr(trial, name)(**copy.deepcopy(arguments))
        except Exception:  # a failing call is not worth repeating
            return False
        return _same(vars(before), vars(trial), set())

    def execute_call_string(self, call: str) -> str:
        """Parse (never ``eval``) a BFCL call string and execute it."""
        try:
            name, arguments = parse_call_string(call)
        except ValueError as e:
            result = f"{_ERROR_PREFIX}{e}"
            self.log.append(ExecutedCall(self.turn, call, {}, result))
            return result
        return self.execute(name, arguments)

    def results(self, up_to_turn: int | None = None) -> list[str]:
        """Result strings of all logged calls, optionally only turns <= ``up_to_turn``."""
        return [c.result for c in self.log if up_to_turn is None or c.turn <= up_to_turn]
