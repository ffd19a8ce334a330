"""The diff and divergence logic on constructed generations."""
from pq2verify.gsm8k import report


def rec(tokens, answer, correct, topk=None):
    return {"tokens": tokens, "answer": answer, "correct": correct, "invalid": answer is None,
            "strict_invalid": False, "topk": topk or [[[t, -0.1]] for t in tokens]}


def steps(*pairs):
    """topk per step from [(token, logprob), ...] lists."""
    return [list(map(list, p)) for p in pairs]


def test_identical():
    a = rec([1, 2, 3], "5", True)
    assert report.divergence(a, dict(a)) is None
    c = report.compare({0: a}, {0: dict(a)})
    assert c["identical_answers"] == 1 and c["identical_generations"] == 1 and c["answer_diffs"] == 0


def test_near_tie_flip_right_to_wrong():
    top_a = steps([(1, -0.1)], [(7, -0.70), (8, -0.72)])       # A chose 7 over 8 by 0.02
    top_b = steps([(1, -0.1)], [(8, -0.69), (7, -0.74)])       # B chose 8 over 7 by 0.05
    a = rec([1, 7, 9], "12", True, top_a)
    b = rec([1, 8, 9], "13", False, top_b)
    d = report.divergence(a, b, 0.1)
    assert d["step"] == 1 and d["token_a"] == 7 and d["token_b"] == 8
    assert abs(d["margin_a"] - 0.02) < 1e-9 and abs(d["margin_b"] - 0.05) < 1e-9
    assert d["kind"] == "near-tie"
    c = report.compare({3: a}, {3: b}, decode=lambda t: "".join(f"<{x}>" for x in t))
    assert c["answer_diffs"] == 1 and c["by_class"]["right->wrong"] == 1 and c["by_kind"]["near-tie"] == 1
    row = c["diffs"][0]
    assert row["id"] == 3 and row["prefix"] == "<1>" and row["text_a"] == "<7>"


def test_real_divergence_wrong_to_right():
    top_a = steps([(5, -0.01), (6, -3.0)])
    top_b = steps([(6, -0.2), (5, -1.9)])
    a = rec([5], "1", False, top_a)
    b = rec([6], "2", True, top_b)
    d = report.divergence(a, b)
    assert d["kind"] == "real" and d["margin_a"] > 2
    assert report.answer_class(a, b) == "wrong->right"


def test_other_token_outside_topk_is_a_bound_and_real():
    a = rec([5], "1", False, steps([(5, -0.01), (9, -0.02)]))
    b = rec([6], "3", False, steps([(6, -0.01), (9, -0.03)]))
    d = report.divergence(a, b)
    assert d["margin_a_bound"] and d["margin_b_bound"]
    assert d["kind"] == "real"                 # a bound is never a near tie
    assert report.answer_class(a, b) == "both wrong"


def test_same_answer_different_text_and_length():
    a = rec([1, 2, 3], "6", True)
    b = rec([1, 2, 3, 4], "6.00", True)
    c = report.compare({0: a}, {0: b})
    assert c["answer_diffs"] == 0 and c["text_only_diffs"] == 1
    assert c["text_only"][0]["kind"] == "length"


def test_threshold_is_respected():
    a = rec([7], "1", True, steps([(7, -0.5), (8, -0.65)]))
    b = rec([8], "2", False, steps([(8, -0.5), (7, -0.52)]))
    assert report.divergence(a, b, 0.1)["kind"] == "real"       # A's margin 0.15
    assert report.divergence(a, b, 0.2)["kind"] == "near-tie"


def test_numeric_divergence_precedes_the_token_flip():
    top_a = steps([(1, -0.1)], [(2, -0.30)], [(7, -0.5), (8, -0.9)])
    top_b = steps([(1, -0.1)], [(2, -0.25)], [(8, -0.4), (7, -0.6)])
    d = report.divergence(rec([1, 2, 7], "1", False, top_a), rec([1, 2, 8], "2", False, top_b))
    assert d["step"] == 2 and d["numeric_step"] == 1 and abs(d["numeric_delta"] - 0.05) < 1e-9


def test_html_puts_the_two_generations_side_by_side():
    """Each differing question's row holds A's and B's whole generations and the shared prefix;
    the verdict and the Markdown summary are on the page."""
    from pq2verify.gsm8k import report as rpt
    d = {"id": 7, "class": "both wrong", "kind": "real", "step": 3, "prefix": "She has 3 apples and <b>"}
    rep = {"compare": {"diffs": [d], "text_only": [], "identical_answers": 4, "n": 5, "answer_diffs": 1},
           "verdict": {"verdict": "within arithmetic noise"}, "model": {"id": "m@1"}, "a": {"label": "A legacy"},
           "b": {"label": "B tuned"}, "backend": "emulate", "data": {"n": 5}, "switch_ok": True}
    recs_a = {7: {"text": "She has 3 apples and 2 pears, 5 in all. #### 5"}}
    recs_b = {7: {"text": "She has 3 apples and 4 pears, 7 in all. #### 7"}}
    page = rpt.html(rep, "# GSM8K answer diff\n\n| a | b |\n|---|---|\n| 1 | 2 |\n", recs_a, recs_b)
    row = page[page.index("<td>7</td>"):]
    row = row[:row.index("</tr>")]
    assert "2 pears, 5 in all" in row and "4 pears, 7 in all" in row and "&lt;b&gt;" in row
    assert "within arithmetic noise" in page and "4 of 5 answers identical" in page and "<table>" in page


def test_a_bound_margin_is_the_token_over_the_last_of_the_top_k():
    # A's top-k lacks B's token 6: A's margin is at least lp(5) - lp(last kept) = -0.01 - -0.02
    a = rec([5], "1", False, steps([(5, -0.01), (9, -0.02)]))
    b = rec([6], "3", False, steps([(6, -0.01), (9, -0.03)]))
    d = report.divergence(a, b)
    assert abs(d["margin_a"] - 0.01) < 1e-12 and abs(d["margin_b"] - 0.02) < 1e-12


def test_one_exact_small_margin_and_one_bound_is_real_not_a_near_tie():
    a = rec([5], "1", False, steps([(5, -0.70), (6, -0.72)]))      # exact: 0.02
    b = rec([6], "3", False, steps([(6, -0.01), (9, -0.03)]))      # bound: >= 0.02, 5 not in B's top-k
    d = report.divergence(a, b, 0.1)
    assert not d["margin_a_bound"] and d["margin_b_bound"]
    assert d["kind"] == "real"


def test_a_token_missing_from_its_own_top_k_has_no_margin():
    a = rec([5], "1", False, steps([(7, -0.01), (6, -0.02)]))      # 5 chosen, not recorded
    b = rec([6], "3", False, steps([(6, -0.01), (5, -0.03)]))
    d = report.divergence(a, b, 0.1)
    assert d["margin_a"] is None and d["margin_a_bound"] is False
    assert abs(d["margin_b"] - 0.02) < 1e-12 and d["kind"] == "near-tie"


def test_the_numeric_delta_is_the_largest_over_the_shared_tokens():
    sa = steps([(1, -0.1), (2, -0.5), (3, -0.9)])
    sb = steps([(1, -0.2), (2, -0.8), (4, -2.0)])
    got = report.numeric_divergence(sa, sb, 0)
    assert got["numeric_step"] == 0 and abs(got["numeric_delta"] - 0.3) < 1e-12


def test_an_answer_on_one_side_only_is_an_answer_difference():
    a = rec([1, 2], "5", True)
    b = rec([1, 3], None, False)
    assert report.answer_class(a, b) == "right->wrong" and report.answer_class(b, a) == "wrong->right"
    c = report.compare({0: a}, {0: b})
    assert c["answer_diffs"] == 1 and c["text_only_diffs"] == 0
    assert report.answer_class(rec([1], None, False), rec([2], None, False)) is None


def test_the_text_of_each_side_at_the_divergence_or_stopped():
    dec = lambda t: "".join(f"<{x}>" for x in t)     # noqa: E731
    c = report.compare({0: rec([1, 7], "2", True)}, {0: rec([1, 8], "3", False)}, decode=dec)
    row = c["diffs"][0]
    assert (row["prefix"], row["text_a"], row["text_b"]) == ("<1>", "<7>", "<8>")
    c = report.compare({0: rec([1, 7], "2", True)}, {0: rec([1], "2", True)}, decode=dec)
    row = c["text_only"][0]
    assert row["kind"] == "length" and (row["text_a"], row["text_b"]) == ("<7>", "(stopped)")
