"""8-objective QA scoring (docs/method.md §7), hand-checked cases."""

from __future__ import annotations

import pytest

from contextrender.experiments.benchmarks.qa.scoring import (
    exact_match,
    normalize_answer,
    score_answer,
    split_answers,
    token_f1,
)

EIGHT = [["Paris"], ["New York City", "NYC"], ["The Beatles"], ["U.S.A.", "United States"], ["Barack Obama"],
         ["1969"], ["an apple"], ["Mount Everest"]]


@pytest.mark.parametrize("text, expected", [
    ("The Eiffel Tower.", "eiffel tower"),
    ("  An apple,  a DAY ", "apple day"),
    ("U.S.A.", "usa"),
    ("the", ""),
    ("theme park", "theme park"),  # "the" only as a whole word
    ("Rock-'n'-roll!", "rocknroll"),
    ("a\tb\nc", "b c"),  # "a" is an article
])
def test_normalize(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


def test_exact_match_and_f1_basics() -> None:
    assert exact_match("the Beatles", "Beatles") == 1.0
    assert exact_match("USA", "U.S.A.") == 1.0
    assert exact_match("Beatles!", "The Beatles") == 1.0
    assert exact_match("Obama", "Barack Obama") == 0.0
    assert token_f1("Obama", "Barack Obama") == pytest.approx(2 * 1.0 * 0.5 / 1.5)  # P=1, R=1/2
    assert token_f1("President Barack Obama", "Barack Obama") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert token_f1("Lyon", "Paris") == 0.0
    assert token_f1("", "Paris") == 0.0
    assert token_f1("paris paris", "paris") == pytest.approx(2 * 0.5 * 1 / 1.5)  # counts clipped


def test_all_correct_with_aliases_articles_punctuation() -> None:
    answer = "paris; NYC; Beatles; United States; barack obama; 1969.; Apple; mount everest"
    s = score_answer(answer, EIGHT)
    assert s.f1 == pytest.approx(1.0)
    assert s.em == pytest.approx(1.0)
    assert s.as_dict() == {"f1": pytest.approx(1.0), "em": pytest.approx(1.0)}


def test_max_over_aliases() -> None:
    # "New York" vs "New York City": F1 = 2*(1)(2/3)/(5/3) = 0.8; vs "NYC": 0. Max = 0.8, EM 0.
    s = score_answer("New York", [["New York City", "NYC"]])
    assert s.f1 == pytest.approx(0.8)
    assert s.em == 0.0


def test_partial_and_sum_over_eight() -> None:
    # Right: 1, 3, 8 (EM and F1 1). Q5 "Obama": F1 2/3, EM 0. Others wrong.
    answer = "Paris; Boston; the beatles; Canada; Obama; 1970; pear; Mount Everest"
    s = score_answer(answer, EIGHT)
    assert s.em == pytest.approx(3 / 8)
    assert s.f1 == pytest.approx((3 + 2 / 3) / 8)
    assert s.f1_per_question[4] == pytest.approx(2 / 3)
    assert s.predictions[1] == "Boston"


def test_missing_answers_score_zero() -> None:
    s = score_answer("Paris; NYC", EIGHT)  # only two positions
    assert s.f1 == pytest.approx(2 / 8) and s.em == pytest.approx(2 / 8)
    assert s.predictions[2:] == ("",) * 6
    s = score_answer("Paris;; The Beatles", EIGHT)  # empty middle position
    assert s.f1_per_question[:3] == (1.0, 0.0, 1.0)
    assert score_answer(None, EIGHT).f1 == 0.0
    assert score_answer("", EIGHT).em == 0.0
    # Punctuation only normalises to nothing: a missing answer, even against an empty-normalising alias.
    assert score_answer(".", [["the"]]).em == 0.0


def test_extra_answers_ignored() -> None:
    answer = "paris; NYC; Beatles; USA; Barack Obama; 1969; apple; Everest; extra; more"
    s = score_answer(answer, EIGHT)
    assert len(s.predictions) == 8
    # Everest vs Mount Everest: F1 2/3.
    assert s.f1 == pytest.approx((7 + 2 / 3) / 8)
    assert s.em == pytest.approx(7 / 8)


def test_shifted_answers_are_position_scored() -> None:
    # One answer dropped at the front shifts everything: positions are not re-aligned.
    answer = "NYC; The Beatles; USA; Barack Obama; 1969; an apple; Mount Everest"
    assert score_answer(answer, EIGHT).em == 0.0


def test_split_answers() -> None:
    assert split_answers(" a ;b;; c ") == ["a", "b", "", "c"]
    assert split_answers(None) == []
    with pytest.raises(ValueError):
        score_answer("x", [])
