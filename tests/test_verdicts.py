"""The one verdict library (pq2verify.verdicts over the bounds of pq2verify.numerics):
- which check failed is read from its typed name, never from the message: rewording every
  failure message leaves the replay's and the selftest's attribution as it was;
- check, replay and golden all decide through it: a bound planted in the library moves the
  verdict of all three alike."""
import copy

import numpy as np
import pytest
import torch

from pq2verify import cases, checks, golden, inputs, registry, replay, replay_cli, selftest

HERE = "pytest -p no:randomly tests/test_verdicts.py"
LAYER = "model.layers.0.mlp.down_proj"
U_FP16 = 2.0 ** -11                 # fp16 unit roundoff (11 significant bits)
TOL_Q_FP16 = U_FP16 + 1e-5          # relative-RMS bound against the quantized reference (SPEC §7)


# --- replay: a run whose calls fail several checks ----------------------------------------------
def _replay_run():
    """A = int_gemv's own output (with a note that its dots= output differed), B = that output
    scaled by 1.02 with its dots off by one: B fails relative RMS, the per-element bound, the
    bias test and the dots check; A the dots= comparison."""
    w = inputs.ternary_weight(256, 256, 5, "cpu", "prepared")
    x = inputs.activations(1, 256, 6, "normal", torch.bfloat16, "cpu")
    call = replay.Call(f"{LAYER}/1", LAYER, replay.kind_of(LAYER), 1, x)
    refs = replay.References([call], {LAYER: w})
    y0 = registry.get("int_gemv").kernel()(x, w, out=torch.empty(1, 256, dtype=torch.bfloat16))
    dots = torch.from_numpy(refs.get(call, "dots")).to(torch.int64)
    a = replay.Out("int_gemv", y0, dots, "kernel", ["int_gemv: the output with dots= differs from the dispatched "
                                                    "call's"])
    b = replay.Out("int_gemv", (y0.float() * 1.02).to(torch.bfloat16), dots + 1, "kernel")
    return replay.evaluate([call], refs, [a], [b])


def _reworded(res: dict) -> dict:
    """The run with every failure message replaced by 'x' (the words only)."""
    out = copy.deepcopy(res)
    lists = [out] + out["calls"] + [r[s] for r in out["calls"] for s in ("a", "b", "ab")] + list(out["kinds"].values())
    for d in lists:
        if "failures" in d:
            d["failures"] = ["x"] * len(d["failures"])
    return out


def test_replay_counts_failed_checks_whatever_the_messages_say(cpu_only):
    res = _replay_run()
    got = replay_cli._checks_failed(res)
    names = {part.rsplit(" ", 1)[0] for part in got.split(", ")}
    assert {"rms", "elem", "bias", "dots", "dots="} <= names, f"{got}; reproduce: {HERE} -k whatever_the_messages"
    assert replay_cli._checks_failed(_reworded(res)) == got, (
        f"rewording the messages changed the failed-check counts {got!r}; reproduce: {HERE} -k whatever_the_messages")


def test_rewording_every_message_keeps_the_replays_attribution(monkeypatch, cpu_only):
    from pq2verify import verdicts
    res = _replay_run()
    monkeypatch.setattr(verdicts, "wording", lambda check, text: "x")
    again = _replay_run()
    msgs = [f for r in again["calls"] for f in r["failures"]] + [f for d in again["kinds"].values()
                                                                for f in d["failures"]]
    assert msgs and all(m in ("x", "A x", "B x") for m in msgs), msgs
    assert [r["failed"] for r in again["calls"]] == [r["failed"] for r in res["calls"]]
    assert replay_cli._checks_failed(again) == replay_cli._checks_failed(res), f"reproduce: {HERE} -k replays_attr"


# --- selftest ------------------------------------------------------------------------------------
def test_rewording_every_message_keeps_the_selftests_attribution(monkeypatch, device):
    from pq2verify import verdicts
    faults = ["neighbour_scale", "last_row"]
    before = selftest.run(["int_gemv"], faults, device=device)
    monkeypatch.setattr(verdicts, "wording", lambda check, text: "x")
    after = selftest.run(["int_gemv"], faults, device=device)
    for b, a in zip(before, after):
        assert b.caught_by and a.caught_by == b.caught_by and a.status == b.status, (
            f"{b.fault}: {b.caught_by} {b.status} -> {a.caught_by} {a.status}; reproduce: {HERE} -k selftests_attr")
        assert set(a.details) == {"x"}, a.details


def test_a_failure_names_a_known_check():
    from pq2verify import verdicts
    with pytest.raises(ValueError, match="unknown check 'rms'"):
        verdicts.Failure("rms", "made up")
    r = checks.Result(cases.Case("int_gemv", "b", 64, 384, 2, "bf16", "prepared"))
    r.fail("made up", checks.DOTS)
    assert r.failed == [checks.DOTS] and r.failures == ["made up"] and r.records[0].where == r.case.id


# --- one library: a bound planted in it moves check, replay and golden alike --------------------
class _Returns:
    """A kernel that writes `y` into out (the case's FP64-derived plant)."""

    def __init__(self, y):
        self.y = y

    def __call__(self, x, w, *, out=None, dots=None):
        return out.copy_(self.y)


def _rms_plant():
    """int_gemv on fp16 inputs (M = 2, N = 64, K = 384), and an output at about 1.5x the
    quantized relative-RMS bound: Q + 1.5 tol |Q| s, s a seeded sign, rounded to fp16."""
    p = registry.get("int_gemv")
    c = cases.seeded(cases.Case(p.name, "b", 64, 384, 2, "fp16", "prepared"))
    inp = checks.Inputs(c, "cpu")
    q = inp.reference("quantized")
    s = np.random.default_rng(1).choice([-1.0, 1.0], size=q.shape)
    y = torch.from_numpy(q + 1.5 * TOL_Q_FP16 * np.abs(q) * s).to(torch.float16)
    ratio = float(np.linalg.norm(y.double().numpy() - q) / np.linalg.norm(q)) / TOL_Q_FP16
    assert 1.2 < ratio < 1.8, f"the plant landed at {ratio:.3f}x the bound"
    return p, c, inp, y


def _verdicts_of_three(p, c, inp, y):
    """(check flags rms quantized, replay flags it, golden capture refuses the output)."""
    r = checks.evaluate(c, "cpu", checks=("rms",), inp=inp, kernel=_Returns(y))
    call = replay.Call(f"{LAYER}/1", LAYER, replay.kind_of(LAYER), 1, inp.x)
    side = replay.side_metrics(call, replay.Out(p.name, y, None), replay.References([call], {LAYER: inp.w}))
    return (checks.RMS_QUANTIZED in r.failed, checks.RMS_QUANTIZED in side["failed"],
            golden.numerics(c, inp.x, inp.w, y) is not None)


def test_a_looser_tolerance_in_the_library_passes_the_plant_in_check_replay_and_golden(monkeypatch, cpu_only):
    from pq2verify import numerics
    p, c, inp, y = _rms_plant()
    assert _verdicts_of_three(p, c, inp, y) == (True, True, True), f"reproduce: {HERE} -k looser_tolerance"
    real = numerics.tolerance
    monkeypatch.setattr(numerics, "tolerance", lambda path, dt, against: 2 * real(path, dt, against))
    assert _verdicts_of_three(p, c, inp, y) == (False, False, False), f"reproduce: {HERE} -k looser_tolerance"


def test_a_tighter_element_bound_in_the_library_fails_check_and_replay(monkeypatch, cpu_only):
    from pq2verify import numerics
    p = registry.get("int_gemv")
    c = cases.seeded(cases.Case(p.name, "b", 64, 384, 2, "bf16", "prepared"))
    inp = checks.Inputs(c, "cpu")
    y0, _ = checks.call(p, inp)
    call = replay.Call(f"{LAYER}/1", LAYER, replay.kind_of(LAYER), 1, inp.x)
    refs = replay.References([call], {LAYER: inp.w})

    def flags():
        r = checks.evaluate(c, "cpu", checks=("rms",), inp=inp)
        side = replay.side_metrics(call, replay.Out(p.name, y0, None), refs)
        return checks.PER_ELEMENT in r.failed, checks.PER_ELEMENT in side["failed"]
    assert flags() == (False, False)
    real = numerics.element_bound

    def tight(path, *a):
        b, f, h = real(path, *a)
        return b * 1e-6, f, h
    monkeypatch.setattr(numerics, "element_bound", tight)
    assert flags() == (True, True), f"reproduce: {HERE} -k tighter_element_bound"


def test_a_tighter_cross_isa_bound_in_the_library_fails_golden(monkeypatch, device):
    from pq2verify import numerics
    if device == "cuda":
        pytest.skip("the cross-ISA bound judges CPU captures (golden/interpreter); the CPU suite runs it")
    p = registry.get("native")
    c = cases.seeded(cases.Case(p.name, "b", 64, 256, 2, "bf16", "prepared"))
    x = inputs.activations(2, 256, c.seed, "normal", torch.bfloat16, "cpu")
    w = inputs.ternary_weight(64, 256, 11, "cpu", "prepared")
    want = p.kernel()(x, w, out=torch.empty(2, 64, dtype=torch.bfloat16))
    y = want.clone()
    y.view(torch.int16)[1, 3] += 1                     # one element one step away
    assert golden.compare_bound(y, want, golden.fold_bound(p, c, x, w, y, want))[0] == "within bound"
    real = numerics.cross_isa_bound
    monkeypatch.setattr(numerics, "cross_isa_bound", lambda *a: real(*a) * 1e-6)
    assert golden.compare_bound(y, want, golden.fold_bound(p, c, x, w, y, want))[0] == "different", (
        f"reproduce: {HERE} -k cross_isa")
