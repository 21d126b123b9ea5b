"""Task-file loader for 8-objective QA: accepted spellings and error messages."""

from __future__ import annotations

import json

import pytest

from contextrender.experiments.benchmarks.qa.data import TaskFileError, load_tasks, split_numbered_questions
from contextrender.experiments.runtime.oracle import Reference

QS = [f"question number {i}?" for i in range(1, 9)]
AS = [[f"answer {i}", f"alias {i}"] for i in range(1, 9)]


def _jsonl(tmp_path, records, name="tasks.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return p


def test_jsonl_plain(tmp_path) -> None:
    p = _jsonl(tmp_path, [{"id": "t1", "questions": QS, "answers": AS}, {"id": "t2", "questions": QS, "answers": AS}])
    tasks = load_tasks(p)
    assert [t.id for t in tasks] == ["t1", "t2"]
    assert tasks[0].questions[0] == "question number 1?"
    assert tasks[0].answers[7] == ("answer 8", "alias 8")
    assert tasks[0].reference is None
    assert load_tasks(p, limit=1)[0].id == "t1"


@pytest.mark.parametrize("record", [
    {"task_id": 7, "sub_questions": QS, "golden_answers": AS},
    {"qid": "7", "question": QS, "gold_answers": [a[0] for a in AS]},  # one string per question
    {"_id": "7", "queries": QS, "reward_model": {"ground_truth": {"target": AS}}},
    {"id": "7", "question": " ".join(f"Question {i}: {q}" for i, q in enumerate(QS, 1)), "answers": AS},
    {"id": "7", "qa_pairs": [{"question": q, "answers": a} for q, a in zip(QS, AS, strict=True)]},
    {"id": "7", "questions": [{"question": q} for q in QS], "answers": [{"aliases": a} for a in AS]},
    {"id": "7", "questions": QS, "answers": {str(i): a for i, a in enumerate(AS, 1)}},
])
def test_field_spellings(tmp_path, record) -> None:
    [task] = load_tasks(_jsonl(tmp_path, [record]))
    assert task.id == "7"
    assert task.n == 8
    assert task.questions[2] == "question number 3?"
    assert task.answers[2][0] == "answer 3"


def test_json_containers(tmp_path) -> None:
    rec = {"questions": QS, "answers": AS}
    for i, data in enumerate(([rec, rec], {"data": [rec, rec]}, {"a": rec, "b": rec}, rec)):
        p = tmp_path / f"f{i}.json"
        p.write_text(json.dumps(data, indent=1), encoding="utf-8")
        tasks = load_tasks(p)
        assert all(t.n == 8 for t in tasks)
        if i == 2:
            assert [t.id for t in tasks] == ["a", "b"]
        if i == 0:
            assert [t.id for t in tasks] == ["f0-0", "f0-1"]  # default ids: file stem and index


def test_numbered_question_strings() -> None:
    assert split_numbered_questions("Q1. a? Q2. b? Q3) c?") == ["a?", "b?", "c?"]
    assert split_numbered_questions("1. first?\n2. second?") == ["first?", "second?"]
    assert split_numbered_questions("Who won in 1998?") == []


def test_search_queries_build_an_oracle_reference(tmp_path) -> None:
    [task] = load_tasks(_jsonl(tmp_path, [{"id": "x", "questions": QS, "answers": AS,
                                          "search_queries": [f"q{i}" for i in range(8)]}]))
    assert isinstance(task.reference, Reference)
    calls = task.reference.turns[0]
    assert [c.name for c in calls] == ["wikipedia_search"] * 8 + ["final_answer"]
    assert calls[-1].arguments == {"answers": [a[0] for a in AS]}


def test_errors_name_file_and_line(tmp_path) -> None:
    good = json.dumps({"id": "a", "questions": QS, "answers": AS})
    p = tmp_path / "bad.jsonl"
    p.write_text(good + "\n" + json.dumps({"id": "b", "prompt_text": "x", "answers": AS}) + "\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=r"bad\.jsonl:2: no questions found .*the record has: answers, id, prompt_text"):
        load_tasks(p)
    p.write_text(good + "\n{not json\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=r"bad\.jsonl:2: invalid JSON"):
        load_tasks(p)
    p.write_text(json.dumps({"id": "a", "questions": QS, "answers": AS[:7]}) + "\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=r"bad\.jsonl:1: 8 questions but 7 answer lists"):
        load_tasks(p)
    p.write_text(json.dumps({"id": "a", "questions": QS[:4], "answers": AS[:4]}) + "\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=r"bad\.jsonl:1: 4 questions, this benchmark expects 8"):
        load_tasks(p)
    assert load_tasks(p, objectives=None)[0].n == 4
    p.write_text(json.dumps({"id": "a", "questions": QS}) + "\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=r"bad\.jsonl:1: no answers found"):
        load_tasks(p)
    p.write_text(json.dumps({"id": "a", "question": "one question only", "answers": AS}) + "\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=r"bad\.jsonl:1: field 'question' is one string and neither numbered "
                                            r"questions .* nor questions joined by '; '"):
        load_tasks(p)
    p.write_text(good + "\n" + good + "\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=r"duplicate task id 'a'"):
        load_tasks(p)
    with pytest.raises(TaskFileError, match=r"no such task file"):
        load_tasks(tmp_path / "missing.jsonl")


# -- ACON's own nq_multi_8 files: eight questions joined by "; " in one string --------------

#: A record of the QA data (id and first two questions and alias lists exactly as given there),
#: completed with six NaturalQuestions-style questions and their alias lists.
NQ_MULTI8_QUESTIONS = [
    "where is the food stored in a yam plant?",
    "who plays lefou in beauty and the beast 1991?",
    "who sang the song i can only imagine?",
    "when was the first star wars movie released?",
    "what is the largest bone in the human body?",
    "who wrote the declaration of independence?",
    "how many episodes are in season 1 of stranger things?",
    "what is the capital city of australia?",
]
NQ_MULTI8_ANSWERS = [
    ["an edible tuber"],
    ["Jesse Corti", "Venezuelan voice actor Jesse Corti"],
    ["MercyMe"],
    ["May 25, 1977", "1977"],
    ["the femur", "femur"],
    ["Thomas Jefferson"],
    ["eight", "8"],
    ["Canberra"],
]
NQ_MULTI8_LINE = json.dumps({"id": "nq_multi8_test_2200", "question": "; ".join(NQ_MULTI8_QUESTIONS),
                             "answer": NQ_MULTI8_ANSWERS})


def test_acon_nq_multi_8_line_loads_into_8_questions_and_8_alias_lists(tmp_path) -> None:
    assert json.loads(NQ_MULTI8_LINE)["question"].startswith(
        "where is the food stored in a yam plant?; who plays lefou in beauty and the beast 1991?; ")
    p = tmp_path / "nq_multi_8_test.jsonl"
    p.write_text(NQ_MULTI8_LINE + "\n", encoding="utf-8")
    [task] = load_tasks(p)  # objectives=8, as benchmark=moqa8 loads it
    assert task.id == "nq_multi8_test_2200" and task.n == 8
    assert list(task.questions) == NQ_MULTI8_QUESTIONS
    assert [list(a) for a in task.answers] == NQ_MULTI8_ANSWERS
    assert task.answers[1] == ("Jesse Corti", "Venezuelan voice actor Jesse Corti")
    assert task.source == f"{p}:1"


def test_a_question_holding_the_separator_names_the_record(tmp_path) -> None:
    qs = list(NQ_MULTI8_QUESTIONS)
    qs[3] = "when was star wars released; and by whom?"  # one question with "; " inside: 9 parts
    p = tmp_path / "nq.jsonl"
    good = json.dumps({"id": "ok", "question": "; ".join(NQ_MULTI8_QUESTIONS), "answer": NQ_MULTI8_ANSWERS})
    bad = json.dumps({"id": "nq_multi8_test_9", "question": "; ".join(qs), "answer": NQ_MULTI8_ANSWERS})
    p.write_text(good + "\n" + bad + "\n", encoding="utf-8")
    with pytest.raises(TaskFileError, match=r"nq\.jsonl:2: field 'question' splits on '; ' into 9 questions but the "
                                            r"record has 8 answer lists — a question itself contains '; '"):
        load_tasks(p)
    # A ';' without the space is part of a question, not a separator.
    qs[3] = "when was star wars released;and by whom?"
    p.write_text(json.dumps({"id": "x", "question": "; ".join(qs), "answer": NQ_MULTI8_ANSWERS}) + "\n",
                 encoding="utf-8")
    assert load_tasks(p)[0].questions[3] == "when was star wars released;and by whom?"


def test_a_joined_string_short_of_the_answers_is_refused(tmp_path) -> None:
    p = tmp_path / "nq.json"
    rec = {"id": "short", "question": "; ".join(NQ_MULTI8_QUESTIONS[:7]) + "; ", "answer": NQ_MULTI8_ANSWERS}
    p.write_text(json.dumps([rec]), encoding="utf-8")
    with pytest.raises(TaskFileError, match=r"nq\.json: task 0: field 'question' splits on '; ' into 8 questions "
                                            r"\(1 empty\) but the record has 8 answer lists"):
        load_tasks(p)
