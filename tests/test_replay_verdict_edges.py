"""Edges of the replay's verdict (replay.evaluate): a bias statistic that is NaN fails its call,
calls each under the threshold whose pooled Z is over it fail the run, the threshold is the
two-sided Bonferroni z over two statistics per call and per kind, and a side that ran another
path than dispatch chose fails. The outputs are int_gemv's own (correct) ones, so a failure can
only come from the planted statistic or plan."""
import math
import statistics

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
