"""8-objective QA benchmarks: ``moqa8`` (ACON's task files) and ``moqa8_offline`` (SYNTHETIC).

Both run the same agent (:mod:`.agent`): a smolagents ``CodeAgent`` with
``wikipedia_search(query, n_results=3)`` against a Search-R1-style
``/retrieve`` server, answers in question order separated by ``;`` through
``final_answer``, no own knowledge, at most 30 steps with the remaining count
shown after each observation (ACON's QA protocol, docs/method.md §8). Scoring is docs/method.md §7
(:mod:`.scoring`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from contextrender.experiments.benchmarks.base import EpisodeOutcome
from contextrender.experiments.benchmarks.qa.agent import DEFAULT_MAX_STEPS, run_agent
from contextrender.experiments.benchmarks.qa.data import QATask, TaskFileError, load_tasks
from contextrender.experiments.benchmarks.qa.scoring import score_answer
from contextrender.experiments.benchmarks.qa.search import RetrieverClient, WikipediaSearchTool
from contextrender.experiments.runtime.episode import Episode

log = logging.getLogger(__name__)


def task_prompt(task: QATask, max_steps: int = DEFAULT_MAX_STEPS) -> str:
    """The user message: the questions and the answering rules (project wording of ACON's protocol)."""
    questions = "\n".join(f"{i}. {q}" for i, q in enumerate(task.questions, start=1))
    n = task.n
    example = "; ".join(f"answer {i}" for i in range(1, min(n, 3) + 1)) + ("; ...; answer " + str(n) if n > 3 else "")
    return (
        f"Answer the following {n} questions.\n\n{questions}\n\n"
        "Rules:\n"
        "- Use only information returned by the wikipedia_search tool; do not answer from your own knowledge.\n"
        "- wikipedia_search(query, n_results=3) returns Wikipedia passages; print its result to read it.\n"
        f"- You have at most {max_steps} steps; the number of steps left is shown after each observation.\n"
        f"- Finish by calling final_answer once with one string holding all {n} answers in question order, "
        f'separated by semicolons, e.g. final_answer("{example}").\n'
        "- Keep each answer short (a name, date, number or short phrase). If you cannot find an answer, leave "
        "its place empty but keep the semicolons so the positions stay aligned."
    )


class MultiObjectiveQA:
    """``moqa8``: ACON's 8-objective QA task files against a retriever at ``retriever_url``."""

    name = "moqa8"
    primary_metric = "f1"
    synthetic = False

    def __init__(self, tasks_path: str | None = None, retriever_url: str | None = None, *, limit: int | None = None,
                 objectives: int | None = 8, n_results: int = 3, max_steps: int = DEFAULT_MAX_STEPS,
                 timeout_s: float = 60.0) -> None:
        self.tasks_path = tasks_path
        self.retriever_url = retriever_url
        self.limit = limit
        self.objectives = objectives
        self.n_results = n_results
        self.max_steps = max_steps
        self.timeout_s = timeout_s
        self._tasks: list[QATask] | None = None
        self._client: RetrieverClient | None = None
        self._lock = threading.RLock()

    def tasks(self) -> list[QATask]:
        if self._tasks is None:
            if not self.tasks_path:
                raise TaskFileError("moqa8 needs benchmark.tasks_path (or MOQA8_TASKS): ACON's nq_multi_8 test "
                                    "file; see experiments/benchmarks/qa/README.md")
            self._tasks = load_tasks(self.tasks_path, limit=self.limit, objectives=self.objectives)
        return self._tasks

    def endpoint(self) -> str:
        if not self.retriever_url:
            raise ValueError("moqa8 needs benchmark.retriever_url (or MOQA8_RETRIEVER_URL): a Search-R1-style "
                             "/retrieve server; see experiments/benchmarks/qa/README.md")
        return self.retriever_url

    def client(self) -> RetrieverClient:
        """One HTTP client per benchmark, shared by episodes (thread-safe)."""
        with self._lock:
            if self._client is None:
                self._client = RetrieverClient(self.endpoint(), timeout_s=self.timeout_s)
            return self._client

    def run_episode(self, task: QATask, episode: Episode) -> EpisodeOutcome:
        tool = WikipediaSearchTool(self.client(), default_n=self.n_results)
        run = run_agent(task_prompt(task, self.max_steps), episode, [tool], max_steps=self.max_steps)
        s = score_answer(run.answer, task.answers)
        extra: dict[str, Any] = {
            "answer": run.answer, "predictions": list(s.predictions), "f1_per_question": list(s.f1_per_question),
            "em_per_question": list(s.em_per_question), "agent_steps": run.steps,
            "agent_max_steps_reached": run.max_steps_reached, "parse_errors": run.parse_errors,
        }
        hidden = getattr(episode.model, "hidden_log", None)
        if hidden:
            extra["oracle_hidden"] = [[t, name, list(values)] for t, name, values in hidden]
        if self.synthetic:
            extra["synthetic"] = True
        return EpisodeOutcome(s.as_dict(), "ok", extra)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


class OfflineMultiObjectiveQA(MultiObjectiveQA):
    """``moqa8_offline``: SYNTHETIC 8-objective QA over a generated corpus (see :mod:`.offline`).

    Without ``retriever_url``, a BM25 server over the generated corpus is
    started on a free loopback port the first time an episode runs.
    """

    name = "moqa8_offline"
    synthetic = True

    def __init__(self, n_tasks: int = 10, seed: int = 0, *, distractors: int = 2, retriever_url: str | None = None,
                 n_results: int = 3, max_steps: int = DEFAULT_MAX_STEPS, timeout_s: float = 60.0) -> None:
        super().__init__(None, retriever_url, objectives=8, n_results=n_results, max_steps=max_steps,
                         timeout_s=timeout_s)
        self.n_tasks = n_tasks
        self.seed = seed
        self.distractors = distractors
        self._data: Any = None
        self._server: Any = None

    def data(self) -> Any:
        from contextrender.experiments.benchmarks.qa.offline import generate

        with self._lock:
            if self._data is None:
                self._data = generate(self.n_tasks, self.seed, distractors=self.distractors,
                                      n_results=self.n_results)
            return self._data

    def tasks(self) -> list[QATask]:
        return self.data().qa_tasks()

    def endpoint(self) -> str:
        if self.retriever_url:
            return self.retriever_url
        data = self.data()
        with self._lock:
            if self._server is None:
                from contextrender.experiments.benchmarks.qa.retriever import serve_in_background

                self._server = serve_in_background(data.documents)
                log.info("moqa8_offline (SYNTHETIC): %d generated documents served at %s",
                         len(data.documents), self._server.url)
            return str(self._server.url)

    def close(self) -> None:
        super().close()
        with self._lock:
            if self._server is not None:
                self._server.stop()
                self._server = None
