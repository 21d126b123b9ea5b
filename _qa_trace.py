import json
from contextrender import ContextGraph, HashingEmbedder, ExtractiveCompactor
from contextrender.config import build_policy, method_config
from experiments.episode import Episode
from experiments.oracle import OracleModel
from experiments.benchmarks.qa import OfflineMultiObjectiveQA
from experiments.benchmarks.qa.agent import to_agent_chat
bench = OfflineMultiObjectiveQA(n_tasks=1, seed=0)
g = ContextGraph(":memory:")
task = bench.tasks()[0]
s = g.session("x")
pol = build_policy(method_config("contextrender"), embedder=HashingEmbedder(), compactor=ExtractiveCompactor())
ep = Episode(s, pol, OracleModel().episode(task, s), 2000)
out = bench.run_episode(task, ep)
print(out)
for m in s.openai_messages()[1:6] + s.openai_messages()[-3:]:
    print("----", m["role"], json.dumps(m, ensure_ascii=False)[:1500])
print("==== rendered last (agent chat)")
for m in to_agent_chat(list(ep.last_rendered.messages))[2:]:
    print("----", m["role"], m["content"][:300].replace("\n", " | "))
print([ (r.t, r.tokens, r.full_tokens, r.visible) for r in ep.renders])
print(s.reuse_edges())
bench.close()
print(repr(s.openai_messages()[3]["content"][-150:]))
print(repr(s.openai_messages()[0]["content"][:300]))
