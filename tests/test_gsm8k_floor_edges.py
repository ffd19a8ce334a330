"""Edges of the gsm8k A/B's judging code on hand-built records whose right answer is plain from
the numbers: the sign test's exact tails at a p equal to alpha and at the fewest questions that
can decide, a NaN KL never read as within noise, a margin equal to the floor's drift, the
near-tie rule's larger margin, what counts as an answer flip, and the HTML's colours."""
import math

import pytest

from pq2verify.gsm8k import floor, report, switch

F = "tests/test_gsm8k_floor_edges.py"


def repro(test: str) -> str:
    return f"reproduce: .venv/bin/python -m pytest -q '{F}::{test}'"


def _tf(kls: dict):
    return {"mean_kl": 1.0, "per_question": {q: {"kl": v} for q, v in kls.items()}}


def _verdict(above: int, below: int, nan: int = 0, alpha: float = floor.ALPHA):
    kb = {q: 2.0 for q in range(above)} | {100 + q: 0.5 for q in range(below)} | {200 + q: math.nan for q in range(nan)}
    return floor.verdict(_tf(kb), _tf({q: 1.0 for q in kb}), alpha)


# --- the sign test and the verdict -------------------------------------------------------------
def test_the_sign_tests_tails_are_exact():
    """3 untied questions, B above F on 2: P(X >= 2) = (3 + 1) / 8 = 1/2 and P(X <= 2) = 7/8 for
    X ~ Binomial(3, 1/2); a tie (equal KL) is a tie, never 'above'."""
    t = "test_the_sign_tests_tails_are_exact"
    st = floor.sign_test({1: 2.0, 2: 2.0, 3: 0.5, 4: 1.0}, {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0})
    assert (st["above"], st["below"], st["ties"]) == (2, 1, 1), (st, repro(t))
    assert st["p"] == 0.5 and st["p_below"] == 7 / 8, (st, repro(t))


@pytest.mark.parametrize("alpha,need", [(0.5, 2), (0.25, 3), (0.2, 3), (0.01, 7)])
def test_the_fewest_questions_is_the_first_n_with_two_to_the_minus_n_below_alpha(alpha, need):
    """p < alpha at best is 2^-n < alpha: 0.5 needs n = 2 (2^-1 = 0.5 is not below), 0.25 needs
    3, 0.2 needs 3 (2^-3 = 0.125), 0.01 needs 7 (2^-7 = 0.0078)."""
    t = "test_the_fewest_questions_is_the_first_n_with_two_to_the_minus_n_below_alpha"
    assert floor.min_questions(alpha) == need, repro(t)


def test_p_equal_to_alpha_is_within_noise():
    """5 untied questions, 4 above: p = P(X >= 4) = (5 + 1) / 32 = 0.1875 exactly. At alpha 0.1875
    (decidable from 3 questions) p < alpha fails: within arithmetic noise."""
    t = "test_p_equal_to_alpha_is_within_noise"
    v = _verdict(4, 1, alpha=0.1875)
    assert v["p"] == 0.1875 and v["decided"], (v, repro(t))
    assert v["verdict"] == "within arithmetic noise", (v["verdict"], repro(t))


def test_exactly_the_fewest_questions_decide():
    """7 questions all above at alpha 0.01: p = 2^-7 < 0.01 with exactly the 7 needed: decided,
    beyond arithmetic noise."""
    t = "test_exactly_the_fewest_questions_decide"
    v = _verdict(7, 0)
    assert v["decided"] and v["verdict"] == "beyond arithmetic noise", (v, repro(t))


def test_a_nan_kl_is_never_within_noise():
    """4 above, 4 below (p = 0.64, within by the test alone) and one question whose KL is NaN:
    the NaN compares false both ways and drops out as a tie, so the verdict cannot be within."""
    t = "test_a_nan_kl_is_never_within_noise"
    assert _verdict(4, 4)["verdict"] == "within arithmetic noise", repro(t)
    v = _verdict(4, 4, nan=1)
    assert v["ties"] == 1 and v["verdict"] == "beyond arithmetic noise", (v, repro(t))


def test_the_worst_delta_is_the_largest_over_all_questions():
    """Question 1's largest |delta log p| is 0.2, question 2's 0.9: the worst is question 2."""
    t = "test_the_worst_delta_is_the_largest_over_all_questions"

    def rec(d):
        return {"tokens": [5], "topk": [[[5, -0.1]]],
                "teacher": {"b": {"kl": [0.0], "top1": [True], "lpk": [[-0.1 - d]]}}}
    s = floor.teacher({1: rec(0.2), 2: rec(0.9)}, "b")
    assert s["worst"]["id"] == 2 and s["worst"]["dlp"] == pytest.approx(0.9), (s["worst"], repro(t))


def test_a_questions_largest_delta_is_its_magnitude_where_it_is_negative():
    """Two steps: A's token at log p -0.5 then -0.5 under A, -0.75 then -0.375 under B: deltas
    -0.25 and +0.125. The question's largest |delta log p| is 0.25 at step 0 (a drop), recorded
    as 0.25, not -0.25. Kills gsm8k/floor.py `"max_dlp": abs(dlp[i])` -> `dlp[i]`."""
    t = "test_a_questions_largest_delta_is_its_magnitude_where_it_is_negative"
    r = {"tokens": [5, 6], "topk": [[[5, -0.5]], [[6, -0.5]]],
         "teacher": {"b": {"kl": [0.0, 0.0], "top1": [True, True], "lpk": [[-0.75], [-0.375]]}}}
    q = floor.teacher({1: r}, "b")["per_question"][1]
    assert q["step"] == 0 and q["max_dlp"] == 0.25, (q, repro(t))


def test_the_median_question_kl_is_the_middle_one():
    """Five questions with mean KL 5, 1, 4, 2, 3 (one step each): sorted 1..5, the median is 3.
    Kills gsm8k/floor.py `kls[len(kls) // 2]` -> `// 3` (it would read 2)."""
    t = "test_the_median_question_kl_is_the_middle_one"
    recs = {q: {"tokens": [5], "topk": [[[5, -0.5]]],
                "teacher": {"b": {"kl": [float(kl)], "top1": [True], "lpk": [[-0.5]]}}}
            for q, kl in enumerate([5, 1, 4, 2, 3])}
    assert floor.teacher(recs, "b")["median_question_kl"] == 3.0, repro(t)


def test_a_tie_for_the_worst_question_names_the_first_in_question_order():
    """Questions 3, 7 and 9, A's token at log p -0.5 at every step; under B, question 3's two
    steps at 0.0 and -1.0, 7's one at -1.0, 9's at -0.75: |delta log p| (0.5, 0.5), 0.5, 0.25.
    Questions 3 and 7 tie; the first in order, 3, is the worst, at its first step of the two
    that tie, whatever order the records came in."""
    t = "test_a_tie_for_the_worst_question_names_the_first_in_question_order"

    def rec(*lps):
        return {"tokens": [5] * len(lps), "topk": [[[5, -0.5]]] * len(lps),
                "teacher": {"b": {"kl": [0.0] * len(lps), "top1": [True] * len(lps), "lpk": [[lp] for lp in lps]}}}
    recs = {9: rec(-0.75), 7: rec(-1.0), 3: rec(0.0, -1.0)}
    w = floor.teacher(recs, "b")["worst"]
    assert w["id"] == 3 and w["dlp"] == 0.5 and w["step"] == 0, (w, repro(t))


# --- flips against the floor's drift -----------------------------------------------------------
def _rec(tokens, topk, answer, correct=False, teacher=None):
    r = {"tokens": tokens, "topk": topk, "answer": answer, "correct": correct, "invalid": False,
         "strict_invalid": False, "decode_m": []}
    if teacher is not None:
        r["teacher"] = teacher
    return r


def test_a_margin_equal_to_the_floor_drift_is_within_it():
    """At step 1 A chose 7 over 8 by 0.25 nats; F, teacher-forced, had them tied (margin 0): the
    floor moved this margin by exactly 0.25, so A's 0.25 is within floor drift (<=)."""
    t = "test_a_margin_equal_to_the_floor_drift_is_within_it"
    top_a = [[[1, -0.125], [2, -3.0]], [[7, -0.5], [8, -0.75]]]
    lpk = [[-0.125, -3.0], [-0.5, -0.5]]
    a = _rec([1, 7], top_a, "1", teacher={"f": {"kl": [0, 0], "top1": [True, True], "lpk": lpk}})
    b = _rec([1, 8], [[[1, -0.125], [2, -3.0]], [[8, -0.5], [7, -0.625]]], "2")
    c = report.compare({0: a}, {0: b})
    floor.classify(c, {0: a}, "f")
    row = c["diffs"][0]
    assert row["margin_a"] == 0.25 and row["floor_drift"] == 0.25, (row, repro(t))
    assert row["vs_floor"] == "within floor drift", (row["vs_floor"], repro(t))


def test_a_text_only_difference_is_not_counted_as_an_answer_flip():
    """Question 0's answers differ (a flip); question 1 differs in text but gives the same answer:
    classified, but the answer-flip counts hold one row."""
    t = "test_a_text_only_difference_is_not_counted_as_an_answer_flip"
    top = [[[1, -0.125], [2, -3.0]], [[7, -0.5], [8, -0.75]]]
    lpk = [[-0.125, -3.0], [-0.5, -0.75]]
    a = {q: _rec([1, 7], top, "1", teacher={"f": {"kl": [0, 0], "top1": [True, True], "lpk": lpk}}) for q in (0, 1)}
    b_top = [[[1, -0.125], [2, -3.0]], [[8, -0.5], [7, -0.75]]]
    b = {0: _rec([1, 8], b_top, "2"), 1: _rec([1, 8], b_top, "1")}
    c = report.compare(a, b)
    floor.classify(c, a, "f")
    assert len(c["diffs"]) == 1 and len(c["text_only"]) == 1, (c, repro(t))
    assert sum(c["answer_diffs_vs_floor"].values()) == 1, (c["answer_diffs_vs_floor"], repro(t))
    assert c["identical_answers"] == 1 and c["identical_generations"] == 0, (c, repro(t))


# --- divergences: margins, near ties, classes --------------------------------------------------
def test_margins_are_each_runs_own_choice_over_the_other():
    """A: 7 at -0.5, 8 at -1.0: margin_A = 0.5; B: 8 at -0.25, 7 at -1.25: margin_B = 1.0; both
    positive (each run's argmax), both exact; the larger (1.0) is far from a near tie."""
    t = "test_margins_are_each_runs_own_choice_over_the_other"
    a = _rec([7], [[[7, -0.5], [8, -1.0]]], "1", correct=True)
    b = _rec([8], [[[8, -0.25], [7, -1.25]]], "2", correct=False)
    c = report.compare({0: a}, {0: b})
    assert (c["identical_answers"], c["answer_diffs"], c["text_only_diffs"]) == (0, 1, 0), (c, repro(t))
    d = c["diffs"][0]
    assert (d["margin_a"], d["margin_b"], d["kind"]) == (0.5, 1.0, "real"), (d, repro(t))
    assert d["class"] == "right->wrong", (d["class"], repro(t))
    d = report.compare({0: b}, {0: a})["diffs"][0]
    assert d["class"] == "wrong->right", (d["class"], repro(t))


def test_a_near_tie_needs_both_margins_small_and_exact():
    """Margins 0.0625 (A) and 0.5 (B): the larger is above 0.1 nats: real. Margins 0.0625 and
    0.03125: near-tie. A margin that is only a bound (B's token outside A's top-k): real."""
    t = "test_a_near_tie_needs_both_margins_small_and_exact"
    a = _rec([7], [[[7, -0.5], [8, -0.5625]]], "1")
    one_large = _rec([8], [[[8, -0.5], [7, -1.0]]], "2")
    assert report.compare({0: a}, {0: one_large})["diffs"][0]["kind"] == "real", repro(t)
    both_small = _rec([8], [[[8, -0.5], [7, -0.53125]]], "2")
    assert report.compare({0: a}, {0: both_small})["diffs"][0]["kind"] == "near-tie", repro(t)
    a_out = _rec([7], [[[7, -0.5], [9, -0.5625]]], "1")          # 8 not in A's top-k: a bound
    d = report.compare({0: a_out}, {0: both_small})["diffs"][0]
    assert d["margin_a_bound"] and d["kind"] == "real", (d, repro(t))


def test_the_html_colours_only_a_decided_within_green_and_a_real_flip_red():
    t = "test_the_html_colours_only_a_decided_within_green_and_a_real_flip_red"
    a = _rec([7], [[[7, -0.5], [8, -1.0]]], "1", correct=True)
    b = _rec([8], [[[8, -0.25], [7, -1.25]]], "2")
    cmp = report.compare({0: a}, {0: b})
    rep = {"model": {"id": "m"}, "a": {"label": "A"}, "b": {"label": "B"}, "backend": "emulate",
           "data": {"n": 1}, "compare": cmp, "switch_ok": True}
    for vd, cls in ((_verdict(7, 0), "verdict-fail"), (_verdict(2, 0), "verdict-fail"),
                    (_verdict(4, 3), "verdict-pass")):
        page = report.html({**rep, "verdict": vd}, "", {0: a}, {0: b})
        line = next(x for x in page.splitlines() if "verdict: " in x)
        assert f'class="{cls}"' in line, (vd["verdict"], line, repro(t))
    # the page's own rule, whoever made the verdict: an undecided one is never green
    page = report.html({**rep, "verdict": {"verdict": "within arithmetic noise", "decided": False}}, "", {0: a}, {0: b})
    assert 'class="verdict-fail">verdict: within' in page, (page, repro(t))
    assert '<tr class="fail"><td>0</td><td>right-&gt;wrong</td><td>real</td>' in page, (page, repro(t))


# --- the switch and the floor's control ----------------------------------------------------------
def test_an_m_with_zero_calls_was_not_served():
    t = "test_an_m_with_zero_calls_was_not_served"
    assert switch.by_m({"gemv": {1: 0, 2: 3}, "mmq": {"40": 1}}) == {2: {"gemv"}, 40: {"mmq"}}, repro(t)
    assert switch.differing_ms({"int_gemv": {1: 4}}, {"int_gemv": {1: 4}, "gemv": {1: 0}}) == [], repro(t)


def test_the_floor_reverses_the_last_m_of_its_range():
    """Fold range M 2-16 and F's only calls at M 16 (one M of one path): 16 is in the range, F is
    a control."""
    t = "test_the_floor_reverses_the_last_m_of_its_range"
    run = {"m_calls": {"small_mma": {16: 2}}, "teacher_m_calls": {"f": {}}}
    ra = {0: {"tokens": [1], "topk": [[[1, -0.1]]]}}
    rf = {0: {"tokens": [2], "topk": [[[2, -0.1]]]}}
    got = switch.floor_control(run, {"m_calls": {"small_mma": {16: 2}}}, ((2, 16),), 8, ra, rf)
    assert got["void"] is None and got["reversed_ms"] == 1, (got, repro(t))


def test_a_teacher_forced_top1_change_alone_is_an_output_difference():
    """F's teacher-forced KL is 0 at every step but its argmax differed at one (a tie broken the
    other way): F's outputs differ from A's."""
    t = "test_a_teacher_forced_top1_change_alone_is_an_output_difference"
    ra = {0: {"tokens": [1, 2], "topk": [[[1, -0.1]], [[2, -0.2]]],
              "teacher": {"f": {"kl": [0.0, 0.0], "top1": [True, False], "lpk": [[-0.1], [-0.2]]}}}}
    rf = {0: {"tokens": [1, 2], "topk": [[[1, -0.1]], [[2, -0.2]]]}}
    assert "top-1" in (switch._outputs_differ(ra, rf, "f") or ""), repro(t)


def test_a_step_past_the_floors_recorded_steps_has_no_drift():
    """The floor followed A for one step (lpk of step 0 only); a flip at step 1 has no recorded
    drift there: None (n/a), never an index past the record. Kills gsm8k/floor.py `step >=
    len(t["lpk"])` -> `step > len(...)`."""
    t = "test_a_step_past_the_floors_recorded_steps_has_no_drift"
    top_a = [[[1, -0.125], [2, -3.0]], [[7, -0.5], [8, -0.75]]]
    a = _rec([1, 7], top_a, "1", teacher={"f": {"kl": [0], "top1": [True], "lpk": [[-0.125, -3.0]]}})
    assert floor.floor_drift(a, "f", 1, 7, 8) is None, repro(t)
    assert floor.floor_drift(a, "f", 0, 1, 2) == 0.0, repro(t)      # step 0 is recorded: F moved nothing


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5])
def test_the_fewest_questions_refuses_an_alpha_outside_0_1(alpha):
    """At alpha <= 0 no n has 2^-n < alpha (a search for one would not end); at alpha >= 1 the
    test's p (at most 1) never needs a question: both are refused by name."""
    t = "test_the_fewest_questions_refuses_an_alpha_outside_0_1"
    try:
        floor.min_questions(alpha)
    except ValueError as e:
        assert "alpha" in str(e), (str(e), repro(t))
    else:
        pytest.fail(f"alpha {alpha} accepted; {repro(t)}")
