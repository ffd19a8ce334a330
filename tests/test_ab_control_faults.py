"""Faults injected into the A/B's controls and their statistics that the other tests let pass:
the floor's teacher-forced calls and outputs (gsm8k/switch.py), the order of a two-K
prediction's differences, the floor's teacher-forced summary, sign test and drift
(gsm8k/floor.py), the bench's intervals and A/A band (bench/stats.py) and its verdicts and
targets (bench/verdicts.py).

Each test names the fault it kills. Every expected value is worked out by hand in the test's
docstring, never taken from the function under test."""
import pytest

from pq2verify.gsm8k import switch

F = "tests/test_ab_control_faults.py"


def repro(test: str) -> str:
    return f"reproduce: .venv/bin/python -m pytest -q -p no:randomly '{F}::{test}'"


# --- gsm8k/switch.py: the floor's control -------------------------------------------------------
RA = {0: {"tokens": [1], "topk": [[[1, -0.1]]]}}
RF = {0: {"tokens": [2], "topk": [[[2, -0.1]]]}}          # F's token differs: an output difference


def test_a_reversed_m_met_only_teacher_forced_makes_the_floor_a_control():
    """Fold range M 2-16, eight groups. F's free run called only at M 1 (outside the range), but
    teacher-forced at A's Ms it called small_mma at M 8 (inside): one reversed M, so the fold
    differs and, its token differing from A's, F is a control (void None). Without teacher-forced
    calls for F (A's record holds only B's, at M 8): 0 reversed Ms and the floor is void, 'no
    call at an M whose fold order it reverses'. Kills both `or` -> `and` of floor_control's
    `((run_a.get("teacher_m_calls") or {}).get(follower)) or {}` (the first drops every
    teacher-forced call; the second drops them too, or fails on a missing follower)."""
    t = "test_a_reversed_m_met_only_teacher_forced_makes_the_floor_a_control"
    run_f = {"m_calls": {"gemv": {1: 5}}}
    run_a = {"m_calls": {"gemv": {1: 5}}, "teacher_m_calls": {"f": {"small_mma": {8: 3}}}}
    got = switch.floor_control(run_a, run_f, ((2, 16),), 8, RA, RF)
    assert (got["reversed_ms"], got["fold_differs"], got["void"]) == (1, True, None), (got, repro(t))
    run_a = {"m_calls": {"gemv": {1: 5}}, "teacher_m_calls": {"b": {"small_mma": {8: 3}}}}
    got = switch.floor_control(run_a, run_f, ((2, 16),), 8, RA, RF)
    assert (got["reversed_ms"], got["fold_differs"]) == (0, False), (got, repro(t))
    assert "no call at an M whose fold order it reverses" in (got["void"] or ""), (got, repro(t))


def _teacher_rec(kl, top1, lpk):
    """A's record of two steps (tokens 1, 2; A's log-probabilities -0.1, -0.2) with F's
    teacher-forced metrics; F's own generation is identical to A's."""
    a = {0: {"tokens": [1, 2], "topk": [[[1, -0.1]], [[2, -0.2]]],
             "teacher": {"f": {"kl": kl, "top1": top1, "lpk": lpk}}}}
    f = {0: {"tokens": [1, 2], "topk": [[[1, -0.1]], [[2, -0.2]]]}}
    return a, f


def test_one_step_of_teacher_forced_kl_above_zero_is_an_output_difference():
    """F's generation equals A's, its argmax agreed at both steps and its log-probability of A's
    token equals A's at both; only step 1's KL is 0.25 (step 0's is 0). One step with a KL is
    an output difference: 'teacher-forced KL or top-1 differs'. Kills `any(k != 0 ...)` ->
    `all(...)` in _outputs_differ (which needs a KL at every step)."""
    t = "test_one_step_of_teacher_forced_kl_above_zero_is_an_output_difference"
    a, f = _teacher_rec([0.0, 0.25], [True, True], [[-0.1], [-0.2]])
    assert switch._outputs_differ(a, f, "f") == "question 0: teacher-forced KL or top-1 differs", repro(t)


def test_one_step_of_a_changed_teacher_forced_logprob_is_an_output_difference():
    """As above, with KL 0 and argmax agreement at both steps, and F's log-probability of A's
    token -0.1 at step 0 (A's: -0.1, equal) and -0.3 at step 1 (A's: -0.2, differs): one step
    differs, so F's outputs differ: 'teacher-forced log-probability of A's token differs'. With
    both equal: None. Kills `any(lpk[0] != top[0][1] ...)` -> `all(...)`."""
    t = "test_one_step_of_a_changed_teacher_forced_logprob_is_an_output_difference"
    a, f = _teacher_rec([0.0, 0.0], [True, True], [[-0.1], [-0.3]])
    want = "question 0: teacher-forced log-probability of A's token differs"
    assert switch._outputs_differ(a, f, "f") == want, repro(t)
    a, f = _teacher_rec([0.0, 0.0], [True, True], [[-0.1], [-0.2]])
    assert switch._outputs_differ(a, f, "f") is None, repro(t)


def test_differences_at_two_ks_are_listed_by_k_before_m():
    """A prediction over K 128 and K 256, inserted out of order. B differs at K 128 M 2+ (int for
    mmq) and at K 256 M 1 (gemv for single). Ordered by K, then by M: K 128 M 2+ comes before
    K 256 M 1 although its M is larger. Kills the sort key `(c[0], c[1][0])` -> `(c[1], c[1][0])`
    in differences (which would list M 1 first)."""
    t = "test_differences_at_two_ks_are_listed_by_k_before_m"
    a = {(256, (2, None)): "mmq", (128, (1, 1)): "gemv", (256, (1, 1)): "single", (128, (2, None)): "mmq"}
    b = {**a, (128, (2, None)): "int", (256, (1, 1)): "gemv"}
    want = ["K 128 M 2+: mmq vs int", "K 256 M 1: single vs gemv"]
    assert switch.differences(a, b) == want, (switch.differences(a, b), repro(t))


# --- gsm8k/floor.py: the M ranges the floor reverses ---------------------------------------------
def test_a_floor_range_ends_one_before_the_next_class(monkeypatch):
    """The registry with gemv_pair widened from M 2 to M 2-3. The classes are cut at 1, at every
    m_min (1, 2, 17) and at every m_max + 1 (1 + 1 = 2, 3 + 1 = 4, 16 + 1 = 17): M 1, 2-3, 4-16,
    17+. A (tuned) runs gemv_pair where it serves (M 2-3, as it runs it at M 2 in the real
    registry), B with gemv_pair off does not; every other class resolves alike: the range M 2-3,
    ((2, 3),). Kills floor.fold_ranges' `p.m_max + 1` -> `+ 2` (cuts 3 and 5 instead of 4: M 3-4
    is then one class, resolved at M 3, and the range grows to ((2, 4),)). In the real registry
    every m_max + 1 is also some path's m_min, so there the fault reads alike."""
    t = "test_a_floor_range_ends_one_before_the_next_class"
    import dataclasses
    import torch
    from pq2verify import registry
    from pq2verify.gsm8k import floor
    from kernels import dispatch, sets

    def clear():   # dispatch and the sets cache by table; none may outlive the patched table
        dispatch.clear_cache()
        sets.clear_cache()
    paths = tuple(dataclasses.replace(p, m_max=3) if p.name == "gemv_pair" else p for p in registry.PATHS)
    monkeypatch.setattr(registry, "PATHS", paths)
    monkeypatch.setattr(registry, "BY_NAME", {p.name: p for p in paths})
    clear()
    try:
        a = {"set": "tuned", "paths": {}}
        got = floor.fold_ranges(a, {"set": "tuned", "paths": {"gemv_pair": "off"}}, "cpu", torch.bfloat16)
    finally:
        clear()
    assert got == ((2, 3),), (got, repro(t))


# --- gsm8k/floor.py: the teacher-forced summary ---------------------------------------------------
def _follow(tokens, a_lps, kl, top1, f_lps):
    """A record of A (its tokens, each with A's log-probability as its top-1) and follower f's
    teacher-forced metrics (KL, argmax agreement, f's log-probability of A's token per step)."""
    return {"tokens": tokens, "topk": [[[tk, lp]] for tk, lp in zip(tokens, a_lps)],
            "teacher": {"f": {"kl": kl, "top1": top1, "lpk": [[lp] for lp in f_lps]}}}


def test_the_per_question_metrics_are_means_over_its_steps():
    """Question 0, two steps: KL 0.5 and 0.25 (mean 0.75 / 2 = 0.375), argmax agreed at one of
    two (0.5), A's log-probabilities -0.1, -0.25 and f's -0.1, -0.5: |delta| 0 and 0.25, the
    largest at step 1. Question 1, four steps: KL 1 each (mean 1.0), agreed at all (1.0), no
    log-probability change (max 0 at step 0). Over the run: 6 tokens, KL (0.75 + 4) / 6, top-1
    5 / 6, median question KL the upper of [0.375, 1.0] = 1.0, worst question 0 at step 1 (A's
    token 2, |delta| 0.25). Kills both `/ steps` -> `* steps` in floor.teacher's per-question
    KL and top-1 (1.5 and 2.0 for question 0)."""
    t = "test_the_per_question_metrics_are_means_over_its_steps"
    from pq2verify.gsm8k import floor
    recs = {0: _follow([1, 2], [-0.1, -0.25], [0.5, 0.25], [True, False], [-0.1, -0.5]),
            1: _follow([3, 4, 5, 6], [-0.5] * 4, [1.0] * 4, [True] * 4, [-0.5] * 4)}
    got = floor.teacher(recs, "f")
    assert got["per_question"] == {0: {"kl": 0.375, "top1": 0.5, "max_dlp": 0.25, "step": 1},
                                   1: {"kl": 1.0, "top1": 1.0, "max_dlp": 0.0, "step": 0}}, (got, repro(t))
    assert (got["tokens"], got["mean_kl"], got["top1"], got["median_question_kl"]) == (6, 4.75 / 6, 5 / 6, 1.0), \
        (got, repro(t))
    assert got["worst"] == {"id": 0, "step": 1, "dlp": 0.25, "token": 2}, (got, repro(t))


def test_a_follower_with_no_steps_scored_no_tokens():
    """Every question's teacher-forced record is empty (no step followed): 0 tokens, no mean
    KL, no top-1, no worst question, no per-question row. Kills floor.teacher's `"tokens": 0`
    -> `1` in the empty case."""
    t = "test_a_follower_with_no_steps_scored_no_tokens"
    from pq2verify.gsm8k import floor
    recs = {0: _follow([], [], [], [], []), 1: _follow([], [], [], [], [])}
    got = floor.teacher(recs, "f")
    assert got == {"tokens": 0, "mean_kl": None, "top1": None, "worst": None, "per_question": {}}, (got, repro(t))


# --- gsm8k/floor.py: the sign test and the verdict --------------------------------------------------
def test_a_sign_test_with_every_question_tied_has_p_1_both_ways():
    """Two questions with equal KL under B and F (and none at all): no untied question, so no
    evidence either way: above 0, below 0, p = P(X >= 0) = 1 and p_below = 1 (both tails are the
    whole distribution). Kills the `else 1.0` -> `2.0` of sign_test's p and of its p_below."""
    t = "test_a_sign_test_with_every_question_tied_has_p_1_both_ways"
    from pq2verify.gsm8k import floor
    st = floor.sign_test({1: 1.0, 2: 0.5}, {1: 1.0, 2: 0.5})
    assert st == {"above": 0, "below": 0, "ties": 2, "p": 1.0, "p_below": 1.0}, (st, repro(t))
    st = floor.sign_test({}, {})
    assert st == {"above": 0, "below": 0, "ties": 0, "p": 1.0, "p_below": 1.0}, (st, repro(t))


def test_the_verdict_counts_untied_questions_both_ways_and_reports_the_kl_ratio():
    """B above F on two questions (KL 2 vs 1), below on one (0.5 vs 1): 2 + 1 = 3 untied, fewer
    than the 7 alpha 0.01 needs (2^-6 = 0.0156 >= 0.01, 2^-7 = 0.0078 < 0.01): too small, and
    the reason names 3 untied questions. kl_ratio is B's mean KL over F's: 0.5 / 0.25 = 2.0.
    Kills `st['above'] + st['below']` -> `-` in the reason (1 untied) and the kl_ratio's `/` ->
    `*` (0.125)."""
    t = "test_the_verdict_counts_untied_questions_both_ways_and_reports_the_kl_ratio"
    from pq2verify.gsm8k import floor
    tb = {"mean_kl": 0.5, "per_question": {1: {"kl": 2.0}, 2: {"kl": 2.0}, 3: {"kl": 0.5}}}
    tf = {"mean_kl": 0.25, "per_question": {1: {"kl": 1.0}, 2: {"kl": 1.0}, 3: {"kl": 1.0}}}
    vd = floor.verdict(tb, tf)
    assert vd["verdict"] == "too small to decide" and vd["min_questions"] == 7, (vd, repro(t))
    assert vd["reason"] == ("3 untied question(s); the sign test can reach alpha 0.01 only from 7 "
                            "(its smallest p is 2^-n)"), (vd, repro(t))
    assert vd["kl_ratio"] == 2.0, (vd, repro(t))


# --- bench/stats.py: samples, intervals and the drift bracket ---------------------------------------
def test_a_time_below_one_microsecond_is_a_sample():
    """_finite keeps every finite time above 0, however small: the control at 0.5 µs first and
    0.25 µs last is a drift ratio 0.25 / 0.5 = 0.5 (flagged: |0.5 - 1| > 0.05); old rounds of
    0.5 µs against new ones of 0.25 µs are an unpaired ratio of 2.0 at the median and both ends
    (every resample's median is 0.5 and 0.25). Kills bench/stats.py `x > 0` -> `x > 1` (no
    sample left: None)."""
    t = "test_a_time_below_one_microsecond_is_a_sample"
    from pq2verify.bench import stats
    d = stats.drift([0.5] * 3, [0.25] * 3)
    assert d is not None and (d["first"], d["last"], d["ratio"], d["flagged"]) == (0.5, 0.25, 0.5, True), \
        (d, repro(t))
    r = stats.unpaired_ratio([0.5] * 3, [0.25] * 3)
    assert r is not None and (r["median"], r["lo"], r["hi"], r["n"]) == (2.0, 2.0, 2.0, (3, 3)), (r, repro(t))


@pytest.mark.parametrize("old,new", [([], [10.0]), ([10.0], []), ([10.0, 0.0], [None, float("nan")])],
                         ids=["no-old", "no-new", "new-all-unusable"])
def test_an_unpaired_ratio_or_drift_with_one_side_empty_is_none(old, new):
    """A ratio of two runs needs a usable sample on each side: with none on either one (empty,
    or only None / NaN / 0, which _finite drops) there is no median to divide: None, for the
    unpaired ratio and for the drift bracket alike. Kills bench/stats.py `a.size == 0 or
    b.size == 0` -> `and` (a resample of an empty run raises) and drift's `not f or not la` ->
    `and` (a NaN median instead of None)."""
    t = "test_an_unpaired_ratio_or_drift_with_one_side_empty_is_none"
    from pq2verify.bench import stats
    assert stats.unpaired_ratio(old, new) is None, repro(t)
    assert stats.drift(old, new) is None, repro(t)


def test_the_relative_width_is_the_span_over_the_median():
    """An interval [3, 5] around a median 4: (5 - 3) / 4 = 0.5. Without an interval (None) or
    with a median of 0 (no relative width can be taken): inf. Kills rel_width's `/` -> `*` (8.0)
    and its `not ci or not ci.get("median")` -> `and` (None.get or a division by 0 raises)."""
    t = "test_the_relative_width_is_the_span_over_the_median"
    from pq2verify.bench import stats
    assert stats.rel_width({"median": 4.0, "lo": 3.0, "hi": 5.0}) == 0.5, repro(t)
    assert stats.rel_width(None) == float("inf"), repro(t)
    assert stats.rel_width({"median": 0.0, "lo": 0.0, "hi": 1.0}) == float("inf"), repro(t)


def test_a_per_round_ratio_that_overflows_is_no_sample():
    """Rounds t_x / t_y = 2 / 1, 2 / 1 and 1e300 / 1e-10: the last quotient is 1e310, past the
    largest double (~1.8e308), so inf: dropped. The spread is then min 2.0, max 2.0 over n = 2
    rounds. Kills bench/stats.py ratio_interval's `math.isfinite(a / b)` -> `a * b` (1e290 is
    finite: the inf ratio kept, max inf)."""
    t = "test_a_per_round_ratio_that_overflows_is_no_sample"
    from pq2verify.bench import stats
    r = stats.ratio_interval([2.0, 2.0, 1e300], [1.0, 1.0, 1e-10])
    assert (r["min"], r["max"], r["median"], r["n"]) == (2.0, 2.0, 2.0, 2), (r, repro(t))


# --- bench/verdicts.py: the tuned side, row verdicts and targets ------------------------------------
def _cfg(a="legacy", b="tuned"):
    from pq2verify.bench.plan import Config
    return Config(a=a, b=b)


def test_with_tuned_on_both_sides_or_neither_the_tuned_side_is_b():
    """The rule: B if B is tuned or A is not; A only when A alone is tuned. tuned vs tuned: B
    (B is tuned); legacy vs legacy: B (A is not tuned). Kills tuned_side's `or` -> `and` (A
    for both)."""
    t = "test_with_tuned_on_both_sides_or_neither_the_tuned_side_is_b"
    from pq2verify.bench import verdicts
    assert verdicts.tuned_side(_cfg("tuned", "tuned")) == "b", repro(t)
    assert verdicts.tuned_side(_cfg("legacy", "legacy")) == "b", repro(t)


def _bench_target(res: dict, name: str) -> dict:
    from pq2verify.bench import verdicts
    return next(x for x in verdicts.assess(res, _cfg())["targets"] if x["target"] == name)


def _step(m: int, ms: float, floor_ms: float, **extra) -> dict:
    return {"kind": "step", "key": f"step:m{m}", "m": m, "status": "timed", "floor_ms": floor_ms,
            "sides": {"b": {"time": {"median": ms}}}, **extra}


def test_a_step_at_exactly_its_floor_fraction_meets_it():
    """M=2 (no time limit), floor 0.7 ms, step 1.0 ms: 0.7 / 1.0 = 0.7, exactly the 70% wanted
    (a correctly rounded quotient of 0.7 by 1 is the double 0.7 itself): met, the needed time
    0.7 / 0.7 = 1.0 ms, 0.000 ms to spare. Kills bench/verdicts.py `pct >= want_floor` -> `>`."""
    t = "test_a_step_at_exactly_its_floor_fraction_meets_it"
    tg = _bench_target({"rows": [_step(2, 1.0, 0.7)]}, "decode step M=2: tuned")
    assert tg["met"] is True and tg["gap"] == "met with 0.000 ms to spare", (tg, repro(t))


def test_a_step_at_exactly_its_floor_fraction_misses_only_by_its_time_limit():
    """M=16, floor 1.75 ms, step 2.5 ms: 1.75 / 2.5 = 0.7 exactly (the double nearest 0.7, the
    70% wanted: the fraction is met), but 2.5 ms is over the 2.1 ms limit: not met. The needed
    time is min(1.75 / 0.7 = 2.5, 2.1) = 2.1 ms, 0.4 ms short, and the gap names the time limit
    alone. Kills `pct < want_floor` -> `<=` (which would also list '70.0% < 70% of floor')."""
    t = "test_a_step_at_exactly_its_floor_fraction_misses_only_by_its_time_limit"
    tg = _bench_target({"rows": [_step(16, 2.5, 1.75)]}, "decode step M=16: tuned")
    assert tg["met"] is False, (tg, repro(t))
    assert tg["gap"] == "0.400 ms too slow (needs <= 2.100 ms): 2.500 ms > 2.1 ms", (tg, repro(t))


def test_a_step_exactly_8x_faster_than_bf16_is_not_over_8x():
    """The M=1 BF16 target wants a step *over* 8x faster: B's step 0.2 ms against BF16's 1.6 ms,
    a median ratio of exactly 8.0, is not over it: not met, needing <= 1.6 / 8 = 0.2 ms, having
    0.2 ms. Kills bench/verdicts.py `sp["median"] > TARGET_STEP_M1_VS_BF16` -> `>=`."""
    t = "test_a_step_exactly_8x_faster_than_bf16_is_not_over_8x"
    row = _step(1, 0.2, 0.19, ratios={"b_over_bf16": {"median": 8.0, "lo": 7.9, "hi": 8.1}})
    row["sides"]["bf16"] = {"time": {"median": 1.6}}
    tg = _bench_target({"rows": [row]}, "decode step M=1: tuned over 8x faster than the BF16 step")
    assert tg["met"] is False and tg["gap"] == "needs <= 0.200 ms, has 0.200 ms", (tg, repro(t))
    assert tg["got"] == "8.00x (BF16 1.60 ms)", (tg, repro(t))


def test_an_untimed_prefill_row_names_its_note():
    """A prefill row with no ratio over BF16, not blocked, carrying a note and no error: the
    target is unmeasured (met None) and its gap is the note. Kills bench/verdicts.py
    `r.get("note") or r.get("error") or "not timed"` -> `and` (None: the note lost)."""
    t = "test_an_untimed_prefill_row_names_its_note"
    from pq2verify.bench.plan import PREFILL_M
    row = {"kind": "shape", "key": f"shape:x:m{PREFILL_M}", "shape": "x", "m": PREFILL_M, "status": "skipped",
           "note": "over the memory budget", "sides": {"b": {"path": "mmq_wgmma"}}, "ratios": {}}
    tg = _bench_target({"rows": [row]}, f"prefill M={PREFILL_M} x: mmq_wgmma >= 1.25x cuBLAS BF16")
    assert tg["met"] is None and tg["gap"] == "over the memory budget", (tg, repro(t))


def test_a_side_faster_than_streaming_its_bytes_reads_bytes_over_gb_per_s_in_microseconds():
    """4 MB at 4000 GB/s: 4e6 B / (4000 * 1e3 B/µs) = 1 µs to stream; rounds of 0.5 µs are 2x
    faster than that in every round: median and interval 2.0. Kills bench/verdicts.py
    `bw * 1e3` -> `bw * 1001.0` (1.998x)."""
    t = "test_a_side_faster_than_streaming_its_bytes_reads_bytes_over_gb_per_s_in_microseconds"
    from pq2verify.bench import verdicts
    ci = verdicts._faster_than_bandwidth({"bytes": 4_000_000, "rounds": [0.5] * 5}, 4000.0)
    assert (ci["median"], ci["lo"], ci["hi"], ci["n"]) == (2.0, 2.0, 2.0, 5), (ci, repro(t))


def test_a_row_with_equal_sides_is_marked_not_timed_and_a_throttled_row_is_listed():
    """A shape row with status 'same' (A and B resolve alike) and no ratio: verdict 'A == B, not
    timed'; a timed row without a B-over-A ratio gets no verdict. A row whose timing read a
    throttle reason in 3 of 9 rounds, dropped: listed as 'shape:t:m1: 3 of 9 rounds read a
    throttle reason (dropped)'. Kills judge's `status == "same"` -> `!=` and the throttled
    line's `+` -> `-`."""
    t = "test_a_row_with_equal_sides_is_marked_not_timed_and_a_throttled_row_is_listed"
    from pq2verify.bench import verdicts
    same = {"kind": "shape", "key": "shape:s:m1", "status": "same", "sides": {}}
    timed = {"kind": "shape", "key": "shape:u:m1", "status": "timed", "sides": {}}
    hot = {"kind": "shape", "key": "shape:t:m1", "status": "timed", "sides": {},
           "timing": {"throttled": 3, "rounds": 9, "dropped": True}}
    j = verdicts.judge({"rows": [same, timed, hot]})
    assert same["verdict"] == "A == B, not timed" and "verdict" not in timed, (same, timed, repro(t))
    assert j["throttled"] == ["shape:t:m1: 3 of 9 rounds read a throttle reason (dropped)"], (j, repro(t))


def test_a_step_at_exactly_its_time_limit_is_within_it():
    """M=16, limit 2.1 ms. Step 2.1 ms on a floor of 2.1 ms: 100% of the floor and not over the
    limit: met, the needed time min(2.1 / 0.7, 2.1) = 2.1 ms, 0.000 ms to spare. Step 2.1 ms on
    a floor of 1.05 ms: 1.05 / 2.1 = 0.5 exactly (2.1 is twice 1.05 as doubles too), 50% < 70%:
    not met, needing 1.05 / 0.7 = 1.5 ms, and the gap names the fraction alone (2.1 ms is not
    over 2.1 ms). Kills bench/verdicts.py `ms <= max_ms` -> `<` and `ms > max_ms` -> `>=` in the
    gap's list."""
    t = "test_a_step_at_exactly_its_time_limit_is_within_it"
    tg = _bench_target({"rows": [_step(16, 2.1, 2.1)]}, "decode step M=16: tuned")
    assert tg["met"] is True and tg["gap"] == "met with 0.000 ms to spare", (tg, repro(t))
    tg = _bench_target({"rows": [_step(16, 2.1, 1.05)]}, "decode step M=16: tuned")
    assert tg["met"] is False, (tg, repro(t))
    assert tg["gap"] == "0.600 ms too slow (needs <= 1.500 ms): 50.0% < 70% of floor", (tg, repro(t))


def test_the_tuned_vs_legacy_target_counts_the_faster_pairs():
    """Two tuned/legacy pairs: gemv at 2.0x of int_gemv (faster), small_mma at 0.5x of int_gemv
    (slower): '1 of 2 faster' (2 pairs - 1 slower), not met. Kills assess's `len(pairs) -
    len(slow)` -> `+` ('3 of 2 faster')."""
    t = "test_the_tuned_vs_legacy_target_counts_the_faster_pairs"

    def row(shape, path, med):
        return {"kind": "shape", "key": f"shape:{shape}:m2", "shape": shape, "m": 2, "status": "timed",
                "sides": {"a": {"path": "int_gemv"}, "b": {"path": path}},
                "ratios": {"b_over_a": {"median": med, "lo": med * 0.9, "hi": med * 1.1, "min": med * 0.8,
                                        "max": med * 1.2, "n": 9}}}
    tg = _bench_target({"rows": [row("x", "gemv", 2.0), row("y", "small_mma", 0.5)]},
                       "every tuned path faster than its legacy counterpart")
    assert tg["got"] == "1 of 2 faster" and tg["met"] is False, (tg, repro(t))


def test_a_needed_time_equal_to_the_speed_of_light_is_not_below_it():
    """M=2, floor 0.7 ms, step 1.0 ms: needed 0.7 / 0.7 = 1.0 ms; the best SOL read is 1.0 ms
    too, so the target needs 1.0 / 1.0 = 100% of its speed, reachable: the gap does not say
    'below the speed of light'. Kills bench/verdicts.py `need < sol["ms"]` -> `<=`."""
    t = "test_a_needed_time_equal_to_the_speed_of_light_is_not_below_it"
    row = _step(2, 1.0, 0.7, sol={"sol_x": {"time": {"median": 1.0}, "pct_floor": 0.7}}, sol_best="sol_x")
    tg = _bench_target({"rows": [row]}, "decode step M=2: tuned")
    assert tg["gap"] == ("met with 0.000 ms to spare; SOL (best of the sweep: sol_x) 1.000 ms, the target "
                         "needs 100% of its speed"), (tg, repro(t))


def _aa_row(key, rounds):
    return {"kind": "aa", "key": key, "status": "timed", "ratios": {"a2_over_a": {"median": 1.0, "lo": 0.99, "hi": 1.01}},
            "sides": {"a": {"rounds": rounds}}}


def test_a_suspicious_step_side_names_its_paths_and_drift_lines_give_the_change():
    """Band [0.99, 1.01] (the A/A row). A step's B side, which ran gemv for two projections and
    small_mma for one (no single 'path'), is over its best SOL read by [2.0, 2.0]: beyond the
    band, listed as 'step:m1 b gemv+small_mma: ...' (the set of its paths, sorted, joined by
    '+'). A row's control drift of ratio 1.25 (10 -> 12.5 µs) reads '+25.0%' (1.25 - 1), and the
    run's A/A control at 8 µs first and 10 µs last is 10 / 8 = 1.25: '+25.0%' too. Kills judge's
    `side.get("path") or "+".join(...)` -> `and` (None named) and, in both drift lines,
    `ratio - 1` -> `ratio + 1` or `ratio - 2`."""
    t = "test_a_suspicious_step_side_names_its_paths_and_drift_lines_give_the_change"
    from pq2verify.bench import verdicts
    step = {"kind": "step", "key": "step:m1", "m": 1, "status": "timed", "sol_best": "sol_x",
            "sides": {"b": {"paths": {"q": "gemv", "o": "small_mma", "k": "gemv"}, "time": {"median": 1.0}}},
            "ratios": {"b_over_sol_x": {"median": 2.0, "lo": 2.0, "hi": 2.0}}}
    drifted = {"kind": "shape", "key": "shape:d:m1", "status": "timed", "sides": {},
               "timing": {"control": "a", "drift": {"first": 10.0, "last": 12.5, "ratio": 1.25, "flagged": True,
                                                    "tol": 0.05}}}
    j = verdicts.judge({"rows": [_aa_row("aa", [8.0] * 3), step, drifted, _aa_row("aa:last", [10.0] * 3)]})
    assert j["suspicious"] == ["step:m1 b gemv+small_mma: 2.00x [2.00-2.00] faster than the speed of light "
                               "(sol_x) by more than the noise: skipped work or a cached result?"], (j, repro(t))
    assert j["drift"] == ["shape:d:m1: control a 10 -> 12.5 (+25.0%, beyond 5%)",
                          "run: the A/A control 8 µs at the start, 10 µs at the end (+25.0%, beyond 5%)"], \
        (j["drift"], repro(t))
