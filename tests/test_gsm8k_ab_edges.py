"""Edges of the gsm8k A/B comparison (report.py) and of its controls (switch.py), on hand-built
records whose right answer is plain from the numbers: where the first log-probability difference
is looked for, a generation that is a strict prefix of the other, a top-k recorded for fewer steps
than the divergence, a margin exactly at the near-tie threshold, the first step whose decode M
differs, the run summary's counts and its empty case, the answer-diff and text-only counts by
kind, the median and p90 of the first margins; the call classes taken from the registry, how a
span and a prediction are written, the trace proof without teacher-forced calls, a cut list of
Ms, the fold range's ends, and the floor's three-group rule. Also the number text edges of
extract.value: a trailing period and a leading point.

Each test once let a fault injected into the code pass. Every expected value is worked out by
hand in the test's docstring, never taken from the function under test."""
from fractions import Fraction
from types import SimpleNamespace

import pytest

from pq2verify.gsm8k import extract, report, switch

F = "tests/test_gsm8k_ab_edges.py"


def repro(test: str) -> str:
    return f"reproduce: .venv/bin/python -m pytest -q -p no:randomly '{F}::{test}'"


def _rec(tokens, topk, answer="1", correct=False, decode_m=None):
    return {"tokens": tokens, "topk": topk, "answer": answer, "correct": correct, "invalid": False,
            "strict_invalid": False, "decode_m": decode_m or []}


# --- report.numeric_divergence and report.divergence ------------------------------------------
def test_a_logprob_difference_after_the_flip_step_is_not_a_numeric_divergence():
    """Three steps whose top-k agree at steps 0 and 1 and differ only at step 2 (-0.5 vs -0.75).
    Looking up to step 1 finds nothing: None, None. Looking up to step 2 finds step 2 with
    |delta| = 0.25."""
    t = "test_a_logprob_difference_after_the_flip_step_is_not_a_numeric_divergence"
    sa = [[[1, -0.5]], [[2, -0.5]], [[3, -0.5]]]
    sb = [[[1, -0.5]], [[2, -0.5]], [[3, -0.75]]]
    got = report.numeric_divergence(sa, sb, 1)
    assert got == {"numeric_step": None, "numeric_delta": None}, (got, repro(t))
    got = report.numeric_divergence(sa, sb, 2)
    assert got == {"numeric_step": 2, "numeric_delta": 0.25}, (got, repro(t))


@pytest.mark.parametrize("a_longer", [False, True], ids=["a-stops-early", "b-stops-early"])
def test_a_generation_that_stops_early_diverges_by_length(a_longer):
    """One run generated [1, 2], the other [1, 2, 3]: the shared prefix is both tokens, so the
    divergence is at step 2 = len(shorter); the shorter run has no token there (None), the longer
    one's is 3. With one token missing there is no margin on either side: None, and not a bound
    (False). The kind is 'length'."""
    t = "test_a_generation_that_stops_early_diverges_by_length"
    short = _rec([1, 2], [[[1, -0.125]], [[2, -0.25]]])
    long_ = _rec([1, 2, 3], [[[1, -0.125]], [[2, -0.25]], [[3, -0.5], [4, -1.0]]])
    ra, rb = (long_, short) if a_longer else (short, long_)
    d = report.divergence(ra, rb)
    want_a, want_b = (3, None) if a_longer else (None, 3)
    assert (d["step"], d["token_a"], d["token_b"], d["kind"]) == (2, want_a, want_b, "length"), (d, repro(t))
    assert d["margin_a"] is None and d["margin_b"] is None, (d, repro(t))
    assert d["margin_a_bound"] is False and d["margin_b_bound"] is False, (d, repro(t))


def test_a_topk_recorded_for_exactly_the_shared_steps_gives_no_margin():
    """A generated [1, 7] but recorded its top-k for step 0 only (one entry); B generated [1, 8]
    with both steps recorded. The divergence is at step 1, one past A's record: A's margin is
    unknown (None, not a bound: False). B's: 8 at -0.25 over 7 at -2.25, exactly 2.0, exact
    (False). The only known margin, 2.0, is above 0.1 nats: real."""
    t = "test_a_topk_recorded_for_exactly_the_shared_steps_gives_no_margin"
    a = _rec([1, 7], [[[1, -0.125]]])
    b = _rec([1, 8], [[[1, -0.125]], [[8, -0.25], [7, -2.25]]])
    d = report.divergence(a, b)
    assert d["step"] == 1 and d["margin_a"] is None and d["margin_a_bound"] is False, (d, repro(t))
    assert d["margin_b"] == 2.0 and d["margin_b_bound"] is False, (d, repro(t))
    assert d["kind"] == "real", (d, repro(t))


def test_a_margin_equal_to_the_near_tie_threshold_is_real():
    """near_tie 0.5. A chose 7 at -1.0 over 8 at -1.5, B chose 8 at -1.0 over 7 at -1.5: both
    margins 0.5 exactly (all values exact in binary); the larger is not below 0.5: real. With B's
    and A's other token at -1.25 both margins are 0.25 < 0.5: near-tie."""
    t = "test_a_margin_equal_to_the_near_tie_threshold_is_real"
    a = _rec([7], [[[7, -1.0], [8, -1.5]]])
    b = _rec([8], [[[8, -1.0], [7, -1.5]]])
    d = report.divergence(a, b, 0.5)
    assert (d["margin_a"], d["margin_b"], d["kind"]) == (0.5, 0.5, "real"), (d, repro(t))
    a = _rec([7], [[[7, -1.0], [8, -1.25]]])
    b = _rec([8], [[[8, -1.0], [7, -1.25]]])
    d = report.divergence(a, b, 0.5)
    assert (d["margin_a"], d["margin_b"], d["kind"]) == (0.25, 0.25, "near-tie"), (d, repro(t))


# --- report.m_differs_step ----------------------------------------------------------------------
def test_ms_that_differ_at_the_first_decode_forward_differ_at_step_1():
    """A's decode Ms [2, 2, 2] (one run of three), B's [1, 2, 2]: decode forward 0 gives the
    logits of step 1, and there the Ms are 2 vs 1: step 1."""
    t = "test_ms_that_differ_at_the_first_decode_forward_differ_at_step_1"
    a = {"decode_m": [[2, 3]]}
    b = {"decode_m": [[1, 1], [2, 2]]}
    assert report.m_differs_step(a, b, 3) == 1, repro(t)
    assert report.m_differs_step(b, a, 3) == 1, repro(t)


def test_ms_that_differ_only_at_a_later_forward_differ_at_that_step():
    """A's decode Ms [4, 4, 4, 3], B's [4, 4, 4, 4]: forwards 0..2 agree, forward 3 (step 4)
    differs: step 4, in either order. Up to step 3 only, they never differ: None."""
    t = "test_ms_that_differ_only_at_a_later_forward_differ_at_that_step"
    a = {"decode_m": [[4, 3], [3, 1]]}
    b = {"decode_m": [[4, 4]]}
    assert report.m_differs_step(a, b, 4) == 4, repro(t)
    assert report.m_differs_step(b, a, 4) == 4, repro(t)
    assert report.m_differs_step(a, b, 3) is None, repro(t)


# --- report.summarize -------------------------------------------------------------------------
def test_the_summary_counts_each_invalid_answer_once():
    """Four questions: 0 right; 1 right from the flexible answer (strict invalid); 2 wrong with
    no answer at all (invalid, strict invalid); 3 wrong, strict invalid. Correct 2 of 4 (0.5),
    invalid 1 (0.25), strict invalid 3 (0.75), tokens 3 + 2 + 4 + 1 = 10."""
    t = "test_the_summary_counts_each_invalid_answer_once"

    def r(n, correct, invalid, strict_invalid):
        return {"tokens": [5] * n, "correct": correct, "invalid": invalid, "strict_invalid": strict_invalid}
    recs = {0: r(3, True, False, False), 1: r(2, True, False, True), 2: r(4, False, True, True),
            3: r(1, False, False, True)}
    want = {"n": 4, "correct": 2, "accuracy": 0.5, "invalid": 1, "invalid_rate": 0.25, "strict_invalid": 3,
            "strict_invalid_rate": 0.75, "tokens": 10}
    assert report.summarize(recs) == want, (report.summarize(recs), repro(t))


def test_an_empty_summary_has_zero_rates():
    """No questions: nothing correct, nothing invalid; every rate is 0.0 (no division by zero,
    and no score for an empty run)."""
    t = "test_an_empty_summary_has_zero_rates"
    want = {"n": 0, "correct": 0, "accuracy": 0.0, "invalid": 0, "invalid_rate": 0.0, "strict_invalid": 0,
            "strict_invalid_rate": 0.0, "tokens": 0}
    assert report.summarize({}) == want, (report.summarize({}), repro(t))


# --- report.compare and report.first_margins ----------------------------------------------------
def _near_tie(ans_a, ans_b, ca=False, cb=False):
    """A: 7 over 8 by 0.0625; B: 8 over 7 by 0.03125; the larger is below 0.1: a near tie."""
    return (_rec([7], [[[7, -1.0], [8, -1.0625]]], ans_a, ca),
            _rec([8], [[[8, -1.0], [7, -1.03125]]], ans_b, cb))


def _real(ans_a, ans_b, ca=False, cb=False):
    """A: 7 over 8 by 1.0; B: 8 over 7 by 1.0: real."""
    return (_rec([7], [[[7, -1.0], [8, -2.0]]], ans_a, ca),
            _rec([8], [[[8, -1.0], [7, -2.0]]], ans_b, cb))


def _length(ans_a, ans_b, ca=False, cb=False, ms_a=None, ms_b=None):
    """A stops after [7], B goes on to [7, 9]: length, at step 1."""
    return (_rec([7], [[[7, -1.0]]], ans_a, ca, ms_a),
            _rec([7, 9], [[[7, -1.0]], [[9, -1.0]]], ans_b, cb, ms_b))


def test_text_only_and_answer_diffs_are_counted_by_kind():
    """Nine questions. Answers differ on four: a real right->wrong (0), a near-tie right->wrong
    (1), a near-tie both wrong (2), a length wrong->right (3): by class 2 / 1 / 1, by kind
    near-tie 2, real 1, length 1. Same answer, different text on four: a near tie (4), two real
    (5, 6), a length (7) whose decode Ms are 1 for A and 2 for B at forward 0 (step 1, the
    divergence step): text-only by kind near-tie 1, real 2, length 1. Question 8 is identical.
    Identical answers 9 - 4 = 5, identical generations 1; only question 7 has Ms that differ
    (every other divergence is at step 0 or has no Ms): 1."""
    t = "test_text_only_and_answer_diffs_are_counted_by_kind"
    pairs = [_real("1", "2", ca=True), _near_tie("1", "2", ca=True), _near_tie("1", "2"),
             _length("1", "2", cb=True),
             _near_tie("3", "3"), _real("3", "3.0"), _real("4", "4"),
             _length("5", "5", ms_a=[[1, 1]], ms_b=[[2, 1]])]
    a = {q: pa for q, (pa, _) in enumerate(pairs)}
    b = {q: pb for q, (_, pb) in enumerate(pairs)}
    a[8] = b[8] = _rec([1, 2], [[[1, -0.5]], [[2, -0.5]]], "6")
    c = report.compare(a, b)
    assert (c["n"], c["identical_answers"], c["identical_generations"]) == (9, 5, 1), (c, repro(t))
    assert (c["answer_diffs"], c["text_only_diffs"]) == (4, 4), (c, repro(t))
    assert c["by_class"] == {"right->wrong": 2, "wrong->right": 1, "both wrong": 1}, (c["by_class"], repro(t))
    assert c["by_kind"] == {"near-tie": 2, "real": 1, "length": 1}, (c["by_kind"], repro(t))
    assert c["text_only_by_kind"] == {"near-tie": 1, "real": 2, "length": 1}, (c["text_only_by_kind"], repro(t))
    assert c["batchmate_m_differs"] == 1, (c, repro(t))
    assert [d["id"] for d in c["diffs"]] == [0, 1, 2, 3] and [d["id"] for d in c["text_only"]] == [4, 5, 6, 7], repro(t)


def test_the_first_margins_median_and_p90_are_read_at_their_ranks():
    """Twenty exact margins k/4 for k = 0..19 (even k in the answer diffs, odd in the text-only
    ones), plus two bounds at -8.0 and one unknown margin, which are left out. Sorted, index
    20 // 2 = 10 holds 10/4 = 2.5 (the median) and index int(0.9 * 20) = 18 holds 18/4 = 4.5
    (the p90; 0.9 * 20 is 18.0 in binary: 0.9's error, 2e-17, times 20 is far under half an
    ulp of 18). Were the bounds counted, n would be 22 and the median 9/4."""
    t = "test_the_first_margins_median_and_p90_are_read_at_their_ranks"

    def row(m, bound=False):
        return {"margin_a": m, "margin_a_bound": bound}
    cmp = {"diffs": [row(k / 4) for k in range(0, 20, 2)] + [row(-8.0, True)],
           "text_only": [row(k / 4) for k in range(19, 0, -2)] + [row(-8.0, True), row(None)]}
    assert report.first_margins(cmp) == {"n": 20, "median": 2.5, "p90": 4.5}, (report.first_margins(cmp), repro(t))


# --- switch: the call classes -----------------------------------------------------------------
def _expected_classes(paths):
    """Independent of switch._classes: collect the cut points by a loop (1, each m_min, each
    m_max + 1 of a bounded range), pair each with the next one, and grow the K bound one 128
    at a time until every k_multiple divides it."""
    cuts = [1]
    for p in paths:
        for c in (p.m_min, None if p.m_max is None else p.m_max + 1):
            if c is not None and c not in cuts:
                cuts.append(c)
    cuts.sort()
    spans = [(lo, None if nxt is None else nxt - 1) for lo, nxt in zip(cuts, cuts[1:] + [None])]
    top = 128
    while any(top % p.k_multiple for p in paths):
        top += 128
    ks = [128 * j for j in range(1, top // 128 + 1)]
    return ks, spans


def test_the_classes_tile_the_m_axis_from_the_registrys_ranges():
    """The registry's own paths: the classes equal the loop-derived ones; the first span starts
    at M 1, the last is open, each span starts one past the previous one's end (no gap, no
    overlap); no span straddles a path's range (each is wholly inside or outside it); K runs
    128, 256, ... in steps of 128."""
    t = "test_the_classes_tile_the_m_axis_from_the_registrys_ranges"
    from pq2verify import registry
    ks, spans = switch._classes()
    assert (ks, spans) == _expected_classes(registry.PATHS), ((ks, spans), repro(t))
    assert spans[0][0] == 1 and spans[-1][1] is None, (spans, repro(t))
    for (lo, hi), (nlo, _) in zip(spans, spans[1:]):
        assert hi is not None and lo <= hi and nlo == hi + 1, (spans, repro(t))
    for p in registry.PATHS:
        for lo, hi in spans:
            inside_lo = lo >= p.m_min and (p.m_max is None or lo <= p.m_max)
            end = hi if hi is not None else 10 ** 9
            inside_hi = end >= p.m_min and (p.m_max is None or end <= p.m_max)
            assert inside_lo == inside_hi, (p.name, (lo, hi), repro(t))
    assert ks[0] == 128 and all(k == 128 * (j + 1) for j, k in enumerate(ks)), (ks, repro(t))


def test_the_classes_start_at_m_1_and_reach_the_lcm_of_the_k_multiples(monkeypatch):
    """Stand-in paths: M 4+ with K multiple 384, and M 8-11 with 256. Cuts: 1 (always), 4, 8 and
    11 + 1 = 12: spans 1-3, 4-7, 8-11, 12+ (M 1-3 has no path, yet is a class that starts at 1).
    lcm(128, 384, 256) = 128 * lcm(1, 3, 2) = 768: K 128, 256, 384, 512, 640, 768."""
    t = "test_the_classes_start_at_m_1_and_reach_the_lcm_of_the_k_multiples"
    from pq2verify import registry
    paths = (SimpleNamespace(name="wide", m_min=4, m_max=None, k_multiple=384),
             SimpleNamespace(name="mid", m_min=8, m_max=11, k_multiple=256))
    monkeypatch.setattr(registry, "PATHS", paths)
    want = ([128, 256, 384, 512, 640, 768], [(1, 3), (4, 7), (8, 11), (12, None)])
    assert _expected_classes(paths) == want, repro(t)          # the helper agrees with the hand
    assert switch._classes() == want, (switch._classes(), repro(t))


# --- switch: how spans and predictions are written -------------------------------------------
@pytest.mark.parametrize("span,text", [((1, 1), "1"), ((2, 16), "2-16"), ((17, None), "17+"), ((5, 6), "5-6")])
def test_a_span_is_one_m_a_range_or_open(span, text):
    """One M is written alone, a bounded range lo-hi, an open range lo+."""
    t = "test_a_span_is_one_m_a_range_or_open"
    assert switch._span(span) == text, repro(t)


ONE_K = {(128, (17, None)): "mmq_wgmma", (128, (1, 1)): "single", (128, (2, 16)): "small_mma"}
TWO_K = {(256, (2, None)): "mmq", (128, (1, 1)): "gemv", (256, (1, 1)): "single", (128, (2, None)): "mmq"}


def test_k_is_named_only_where_the_prediction_holds_more_than_one_k():
    """One K (128): M spans in order of lo, no K: 'M 1 single, M 2-16 small_mma, M 17+
    mmq_wgmma'. Two Ks: ordered by K then lo, each named: K 128 M 1 gemv, K 128 M 2+ mmq,
    K 256 M 1 single, K 256 M 2+ mmq."""
    t = "test_k_is_named_only_where_the_prediction_holds_more_than_one_k"
    assert switch.describe(ONE_K) == "M 1 single, M 2-16 small_mma, M 17+ mmq_wgmma", repro(t)
    assert switch.describe(TWO_K) == "K 128 M 1 gemv, K 128 M 2+ mmq, K 256 M 1 single, K 256 M 2+ mmq", repro(t)


def test_differences_name_k_only_where_the_prediction_holds_more_than_one_k():
    """One K: B runs gemv at M 1 and int_gemv at M 2-16 where A runs single and small_mma, M 17+
    alike: two lines without K. Two Ks: B differs only at K 256 M 1 (gemv for single): one line
    naming K 256. A prediction against itself: no line."""
    t = "test_differences_name_k_only_where_the_prediction_holds_more_than_one_k"
    b = {**ONE_K, (128, (1, 1)): "gemv", (128, (2, 16)): "int_gemv"}
    assert switch.differences(ONE_K, b) == ["M 1: single vs gemv", "M 2-16: small_mma vs int_gemv"], repro(t)
    b = {**TWO_K, (256, (1, 1)): "gemv"}
    assert switch.differences(TWO_K, b) == ["K 256 M 1: single vs gemv"], repro(t)
    assert switch.differences(TWO_K, dict(TWO_K)) == [], repro(t)


# --- switch: the trace proof and its lists of Ms ------------------------------------------------
def test_without_teacher_forced_calls_the_proof_has_no_teacher_ms():
    """A ran int_gemv at M 1, B gemv: free Ms [1]. No teacher-forced calls recorded: teacher_ms
    None (not checked, no error). With B teacher-forced on gemv at M 1: teacher_ms [1]."""
    t = "test_without_teacher_forced_calls_the_proof_has_no_teacher_ms"
    run_b = {"m_calls": {"gemv": {1: 4}}}
    got = switch.trace_proof({"m_calls": {"int_gemv": {1: 4}}}, run_b)
    assert got == {"ok": True, "free_ms": [1], "teacher_ms": None, "errors": []}, (got, repro(t))
    run_a = {"m_calls": {"int_gemv": {1: 4}}, "teacher_m_calls": {"b": {"gemv": {1: 4}}}}
    got = switch.trace_proof(run_a, run_b)
    assert got == {"ok": True, "free_ms": [1], "teacher_ms": [1], "errors": []}, (got, repro(t))


def test_twelve_ms_are_kept_whole_and_thirteen_are_cut_to_both_ends():
    """Ms 1..12: kept as they are. Ms 1..13: the first six (1..6) and the last six (8..13), 7
    left out."""
    t = "test_twelve_ms_are_kept_whole_and_thirteen_are_cut_to_both_ends"
    assert switch._short(list(range(1, 13))) == list(range(1, 13)), repro(t)
    assert switch._short(list(range(1, 14))) == [1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13], repro(t)
    assert switch._short([3, 40]) == [3, 40], repro(t)


# --- switch: the floor's fold range and its three-group rule --------------------------------------
@pytest.mark.parametrize("m,fold,inside", [
    (2, ((2, 16),), True), (16, ((2, 16),), True), (1, ((2, 16),), False), (17, ((2, 16),), False),
    (17, ((17, None),), True), (10 ** 6, ((17, None),), True), (16, ((17, None),), False),
    (1, ((1, 1), (17, None)), True), (5, ((1, 1), (17, None)), False),
], ids=["lo", "hi", "lo-1", "hi+1", "open-lo", "open-far", "open-lo-1", "two-ranges-first", "two-ranges-gap"])
def test_both_ends_of_a_fold_range_are_inside_it(m, fold, inside):
    """A range lo-hi holds lo and hi, not lo - 1 nor hi + 1; an open range lo+ holds lo and
    anything above it; several ranges hold what any one holds."""
    t = "test_both_ends_of_a_fold_range_are_inside_it"
    assert switch._in(m, fold) is inside, repro(t)


RA = {0: {"tokens": [1], "topk": [[[1, -0.1]]]}}
RF = {0: {"tokens": [2], "topk": [[[2, -0.1]]]}}          # F's token differs: an output difference
RUN_A = {"m_calls": {"small_mma": {16: 2}}, "teacher_m_calls": {"f": {}}}


@pytest.mark.parametrize("groups,void,differs", [(3, None, True), (2, "at most 2 K group(s)", False)])
def test_three_k_groups_are_enough_for_a_floor_and_two_are_not(groups, void, differs):
    """F reverses M 2-16 and ran small_mma at M 16 (one reversed M), its token differs from A's.
    Three groups: (a + b) + c need not equal (c + b) + a, so F is a control (void None, fold
    differs). Two: a + b == b + a, void, and the fold does not differ."""
    t = "test_three_k_groups_are_enough_for_a_floor_and_two_are_not"
    got = switch.floor_control(RUN_A, {"m_calls": {"small_mma": {16: 2}}}, ((2, 16),), groups, RA, RF)
    assert got["reversed_ms"] == 1 and got["fold_differs"] is differs, (got, repro(t))
    assert (got["void"] is None) if void is None else (void in (got["void"] or "")), (got, repro(t))


@pytest.mark.parametrize("f_calls,reversed_ms,differs", [
    ({"mmq": {17: 1}, "gemv": {1: 3}}, 0, False),
    ({"mmq": {17: 1}, "small_mma": {2: 1}}, 1, True),
], ids=["no-reversed-m", "one-reversed-m"])
def test_the_fold_differs_only_where_f_made_a_call_it_reverses(f_calls, reversed_ms, differs):
    """Fold range M 2-16, eight groups. F's calls at M 17 and M 1 are outside it: 0 reversed Ms,
    the fold does not differ (and the floor is void: no call at an M it reverses). A call at M 2
    too: 1 reversed M, the fold differs."""
    t = "test_the_fold_differs_only_where_f_made_a_call_it_reverses"
    got = switch.floor_control(RUN_A, {"m_calls": f_calls}, ((2, 16),), 8, RA, RF)
    assert got["reversed_ms"] == reversed_ms and got["fold_differs"] is differs, (got, repro(t))
    assert (got["void"] is None) is differs, (got, repro(t))


# --- extract.value: a trailing period and a leading point -----------------------------------------
@pytest.mark.parametrize("text,want", [
    ("1/2.", Fraction(1, 2)), ("-3/4.", Fraction(-3, 4)), ("18.", Fraction(18)), ("$1,800.", Fraction(1800)),
    ("-3.", Fraction(-3)), ("2.5.", Fraction(5, 2)),
])
def test_a_period_that_ends_the_number_is_dropped(text, want):
    """A sentence's period after the number is no part of it: '1/2.' is 1/2 (a fraction with a
    trailing point is no literal Fraction reads), '-3/4.' is -3/4, '18.' is 18, '$1,800.' is
    1800, '-3.' is -3, '2.5.' is 5/2."""
    t = "test_a_period_that_ends_the_number_is_dropped"
    assert extract.value(text) == want, repro(t)


def test_a_gold_fraction_that_ends_a_sentence_is_read():
    """A worked answer ending '#### 1/2.': the gold value is 1/2, written 0.5."""
    t = "test_a_gold_fraction_that_ends_a_sentence_is_read"
    assert extract.gold("Half of it.\n#### 1/2.") == "0.5", repro(t)


@pytest.mark.parametrize("text,want", [
    (".5", Fraction(1, 2)), ("-.5", Fraction(-1, 2)), ("$.75", Fraction(3, 4)), ("\u2212.25", Fraction(-1, 4)),
    (".5.", Fraction(1, 2)), (".", None),
])
def test_a_leading_point_reads_as_a_zero_before_it(text, want):
    """'.5' is 0.5 = 1/2, '-.5' is -1/2, '$.75' is 3/4, '\u2212.25' (unicode minus) is -1/4,
    '.5.' (a sentence's period too) is 1/2; a lone '.' is no number."""
    t = "test_a_leading_point_reads_as_a_zero_before_it"
    assert extract.value(text) == want, repro(t)


@pytest.mark.parametrize("text", ["..", "-..", ".", "-.", "$."])
def test_points_without_a_digit_are_no_number(text):
    """'..' loses its trailing period to '.', which a leading-zero rewrite would turn into '0.',
    i.e. 0; but no digit was ever written, so it is no number: None."""
    t = "test_points_without_a_digit_are_no_number"
    assert extract.value(text) is None, repro(t) + f" -k '{text}'"


def test_a_gold_answer_of_only_points_is_refused():
    """The dataset's gold value after '####' must be a number; '..' is none, so gold() raises
    naming it rather than scoring every answer against 0."""
    with pytest.raises(ValueError, match="no number after"):
        extract.gold("so the total is #### ..")


@pytest.mark.parametrize("decided, shown", [(None, True), (True, True), (False, False)])
def test_the_other_tail_is_named_unless_the_verdict_was_left_undecided(decided, shown):
    """A floor verdict whose other tail is significant (p_below 0.001 < alpha 0.01): the report
    names it. A verdict recorded without the 'decided' key (a report written before it existed)
    counts as decided; one marked undecided does not name the tail."""
    t = "test_the_other_tail_is_named_unless_the_verdict_was_left_undecided"
    vd = {"verdict": "within noise", "test": "sign test", "above": 1, "below": 9, "ties": 0, "p": 0.99,
          "kl_ratio": 0.5, "p_below": 0.001, "alpha": 0.01}
    if decided is not None:
        vd["decided"] = decided
    rep = {"compare": report.compare({}, {}), "teacher": {"b": {"mean_kl": None}}, "verdict": vd}
    lines = report._floor_section(rep)
    assert any(x.startswith("- the other tail:") for x in lines) is shown, (lines, repro(t))


def test_the_a_vs_b_row_is_shown_with_a_floor_and_no_teacher_forcing():
    """A floor run but no teacher-forced metrics: the A vs B row is still in the table (its
    teacher columns n/a), and so is the floor's."""
    t = "test_the_a_vs_b_row_is_shown_with_a_floor_and_no_teacher_forcing"
    cmp = report.compare({}, {})
    rep = {"compare": cmp, "floor": {"fold_reversed_m": "2-16", "compare": cmp}}
    lines = report._floor_section(rep)
    assert any(x.startswith("| A vs B |") for x in lines), (lines, repro(t))
    assert any(x.startswith("| A vs F (floor) |") for x in lines), (lines, repro(t))
