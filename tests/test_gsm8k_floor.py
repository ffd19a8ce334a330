"""The noise floor's pieces on constructed records: which Ms the floor run reverses, the
teacher-forced summary, the sign test and verdict, flips against the floor's drift, and the
batch-mate M check."""
import pytest

from pq2verify.gsm8k import floor, report


def rec(tokens, topk, answer="1", correct=False, teacher=None, decode_m=None):
    r = {"tokens": tokens, "topk": topk, "answer": answer, "correct": correct, "invalid": False,
         "strict_invalid": False, "decode_m": decode_m or []}
    if teacher is not None:
        r["teacher"] = teacher
    return r


@pytest.mark.parametrize("a,b,want", [
    ({"set": "legacy", "paths": {}}, {"set": "tuned", "paths": {"mmq_wgmma": "off"}}, ((1, 16),)),
    ({"set": "tuned", "paths": {}}, {"set": "tuned", "paths": {"mmq_wgmma": "off"}}, ((17, None),)),
    ({"set": "tuned", "paths": {}}, {"set": "tuned", "paths": {"gemv": "off"}}, ((1, 1),)),
    ({"set": "tuned", "paths": {}}, {"set": "tuned", "paths": {"small_mma": "off"}}, ((3, 16),)),   # M 2: gemv_pair
    ({"set": "tuned", "paths": {}}, {"set": "tuned", "paths": {"gemv_pair": "off"}}, ((2, 2),)),
    ({"set": "legacy", "paths": {}}, {"set": "legacy", "paths": {}}, ((1, None),)),     # nothing differs: all
])
def test_fold_ranges_are_where_b_changes_the_path(a, b, want):
    import torch
    assert floor.fold_ranges(a, b, "cpu", torch.bfloat16) == want


def test_sign_test_is_the_exact_binomial_tail():
    st = floor.sign_test({1: 2.0, 2: 2.0, 3: 2.0, 4: 1.0}, {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0})
    assert (st["above"], st["below"], st["ties"]) == (3, 0, 1) and st["p"] == 1 / 8
    st = floor.sign_test({1: 1.0, 2: 3.0}, {1: 2.0, 2: 1.0})
    assert st["p"] == 3 / 4                                   # P(X >= 1), X ~ Binomial(2, 1/2)


def _tf(kls: dict):
    return {"mean_kl": sum(kls.values()) / len(kls), "per_question": {q: {"kl": v} for q, v in kls.items()}}


def test_verdict_beyond_only_when_b_is_above_the_floor_on_most_questions():
    floor_kl = {q: 0.01 * (1 + q % 3) for q in range(12)}
    worse = floor.verdict(_tf({q: 3 * v for q, v in floor_kl.items()}), _tf(floor_kl))
    assert worse["verdict"] == "beyond arithmetic noise" and worse["p"] == 1 / 2 ** 12
    mixed = floor.verdict(_tf({q: v * (2 if q % 2 else 0.5) for q, v in floor_kl.items()}), _tf(floor_kl))
    assert mixed["verdict"] == "within arithmetic noise" and mixed["p"] > 0.5
    assert floor.verdict(None, _tf(floor_kl)) is None


def test_teacher_summary_and_largest_delta():
    top = [[[5, -0.1], [6, -2.5]], [[7, -0.3], [8, -1.5]], [[9, -0.2], [4, -3.0]]]
    t = {"kl": [0.0, 0.2, 0.1], "top1": [True, False, True], "lpk": [[-0.1, -2.5], [-0.9, -0.6], [-0.25, -2.9]]}
    s = floor.teacher({3: rec([5, 7, 9], top, teacher={"b": t})}, "b")
    assert s["tokens"] == 3 and s["mean_kl"] == pytest.approx(0.1) and s["top1"] == pytest.approx(2 / 3)
    assert s["worst"] == {"id": 3, "step": 1, "dlp": pytest.approx(0.6), "token": 7}
    assert floor.teacher({3: rec([5], top[:1])}, "b") is None            # no teacher data: no summary


def test_flips_against_the_floor_drift_at_their_step():
    # step 1: A chose 7 over 8 by 0.3; the floor moved that margin by 0.5 (within) / 0.1 (beyond)
    top_a = [[[1, -0.1], [2, -3.0]], [[7, -0.5], [8, -0.8]]]

    def a_with(drift):
        lpk = [[-0.1, -3.0], [-0.5 - drift / 2, -0.8 + drift / 2]]
        return rec([1, 7], top_a, "1", False, {"f": {"kl": [0, 0], "top1": [True, True], "lpk": lpk}})
    b = rec([1, 8], [[[1, -0.1], [2, -3.0]], [[8, -0.6], [7, -0.7]]], "2")
    for drift, want in ((0.5, "within floor drift"), (0.1, "beyond floor drift")):
        a = a_with(drift)
        c = report.compare({0: a}, {0: b})
        floor.classify(c, {0: a}, "f")
        row = c["diffs"][0]
        assert row["floor_drift"] == pytest.approx(drift) and row["vs_floor"] == want
        assert c["answer_diffs_vs_floor"][want] == 1
    out = rec([1, 9], [[[1, -0.1], [2, -3.0]], [[9, -0.6], [7, -0.7]]], "3")     # 9 not in A's top-k
    c = report.compare({0: a_with(0.5)}, {0: out})
    floor.classify(c, {0: a_with(0.5)}, "f")
    assert c["diffs"][0]["vs_floor"] == "n/a"


def test_batchmate_m_difference_before_the_divergence_is_reported():
    top = [[[1, -0.1]], [[2, -0.1]], [[3, -0.1], [4, -0.2]], [[5, -0.1]]]
    top_b = top[:2] + [[[4, -0.1], [3, -0.2]]] + top[3:]
    a = rec([1, 2, 3, 5], top, "1", decode_m=[[2, 3]])
    b_same = rec([1, 2, 4, 5], top_b, "2", decode_m=[[2, 3]])
    b_mate = rec([1, 2, 4, 5], top_b, "2", decode_m=[[2, 1], [1, 2]])     # a batch-mate stopped after step 1
    assert report.compare({0: a}, {0: b_same})["diffs"][0]["m_differs_step"] is None
    c = report.compare({0: a}, {0: b_mate})
    assert c["diffs"][0]["m_differs_step"] == 2 and c["batchmate_m_differs"] == 1


def test_markdown_shows_floor_teacher_and_verdict():
    a = rec([1], [[[1, -0.1]]], teacher={"b": {"kl": [0.5], "top1": [True], "lpk": [[-0.2]]},
                                         "f": {"kl": [0.1], "top1": [True], "lpk": [[-0.15]]}})
    c = report.compare({0: a}, {0: rec([1], [[[1, -0.1]]])})
    tf = {n: floor.teacher({0: a}, n) for n in ("b", "f")}
    rep = {"a": {"label": "A legacy"}, "b": {"label": "B tuned"},
           "model": {"id": "m", "digits": 4, "ternary": False, "rel_rms": 0.1, "max_rel_rms": 0.2},
           "data": {"source": "s", "n": 1, "format": "chat", "shots": 2, "max_new_tokens": 8, "batch_size": 1},
           "backend": "emulate", "runs": [], "compare": c, "control": None,
           "floor": {"fold_reversed_m": "1-16", "compare": report.compare({0: a}, {0: a})},
           "teacher": tf, "verdict": floor.verdict(tf["b"], tf["f"], alpha=0.6)}
    md = report.markdown(rep)
    assert "## Noise floor and teacher forcing" in md and "at M 1-16" in md
    assert "| A vs B | 1/1 | 1/1 | 0 (0 / 0) | n/a (n/a) | 0.5 | 100.00% | 0.1 (0, 0) |" in md
    assert "**Verdict: beyond arithmetic noise**" in md and "p = 0.5" in md


def test_flip_counts_come_with_their_swapped_control():
    """A/B flips are counted against F's drift and A/F flips against B's drift (against its own
    drift a run's flips are always within); the report prints both counts."""
    import copy
    top_a = [[[1, -0.1], [2, -3.0]], [[7, -0.5], [8, -0.8]]]
    lpk = [[-0.1, -3.0], [-0.55, -0.75]]            # each follower moved A's 0.3 margin by 0.1
    a = rec([1, 7], top_a, "1", False, {n: {"kl": [0, 0], "top1": [True, True], "lpk": copy.deepcopy(lpk)}
                                       for n in ("b", "f")})
    other = rec([1, 8], [[[1, -0.1], [2, -3.0]], [[8, -0.6], [7, -0.7]]], "2")
    cmp_b, cmp_f = report.compare({0: a}, {0: other}), report.compare({0: a}, {0: other})
    floor.classify(cmp_b, {0: a}, "f")
    floor.classify(cmp_f, {0: a}, "b")
    assert cmp_f["drift_of"] == "b" and cmp_f["answer_diffs_vs_floor"]["beyond floor drift"] == 1
    rep = {"compare": cmp_b, "floor": {"fold_reversed_m": "1-16", "compare": cmp_f}, "teacher": {}}
    text = "\n".join(report._floor_section(rep))
    assert "A/B answer flips against the floor's drift at their step: within 0, beyond 1" in text
    assert "A/F answer flips against B's drift at their step: within 0, beyond 1" in text
