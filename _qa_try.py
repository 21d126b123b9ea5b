import contextrender, time
from contextrender import ContextGraph, HashingEmbedder, ExtractiveCompactor
from contextrender.config import build_policy, method_config
from experiments.episode import Episode
from experiments.oracle import OracleModel
from experiments.benchmarks.qa import OfflineMultiObjectiveQA
import sys
bench = OfflineMultiObjectiveQA(n_tasks=10, seed=0)
g = ContextGraph(":memory:")
oracle = OracleModel()
for method in sys.argv[1].split(","):
  for B in [2000, 4000, 100000]:
    pol = build_policy(method_config(method), embedder=HashingEmbedder(), compactor=ExtractiveCompactor())
    scores = []
    t0 = time.time()
    for task in bench.tasks():
        s = g.session(f"{method}-{B}-{task.id}")
        ep = Episode(s, pol, oracle.episode(task, s), B)
        out = bench.run_episode(task, ep)
        scores.append(out.score["f1"])
    print(method, B, round(sum(scores)/len(scores), 3), [round(x,2) for x in scores], f"{time.time()-t0:.1f}s", ep.invocations, ep.renders[-1].full_tokens)
bench.close()
