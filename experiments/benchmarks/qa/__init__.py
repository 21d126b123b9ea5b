"""8-objective QA (ACON's multi-objective QA; paper §4, docs/method.md §7–§8).

* :class:`MultiObjectiveQA` (``moqa8``): ACON's ``nq_multi_8`` task files and a
  Search-R1-style ``/retrieve`` server (see README.md in this package).
* :class:`OfflineMultiObjectiveQA` (``moqa8_offline``): a SYNTHETIC task set over
  a generated corpus with a local BM25 server, for the offline oracle.
"""

from contextrender.experiments.benchmarks.qa.agent import CodeActModel, run_agent
from contextrender.experiments.benchmarks.qa.benchmark import MultiObjectiveQA, OfflineMultiObjectiveQA, task_prompt
from contextrender.experiments.benchmarks.qa.data import QATask, TaskFileError, load_tasks
from contextrender.experiments.benchmarks.qa.retriever import BM25Index, RetrieverServer, serve_in_background
from contextrender.experiments.benchmarks.qa.scoring import (
    QAScore,
    exact_match,
    normalize_answer,
    score_answer,
    token_f1,
)
from contextrender.experiments.benchmarks.qa.search import RetrieverClient, WikipediaSearchTool

__all__ = [
    "BM25Index", "CodeActModel", "MultiObjectiveQA", "OfflineMultiObjectiveQA", "QAScore", "QATask",
    "RetrieverClient", "RetrieverServer", "TaskFileError", "WikipediaSearchTool", "exact_match", "load_tasks",
    "normalize_answer", "run_agent", "score_answer", "serve_in_background", "task_prompt", "token_f1",
]
