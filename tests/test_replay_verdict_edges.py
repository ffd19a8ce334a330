"""Edges of the replay's verdict (replay.evaluate): a bias statistic that is NaN fails its call,
calls each under the threshold whose pooled Z is over it fail the run, the threshold is the
two-sided Bonferroni z over two statistics per call and per kind, and a side that ran another
path than dispatch chose fails. The outputs are int_gemv's own (correct) ones, so a failure can
only come from the planted statistic or plan."""
import math
import statistics

import numpy as np
import pytest
import torch

from pq2verify import inputs, registry, replay, verdicts
from pq2verify.numerics import BIAS_ALPHA

F = "tests/test_replay_verdict_edges.py"
LAYER = "model.layers.0.mlp.down_proj"


def repro(test: str) -> str:
    return f"reproduce: .venv/bin/python -m pytest -q '{F}::{test}'"


def _run(n_calls=1, planned=None):
    """n_calls M = 1 calls of one layer at positions 0..n-1; A int_gemv and B gemv both return
    int_gemv's output (correct, and B != A by path)."""
    w = inputs.ternary_weight(256, 256, 5, "cpu", "prepared")
    calls, outs_a, outs_b = [], [], []
    for i in range(n_calls):
        x = inputs.activations(1, 256, 6 + i, "normal", torch.bfloat16, "cpu")
        c = replay.Call(f"{LAYER}/{i}", LAYER, replay.kind_of(LAYER), i, x)
        calls.append(c)
    refs = replay.References(calls, {LAYER: w})
    for c in calls:
        y = registry.get("int_gemv").kernel()(c.x, w, out=torch.empty(1, 256, dtype=torch.bfloat16))
        dots = torch.from_numpy(refs.get(c, "dots")).to(torch.int64)
        outs_a.append(replay.Out("int_gemv", y, dots, "kernel"))
        outs_b.append(replay.Out("gemv", y.clone(), None, "kernel"))
    return replay.evaluate(calls, refs, outs_a, outs_b, planned=planned)


@pytest.fixture
def planted_t(monkeypatch):
    """Every call's bias statistics replaced by the given (t_scale, t_offset)."""
    def plant(ts):
        monkeypatch.setattr(replay, "bias", lambda *a, **k: ts)
    return plant


def test_the_clean_run_passes(cpu_only):
    t = "test_the_clean_run_passes"
    res = _run()
    assert res["ok"] and not res["failures"], ([c["failures"] for c in res["calls"]], repro(t))


def test_the_threshold_is_two_sided_bonferroni_over_two_statistics_per_call_and_kind(cpu_only):
    """3 calls of one kind: 2 * (3 + 1) = 8 tests, z = Phi^-1(1 - alpha / 16)."""
    t = "test_the_threshold_is_two_sided_bonferroni_over_two_statistics_per_call_and_kind"
    want = statistics.NormalDist().inv_cdf(1 - BIAS_ALPHA / (2 * 8))
    assert _run(3)["bias_threshold"] == pytest.approx(want), repro(t)


def test_a_nan_bias_statistic_fails_its_call(planted_t, cpu_only):
    t = "test_a_nan_bias_statistic_fails_its_call"
    planted_t((math.nan, 0.0))
    res = _run()
    assert not res["ok"], repro(t)
    assert verdicts.BIAS in res["calls"][0]["failed"], (res["calls"][0]["failures"], repro(t))


def test_calls_each_under_the_threshold_can_be_biased_together(planted_t, cpu_only):
    """4 calls, each t = 0.9 z (under z): pooled Z = 4 * 0.9 z / sqrt(4) = 1.8 z, over it: the
    kind fails, so the run does, with no call failing on its own."""
    t = "test_calls_each_under_the_threshold_can_be_biased_together"
    z = statistics.NormalDist().inv_cdf(1 - BIAS_ALPHA / (2 * 2 * (4 + 1)))
    planted_t((0.9 * z, 0.0))
    res = _run(4)
    assert res["bias_threshold"] == pytest.approx(z), repro(t)
    assert not any(c["failures"] for c in res["calls"]), ([c["failures"] for c in res["calls"]], repro(t))
    kind = res["kinds"][replay.kind_of(LAYER)]
    assert kind["a_t_scale"] == pytest.approx(1.8 * z) and verdicts.BIAS in kind["failed"], (kind, repro(t))
    assert not res["ok"], repro(t)


def test_a_side_that_ran_another_path_than_planned_fails(cpu_only):
    t = "test_a_side_that_ran_another_path_than_planned_fails"
    res = _run(planned={"a": ["int_gemv"], "b": ["small_mma"]})
    assert not res["ok"] and verdicts.TRACE in res["calls"][0]["failed"], (res["calls"][0]["failures"], repro(t))
    assert _run(planned={"a": ["int_gemv"], "b": ["gemv"]})["ok"], repro(t)


def test_a_deterministic_path_whose_bytes_differ_from_its_own_run_fails_the_claim():
    """A and B both int_gemv (deterministic: the registry claims its bytes repeat), B's output
    one bf16 step off in one element: the claim of equal bytes fails; equal bytes pass it."""
    t = "test_a_deterministic_path_whose_bytes_differ_from_its_own_run_fails_the_claim"
    assert registry.get("int_gemv").deterministic, repro(t)
    y = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.bfloat16)
    moved = torch.tensor([[1.0, 2.0 + 2.0 ** -6, 3.0]], dtype=torch.bfloat16)     # bf16's step at 2 is 2^-6
    assert not torch.equal(y, moved), repro(t)
    a, b = replay.Out("int_gemv", y, None), replay.Out("int_gemv", moved, None)
    assert verdicts.CLAIM_AB in replay.pair_metrics(a, b, None)["failed"], repro(t)
    assert not replay.pair_metrics(a, replay.Out("int_gemv", y.clone(), None), None)["failed"], repro(t)


def _one_call(m, k, position=0):
    """One call of LAYER (N = 256) at M rows and depth K, its references and int_gemv's output."""
    w = inputs.ternary_weight(256, k, 5, "cpu", "prepared")
    x = inputs.activations(m, k, 6, "normal", torch.bfloat16, "cpu")
    c = replay.Call(f"{LAYER}/{position if m == 1 else position + '.0'}", LAYER, replay.kind_of(LAYER), position, x)
    refs = replay.References([c], {LAYER: w})
    y = registry.get("int_gemv").kernel()(x, w, out=torch.empty(m, 256, dtype=torch.bfloat16))
    return c, refs, y


def test_a_bias_statistic_exactly_at_the_threshold_passes(planted_t, cpu_only):
    """Each test is |t| <= z (BIAS_WHY): one call of one kind, 2 * (1 + 1) = 4 tests, z =
    Phi^-1(1 - alpha / 8); t = z and -z on every call (so the pooled Z = t / sqrt 1 too) is
    within. Kills replay.py `not abs(r[stat]) <= z` -> `< z` (and the pooled test's alike)."""
    t = "test_a_bias_statistic_exactly_at_the_threshold_passes"
    z = statistics.NormalDist().inv_cdf(1 - BIAS_ALPHA / (2 * 4))
    planted_t((z, -z))
    res = _run()
    assert res["bias_threshold"] == z, repro(t)
    assert res["ok"] and not res["calls"][0]["failures"], (res["calls"][0]["failures"], repro(t))


def test_the_q8_error_of_an_integer_path_is_recorded(cpu_only):
    """int_gemv is judged against the quantized reference Q, so its dense check computes the
    exact Q8 arithmetic's own error e_Q = ||Q - D|| / ||D|| (numerics.Q8_WHY); side_metrics keeps
    it. Here from the FP64 references themselves. Kills replay.py `v.q8_error is not None`
    -> `is None` (it would record None)."""
    t = "test_the_q8_error_of_an_integer_path_is_recorded"
    c, refs, y = _one_call(1, 256)
    q, d = refs.get(c, "quantized"), refs.get(c, "dense")
    want = float(np.linalg.norm((q - d).ravel()) / np.linalg.norm(d.ravel()))
    assert 0 < want < 0.1, f"precondition: Q8 differs from dense and by little ({want}); {repro(t)}"
    r = replay.side_metrics(c, replay.Out("int_gemv", y, None, "kernel"), refs)
    assert r["q8_error"] == pytest.approx(want, rel=1e-12), (r["q8_error"], want, repro(t))


def test_calls_biased_the_negative_way_together_fail_the_kind(planted_t, cpu_only):
    """The pooled test is two-sided too: 4 calls each t = -0.9 z give a pooled Z = -1.8 z, as far
    below as test_calls_each_under_the_threshold_can_be_biased_together's is above: the kind
    fails. Kills replay.py `not abs(d[...]) <= z` -> `not d[...] <= z` (only a positive
    pooled Z would fail)."""
    t = "test_calls_biased_the_negative_way_together_fail_the_kind"
    z = statistics.NormalDist().inv_cdf(1 - BIAS_ALPHA / (2 * 2 * (4 + 1)))
    planted_t((0.0, -0.9 * z))
    res = _run(4)
    assert not any(c["failures"] for c in res["calls"]), ([c["failures"] for c in res["calls"]], repro(t))
    kind = res["kinds"][replay.kind_of(LAYER)]
    assert kind["a_t_offset"] == pytest.approx(-1.8 * z) and verdicts.BIAS in kind["failed"], (kind, repro(t))
    assert not res["ok"], repro(t)


def test_batched_calls_are_pooled_at_the_smallest_m(monkeypatch, cpu_only):
    """Without M = 1 calls the pooled bias reads each weight's first call at the smallest M
    (its distinct rows are every captured row, once). Two layers of one kind, 3 captured rows
    each, batched at M = 2 and 4 (2 calls each: 8 calls, z over 2 * (8 + 1) tests); planted t =
    0.9 z on the M = 4 calls (3 distinct rows) and 0 on the M = 2 ones (2 distinct rows): each call
    is under z, the pool over the M = 2 calls is 0 and passes, where a pool over the M = 4 calls
    would be 2 * 0.9 z / sqrt 2 = 1.27 z and fail. Kills replay.py `min(r["m"] ...)` -> `max`."""
    t = "test_batched_calls_are_pooled_at_the_smallest_m"
    z = statistics.NormalDist().inv_cdf(1 - BIAS_ALPHA / (2 * 2 * (8 + 1)))
    monkeypatch.setattr(replay, "bias", lambda y64, ref, dt: (0.9 * z if y64.shape[0] == 3 else 0.0, 0.0))
    layers = [LAYER, LAYER.replace(".0.", ".1.")]
    ws = {layer: inputs.ternary_weight(256, 256, 5 + i, "cpu", "prepared") for i, layer in enumerate(layers)}
    captured = [replay.Call(f"{layer}/{p}", layer, replay.kind_of(layer), p,
                            inputs.activations(1, 256, 10 * i + p, "normal", torch.bfloat16, "cpu"))
                for i, layer in enumerate(layers) for p in range(3)]
    calls = replay.batched(captured, (2, 4))
    assert sorted(c.x.shape[0] for c in calls) == [2] * 4 + [4] * 4, repro(t)
    refs = replay.References(calls, ws)
    outs_a, outs_b = [], []
    for c in calls:
        y = registry.get("int_gemv").kernel()(c.x, ws[c.layer], out=torch.empty(c.x.shape[0], 256, dtype=torch.bfloat16))
        outs_a.append(replay.Out("int_gemv", y, None, "kernel"))
        outs_b.append(replay.Out("gemv", y.clone(), None, "kernel"))
    res = replay.evaluate(calls, refs, outs_a, outs_b)
    assert res["bias_threshold"] == pytest.approx(z), repro(t)
    assert not any(c["failures"] for c in res["calls"]), ([c["failures"] for c in res["calls"]], repro(t))
    kind = res["kinds"][replay.kind_of(LAYER)]
    assert kind["a_t_scale"] == 0.0 and res["ok"], (kind, repro(t))


def test_a_single_call_control_in_the_fold_order_of_a_is_void(cpu_only):
    """K = 128 is one group: the control's reversed order (groups G-1..0) is int_gemv's own, and
    its bits here are A's. With a single call the run fails as void on both counts and names
    that call. Kills replay.py `same_fold[0]` -> `same_fold[1]` (no second call to name)."""
    t = "test_a_single_call_control_in_the_fold_order_of_a_is_void"
    c, refs, y = _one_call(1, 128)
    fault = replay.Fault(replay.CONTROL, [LAYER], LAYER)
    res = replay.evaluate([c], refs, [replay.Out("int_gemv", y, None, "kernel")],
                          [replay.Out("gemv", y.clone(), None, "kernel")], fault)
    assert res["control"]["same_fold_as_a"] == 1 and res["control"]["outputs_differ_from_a"] == 0, (res["control"],
                                                                                                    repro(t))
    assert not res["ok"] and res["failed"] == [verdicts.VOID_CONTROL] * 2, (res["failures"], repro(t))
    assert f"e.g. {c.key}" in res["failures"][0], (res["failures"], repro(t))


def test_the_control_fold_is_judged_at_each_calls_m(cpu_only, monkeypatch):
    """The void-control check asks A's fold order at the call's M (its rows, x.shape[0] = 2),
    never at its depth (K = 256). A and B run different paths, so the A/B same-fold check asks
    no fold order (the path names differ first): the one fold_plan is the control's, at M = 2."""
    t = "test_the_control_fold_is_judged_at_each_calls_m"
    c, refs, y = _one_call(2, 256, "M2")
    asked = []
    real = replay.fold_plan

    def recording(path, m, w_, key):
        asked.append(m)
        return real(path, m, w_, key)
    monkeypatch.setattr(replay, "fold_plan", recording)
    fault = replay.Fault(replay.CONTROL, [LAYER], LAYER)
    replay.evaluate([c], refs, [replay.Out("int_gemv", y, None, "kernel")],
                    [replay.Out("small_mma", y.clone(), None, "kernel")], fault)
    assert asked == [2], (asked, repro(t))


def test_one_biased_kind_fails_the_run_when_another_kind_is_clean(monkeypatch, cpu_only):
    """Two kinds of 4 calls each: down_proj's calls each t = 0.9 z (its pooled Z = 1.8 z, over
    z), o_proj's t = 0. The run fails on down_proj's kind alone: a verdict that needed every
    kind to fail would pass it."""
    t = "test_one_biased_kind_fails_the_run_when_another_kind_is_clean"
    other = "model.layers.0.self_attn.o_proj"
    z = statistics.NormalDist().inv_cdf(1 - BIAS_ALPHA / (2 * 2 * (8 + 2)))   # two statistics, two-sided
    # n tells the weights apart: down_proj here is 256 outputs wide, o_proj 128
    monkeypatch.setattr(replay, "bias", lambda y, ref, dt: (0.9 * z, 0.0) if ref.shape[-1] == 256 else (0.0, 0.0))
    ws = {LAYER: inputs.ternary_weight(256, 256, 5, "cpu", "prepared"),
          other: inputs.ternary_weight(128, 256, 7, "cpu", "prepared")}
    calls = [replay.Call(f"{layer}/{i}", layer, replay.kind_of(layer), i,
                         inputs.activations(1, 256, 6 + i, "normal", torch.bfloat16, "cpu"))
             for layer in ws for i in range(4)]
    refs = replay.References(calls, ws)
    outs_a, outs_b = [], []
    for c in calls:
        y = registry.get("int_gemv").kernel()(c.x, ws[c.layer])
        outs_a.append(replay.Out("int_gemv", y, torch.from_numpy(refs.get(c, "dots")).to(torch.int64), "kernel"))
        outs_b.append(replay.Out("gemv", y.clone(), None, "kernel"))
    res = replay.evaluate(calls, refs, outs_a, outs_b)
    assert res["bias_threshold"] == pytest.approx(z), repro(t)
    kinds = res["kinds"]
    assert verdicts.BIAS in kinds[replay.kind_of(LAYER)]["failed"], (kinds, repro(t))
    assert not kinds[replay.kind_of(other)]["failures"], (kinds, repro(t))
    assert not any(c["failures"] for c in res["calls"]), repro(t)
    assert not res["ok"], repro(t)


@pytest.mark.parametrize("plan, want", [
    (None, "undeclared"),
    ([[[0, 1, 2, 3]]], "1 split(s) x 1 lane(s), 4 groups ascending"),
    ([[[3, 2, 1, 0]]], "1 split(s) x 1 lane(s), 4 groups descending"),
    ([[[0]], [[1]], [[2]]], "3 split(s) x 1 lane(s), 3 groups ascending"),     # one group per lane: no order
    ([[[0, 2], [1, 3]], [[4, 6], [5, 7]]], "2 split(s) x 2 lane(s), 8 groups ascending"),
    ([[[3, 2], [1]], [[0]]], "2 split(s) x 1/2 lane(s), 4 groups descending"),
    ([[[1, 0], [2, 3]]], "1 split(s) x 2 lane(s), 4 groups in mixed orders"),
])
def test_a_fold_plan_is_described_by_its_shape_and_order(plan, want):
    assert replay.describe_plan(plan) == want


def test_same_thing_rows_count_calls_and_describe_the_backends_own_fold(cpu_only):
    """Rows per (kind, M), sorted by M then kind; `same` counts the calls where A and B are one
    path in one fold order; the fold described is the one the backend key runs (the
    interpreter's config differs from the GPU's for gemv and small_mma at this shape)."""
    from kernels import emulation
    t = "test_same_thing_rows_count_calls_and_describe_the_backends_own_fold"
    down, o = "model.layers.0.mlp.down_proj", "model.layers.0.self_attn.o_proj"
    w = inputs.ternary_weight(2048, 2048, 5, "cpu", "prepared")
    calls = [replay.Call(f"{layer}/{m}.{i}", layer, replay.kind_of(layer), i,
                         torch.zeros(m, 2048, dtype=torch.bfloat16))
             for m in (4, 1) for layer in (o, down) for i in range(2)]
    b_path = {1: "gemv", 4: "small_mma"}
    paths_a = ["int_gemv"] * len(calls)
    # B equals A on o_proj's first call at each M: that call compares nothing
    paths_b = ["int_gemv" if (c.layer == o and c.position == 0) else b_path[c.x.shape[0]] for c in calls]
    rows = replay.same_thing(calls, {down: w, o: w}, paths_a, paths_b, "interpreter")
    assert [(r["m"], r["kind"]) for r in rows] == [(1, replay.kind_of(down)), (1, replay.kind_of(o)),
                                                   (4, replay.kind_of(down)), (4, replay.kind_of(o))], repro(t)
    assert [(r["calls"], r["same"]) for r in rows] == [(2, 0), (2, 1), (2, 0), (2, 1)], repro(t)
    for r in rows:
        b = b_path[r["m"]]
        mine, gpu = (emulation.kernel_plan(b, r["m"], w, interpret=i) for i in (True, False))
        assert mine != gpu, (b, r["m"])          # else this test could not tell the two apart
        # a row's fold is its first call's: o_proj's first B call is int_gemv's
        first = b if r["kind"] == replay.kind_of(down) else "int_gemv"
        want = replay.describe_plan(emulation.kernel_plan(first, r["m"], w, interpret=True))
        assert r["b_fold"] == want, (r, repro(t))
    assert rows[0]["b"] == ["gemv"] and rows[1]["b"] == ["int_gemv", "gemv"], repro(t)
