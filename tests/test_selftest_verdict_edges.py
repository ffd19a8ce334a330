"""The judging logic of the self-tests at its edges, without running a kernel: how
selftest.try_fault turns the checks' findings into a verdict (caught, UNDETECTED, control,
FALSE ALARM, error, n/a, known hole), the summary and table built from verdicts, which faults
are n/a where, which detectors run where, the bounds the edge plants aim at; the bench
self-test's attribution of its timing checks; and the reference self-checks failing on a
reference broken in the way each one guards. Every expected value is derived here by hand."""
import math
import os
import types
from dataclasses import replace

import numpy as np
import pytest
import torch

from pq2verify import golden, registry, selfcheck, selftest
from pq2verify.bench import selftest as bench_selftest

HERE = "tests/test_selftest_verdict_edges.py"


# --- selftest.try_fault: the verdict from what the checks found ------------------------------
def _ctx(name="int_gemv", device="cpu", entry=("g1",), no_golden=""):
    """A Context without its inputs (try_fault reads the path, device, case id, golden entry and
    detectors only; the detectors below are fakes)."""
    ctx = object.__new__(selftest.Context)
    ctx.p, ctx.device, ctx.g = registry.get(name), device, None
    ctx.entry = {"id": entry[0]} if entry else None
    ctx.no_golden = no_golden
    ctx.case = types.SimpleNamespace(id="case-1")
    ctx._baseline = {}
    return ctx


def _detector(hits=(), plant="", fire=True, base=(), raises=None, log=None):
    """A check: on the unbroken path (kernel None) it reports `base`; on the broken one it
    counts a call into the fault (fire), leaves a plant note, and reports `hits`."""
    def detect(ctx, kernel):
        if log is not None:
            log.append("base" if kernel is None else "broken")
        if kernel is None:
            return [(c, f"{c}: on the real path") for c in base]
        if raises:
            raise raises
        if fire:
            kernel.fired += 1
        if plant:
            kernel.state["planted"] = plant
        return [(c, f"{c} flagged it") for c in hits]
    return detect


def _fault(target="", control=False, plain=False, name="planted"):
    return selftest.Fault(name, "a fault of this test", lambda *a: None, plain=plain, target=target,
                          control=control)


def _try(monkeypatch, fault, *detectors, ctx=None):
    # names the filter in Context.detectors keeps on the CPU for an integer PQ2 path with golden
    names = ("evaluate", "fold", "golden", "in-place")
    monkeypatch.setattr(selftest, "DETECTORS", tuple(zip(names, detectors)))
    return selftest.try_fault(ctx or _ctx(), fault)


def test_a_caught_fault_lists_each_check_once_in_the_order_found(monkeypatch):
    v = _try(monkeypatch, _fault(), _detector(["written", "per-element"]), _detector(["written", "dots"]))
    assert v.status == "caught" and v.caught_by == ["written", "per-element", "dots"], v
    assert v.details == ["written flagged it", "per-element flagged it", "written flagged it", "dots flagged it"]
    assert v.cases == ["case-1", "g1"] and v.reason == ""
    assert v.repro == "pq2verify --device cpu selftest --paths int_gemv --faults planted"


def test_a_fault_no_check_flags_is_undetected_and_says_whether_it_was_injected(monkeypatch):
    v = _try(monkeypatch, _fault(), _detector(), _detector(fire=False))
    assert (v.status, v.reason) == ("UNDETECTED", "no check failed"), v
    v = _try(monkeypatch, _fault(), _detector(fire=False), _detector(fire=False))
    assert (v.status, v.reason) == ("UNDETECTED", "never injected: no check made the call this fault needs"), v
    v = _try(monkeypatch, _fault(), _detector(), ctx=_ctx(entry=None, no_golden="no golden case here"))
    assert (v.status, v.reason) == ("UNDETECTED", "no check failed (no golden case here)") and v.cases == ["case-1"]


def test_an_edge_fault_counts_only_when_its_own_check_flags_it(monkeypatch):
    f = _fault(target="per-element")
    v = _try(monkeypatch, f, _detector(["rms dense"], plant="y[0, 1] at 1.100x"), _detector(["rms dense"]))
    assert v.status == "UNDETECTED" and v.caught_by == ["rms dense"], v
    assert v.reason == "per-element did not flag it (y[0, 1] at 1.100x); caught only by rms dense"
    v = _try(monkeypatch, f, _detector(plant="P"))
    assert (v.status, v.reason) == ("UNDETECTED", "per-element did not flag it (P)"), v
    v = _try(monkeypatch, f, _detector(["rms dense", "per-element"], plant="P"))
    assert v.status == "caught" and v.cell() == "per-element (P); also rms dense", v


def test_the_first_plant_note_is_kept_when_a_later_check_makes_none(monkeypatch):
    v = _try(monkeypatch, _fault(target="per-element"), _detector(["per-element"], plant="first"),
             _detector(["per-element"]), _detector(["per-element"], plant="third"))
    assert v.planted == "first", v


def test_a_control_passes_only_while_its_target_check_passes_it(monkeypatch):
    f = _fault(target="per-element", control=True)
    v = _try(monkeypatch, f, _detector(["written"], plant="P"))
    assert v.status == "control" and v.ok and v.cell() == "control: per-element passed it (P); flagged by written"
    v = _try(monkeypatch, f, _detector(["per-element"], plant="P"))
    assert v.status == "FALSE ALARM" and not v.ok and v.reason == "per-element flagged a plant inside its bound (P)"


def test_a_check_failing_the_unbroken_path_makes_an_error_and_credits_nothing(monkeypatch):
    log = []
    v = _try(monkeypatch, _fault(), _detector(["written"], log=log), _detector(["dots"], base=["rms dense"], log=log))
    assert v.status == "error" and v.reason == "the unbroken path already fails rms dense: rms dense: on the real path"
    assert v.caught_by == [] and not v.ok
    assert log == ["base", "broken", "base"]      # the failing check's broken run never happens


def test_a_crash_in_a_check_is_an_error_not_a_catch(monkeypatch):
    v = _try(monkeypatch, _fault(), _detector(["written"]), _detector(raises=RuntimeError("boom")))
    assert (v.status, v.reason, v.caught_by) == ("error", "raised RuntimeError: boom", [])


def test_an_inert_fault_is_an_error_and_an_inert_element_control_is_na(monkeypatch):
    monkeypatch.setattr(selftest, "_inert", lambda ctx, fault: "no bit changed on case-1")
    log = []
    v = _try(monkeypatch, _fault(plain=True), _detector(["written"], log=log))
    assert (v.status, v.reason) == ("error", "fault inert: no bit changed on case-1") and log == []
    v = _try(monkeypatch, _fault(plain=True, target="per-element", control=True), _detector(log=log))
    assert v.status == "n/a" and log == [] and v.reason.startswith(
        "n/a: no output of case-1 has a representable value other than the path's own within 0.7-0.98x")
    v = _try(monkeypatch, _fault(plain=True, target="rms dense", control=True), _detector(log=log))
    assert (v.status, v.reason) == ("error", "fault inert: no bit changed on case-1")


def test_a_not_applicable_fault_runs_no_check(monkeypatch):
    log = []
    v = _try(monkeypatch, selftest.BY_NAME["host_value"], _detector(["graph mutation"], log=log))
    assert (v.status, v.reason, v.caught_by, log) == ("n/a", "n/a on cpu: needs CUDA graphs", [], [])


def test_the_counterpart_fault_nothing_can_see_is_a_known_hole_only_with_golden(monkeypatch):
    f = selftest.BY_NAME["as_counterpart"]          # plain=False: no inert call of a kernel
    v = _try(monkeypatch, f, _detector(), ctx=_ctx("small_gemm"))
    assert v.status == "known hole" and v.reason.startswith("no check can see it on cpu: "), v
    v = _try(monkeypatch, f, _detector(), ctx=_ctx("small_gemm", entry=None, no_golden="no capture"))
    assert v.status == "UNDETECTED" and v.reason == "no check failed (no capture)", v


# --- the fault wrappers, on a stand-in for the path's run (no kernel) ---------------------------
class _Fake:
    """A Broken whose path's run returns the next of `outs` written into `out` (or a new tensor)."""

    def __init__(self, *outs, path="int_gemv"):
        self.outs, self.fired, self.state, self.seen = list(outs), 0, {}, []
        self.path = registry.get(path)

    def real(self, x, w, out=None, dots=None):
        self.seen.append((x, w, out, dots))
        y = self.outs.pop(0).clone()
        if out is None:
            return y
        out.copy_(y)
        return out


def _grid(m, n, start=0.0):
    return torch.arange(start, start + m * n, dtype=torch.float32).reshape(m, n).to(torch.bfloat16)


@pytest.mark.parametrize("m, n, rows, cols", [(20, 40, slice(4, 20), slice(8, 40)), (3, 5, slice(0, 3), slice(0, 5))])
def test_the_stale_tile_is_the_last_16_by_32_of_the_previous_call(m, n, rows, cols):
    a, b = _grid(m, n), _grid(m, n, start=1000.0)
    fake = _Fake(a, b)
    x = torch.zeros(m, 128)
    first = selftest._stale_tile(fake, x, None, None, None)
    assert torch.equal(first, a) and fake.fired == 0
    second = selftest._stale_tile(fake, x, None, None, None)
    want = b.clone()
    want[rows, cols] = a[rows, cols]
    assert torch.equal(second, want) and fake.fired == 1


def test_the_stale_tile_needs_a_previous_call_of_the_same_shape():
    fake = _Fake(_grid(4, 8), _grid(2, 8, start=100.0))
    selftest._stale_tile(fake, torch.zeros(4, 128), None, None, None)
    y = selftest._stale_tile(fake, torch.zeros(2, 128), None, None, None)
    assert torch.equal(y, _grid(2, 8, start=100.0)) and fake.fired == 0


def test_rows_shifted_down_by_one():
    a = _grid(3, 4)
    y = selftest._rows_shifted(_Fake(a), torch.zeros(3, 128), None, None, None)
    assert torch.equal(y, torch.stack([a[0], a[0], a[1]]))


@pytest.mark.parametrize("fault, index", [("last_row", (-1, slice(None))), ("last_col", (slice(None), -1))])
def test_unwritten_keeps_what_the_buffer_held_or_nan(fault, index):
    a = _grid(3, 4)
    x = torch.zeros(3, 128, dtype=torch.bfloat16)
    w = torch.zeros(4, 128)                              # a dense weight: N from its rows
    y = selftest.BY_NAME[fault].apply(_Fake(a), x, w, None, None)
    want = a.clone()
    want[index] = float("nan")
    assert torch.equal(torch.isnan(y), torch.isnan(want)) and torch.equal(y.nan_to_num(7.0), want.nan_to_num(7.0))
    out = torch.full((3, 4), -2.0, dtype=torch.bfloat16)
    y = selftest.BY_NAME[fault].apply(_Fake(a), x, w, out, None)
    want = a.clone()
    want[index] = -2.0
    assert y is out and torch.equal(y, want)


def test_one_store_past_the_end_only_into_a_guarded_buffer():
    a = _grid(2, 3)
    buf = torch.zeros(8, dtype=torch.bfloat16)
    y = selftest._past_the_end(_Fake(a), torch.zeros(2, 128), None, buf[:6].view(2, 3), None)
    assert torch.equal(buf[:6].view(2, 3), a) and buf[6] == a[-1, -1] and buf[7] == 0
    exact = torch.zeros(6, dtype=torch.bfloat16)
    fake = _Fake(a)
    selftest._past_the_end(fake, torch.zeros(2, 128), None, exact.view(2, 3), None)
    assert fake.fired == 0 and torch.equal(exact.view(2, 3), a)
    # room for exactly one more element is enough
    buf = torch.zeros(7, dtype=torch.bfloat16)
    fake = _Fake(a)
    selftest._past_the_end(fake, torch.zeros(2, 128), None, buf[:6].view(2, 3), None)
    assert fake.fired == 1 and buf[6] == a[-1, -1]


def test_nan_activations_reach_the_path_as_zeros():
    x = torch.ones(2, 128)
    x[1, 3] = float("nan")
    fake = _Fake(_grid(2, 4))
    selftest._nan_finite(fake, x, None, None, None)
    sent = fake.seen[0][0]
    assert sent[1, 3] == 0 and not torch.isnan(sent).any() and fake.fired == 1 and torch.isnan(x[1, 3])
    fake = _Fake(_grid(2, 4))
    selftest._nan_finite(fake, torch.ones(2, 128), None, None, None)
    assert fake.fired == 0


@pytest.mark.parametrize("layout", ["raw", "prepared"])
def test_pick_and_the_neighbour_scale_fault_move_whole_groups(layout):
    from pq2verify import inputs
    from reference import pq2
    w = inputs.ternary_weight(3, 384, seed=5, layout=layout)

    def parts(v):
        codes, scales = pq2.read(v.data.numpy(), layout=v.layout, n=v.n, k=v.k)
        return codes.reshape(3, -1, 128).astype(np.float64) - 1, scales.astype(np.float64)
    signed, s = parts(w)
    got = selftest._pick(w, [2, 0])                       # groups 2 and 0, in that order
    # marked validated: a kernel call would otherwise read the bytes back on the host, which a CUDA
    # graph capture (the graph checks run the fault inside one) cannot do
    assert (got.n, got.k, got.layout, got.checked) == (3, 256, layout, True)
    c2, s2 = parts(got)
    assert np.array_equal(c2.reshape(3, 2, 128), signed[:, [2, 0]]) and np.array_equal(s2, s[:, [2, 0]])
    fake = _Fake(_grid(2, 3))
    selftest._neighbour_scale(fake, torch.zeros(2, 384), w, None, None)
    c3, s3 = parts(fake.seen[0][1])
    assert np.array_equal(c3, signed) and np.array_equal(s3, s[:, [1, 2, 0]]) and fake.fired == 1


@pytest.mark.parametrize("sign", [1, -1])
def test_the_element_plant_on_a_zero_row_sits_at_its_bound_of_min_normals(sign):
    """x = 0: Y = 0 and S = 0, so the per-element bound is (terms + 2) * 2^-126 (terms = 2 groups)
    = 2^-124 plus half its bf16 spacing 2^-131: 128.5 steps of 2^-131. From an output of 141 steps
    the candidates (one to six steps away, never the output itself) nearest 1.1x are 142 steps
    (1.105x) and 140 (1.089x): 142 is taken. A negative output moves the same way, away from 0."""
    from pq2verify import inputs
    step = 2.0 ** -131
    y0 = torch.full((1, 4), sign * 141 * step, dtype=torch.bfloat16)
    fake = _Fake(y0)
    x = torch.zeros(1, 256, dtype=torch.bfloat16)
    w = inputs.ternary_weight(4, 256, seed=1, layout="raw")
    y = selftest.BY_NAME["element_beyond"].apply(fake, x, w, None, None)
    want = y0.clone()
    want[0, 0] = sign * 142 * step
    assert torch.equal(y, want) and fake.fired == 1
    assert fake.state["planted"] == f"y[0, 0] at {142 / 128.5:.3f}x of its per-element bound"


def test_the_counterpart_answers_and_the_path_fills_the_dots_its_counterpart_lacks(monkeypatch):
    calls = []

    def cp_run(x, w, *, out):                      # a counterpart kernel without dots
        calls.append(x.shape)
        return out.fill_(3.0)
    cp = types.SimpleNamespace(kernel=lambda: cp_run, has_dots=False)
    real_get = registry.get
    monkeypatch.setattr(registry, "get", lambda name: cp if name == "cp" else real_get(name))
    x, w = torch.zeros(2, 256), torch.zeros(4, 256)
    fake = _Fake(torch.full((2, 4), 5.0))
    fake.path = types.SimpleNamespace(counterpart="cp")
    dots = torch.zeros(2, 4, 2)
    y = selftest._as_counterpart(fake, x, w, None, dots)
    assert torch.equal(y, torch.full((2, 4), 3.0)) and len(calls) == 1 and fake.fired == 1
    # the dots from the path's own run, its output into a scratch buffer (y is the counterpart's)
    assert len(fake.seen) == 1 and fake.seen[0][3] is dots and fake.seen[0][2] is not y
    fake = _Fake(torch.full((2, 4), 5.0))
    fake.path = types.SimpleNamespace(counterpart="cp")
    selftest._as_counterpart(fake, x, w, None, None)
    assert fake.seen == [] and len(calls) == 2      # no dots asked: the path itself is not run


# --- which faults are n/a where, which detectors run where --------------------------------------
NO_QUANTIZED = "n/a: a floating path has no quantized reference (its bound is the dense one)"


@pytest.mark.parametrize("fault, path, device, why", [
    ("neighbour_scale", "cublas", "cpu", "n/a: a dense weight has no group scales"),
    ("neighbour_scale", "int_gemv", "cpu", ""),
    ("rows_shifted", "gemv", "cpu", "n/a: the path serves M=1 only (no other row to shift)"),
    ("rows_shifted", "int_gemv", "cpu", ""),
    ("rows_shifted", "mmq", "cpu", ""),                     # no M limit
    ("rms_quantized_beyond", "native", "cpu", NO_QUANTIZED),
    ("rms_quantized_inside", "small_gemm", "cpu", NO_QUANTIZED),
    ("rms_quantized_beyond", "int_gemv", "cpu", ""),
    ("rms_dense_beyond", "native", "cpu", ""),
    ("as_counterpart", "int_gemv", "cpu", "n/a: a legacy path has no counterpart"),
    ("as_counterpart", "mmq_planes", "cpu", "n/a: the path claims bytes == mmq; being equal to it is what it must be"),
    ("as_counterpart", "gemv", "cpu", ""),
    ("host_value", "int_gemv", "cuda", ""),
    ("host_value", "int_gemv", "cpu", "n/a on cpu: needs CUDA graphs"),
    ("fold_order", "int_gemv", "cpu", ""),
    ("ulp", "cublas", "cpu", ""),
])
def test_not_applicable(fault, path, device, why):
    assert selftest.BY_NAME[fault].not_applicable(registry.get(path), device) == why


def test_fold_order_is_na_on_a_path_that_claims_no_determinism():
    p = replace(registry.get("int_gemv"), deterministic=False)
    assert selftest.BY_NAME["fold_order"].not_applicable(p, "cpu") == "n/a: the path does not claim determinism"


@pytest.mark.parametrize("name, device, entry, want", [
    ("int_gemv", "cpu", ("g1",), ["evaluate", "fold", "golden", "in-place"]),
    ("int_gemv", "cuda", ("g1",), ["evaluate", "golden", "in-place", "graph"]),
    ("int_gemv", "cpu", None, ["evaluate", "fold", "in-place"]),
    ("native", "cpu", ("g1",), ["evaluate", "golden", "in-place"]),        # floating: no declared fold
    ("cublas", "cuda", None, ["evaluate", "in-place", "graph"]),
])
def test_detectors_by_device_path_and_golden(name, device, entry, want):
    assert [n for n, _ in _ctx(name, device, entry).detectors()] == want


def test_golden_entry_prefers_most_groups_then_m_of_two_or_more_then_smallest_m(monkeypatch):
    es = [{"id": "a", "k": 256, "m": 4}, {"id": "b", "k": 512, "m": 1}, {"id": "d", "k": 512, "m": 2},
          {"id": "c", "k": 512, "m": 8}, {"id": "c2", "k": 512, "m": 2}]
    monkeypatch.setattr(golden, "selected", lambda g, paths=None, ids=None: es)
    assert selftest.golden_entry(None, registry.get("int_gemv"))["id"] == "c2"
    monkeypatch.setattr(golden, "selected", lambda g, paths=None, ids=None: es[:2])
    assert selftest.golden_entry(None, registry.get("int_gemv"))["id"] == "b"
    monkeypatch.setattr(golden, "selected", lambda g, paths=None, ids=None: [])
    assert selftest.golden_entry(None, registry.get("int_gemv")) is None


# --- the bounds the edge plants aim at (derived by hand from SPEC §7's constants) ---------------
def test_spacing_of_bf16_and_fp16_down_to_the_subnormals():
    v = np.array([1.0, -1.5, 2.0, 2.0 ** -130])
    assert selftest._spacing(v, torch.bfloat16).tolist() == [2.0 ** -7, 2.0 ** -7, 2.0 ** -6, 2.0 ** -133]
    v = np.array([1.0, 1000.0, 2.0 ** -20])
    assert selftest._spacing(v, torch.float16).tolist() == [2.0 ** -10, 0.5, 2.0 ** -24]


def test_row_tolerances():
    p_int, p_flt = registry.get("int_gemv"), registry.get("native")
    q, d = np.array([[3.0, 4.0]]), np.array([[3.0, 5.0]])
    u_bf, u_h = 2.0 ** -8 + 1e-5, 2.0 ** -11 + 1e-5
    sub = 2.0 ** -134 * math.sqrt(2) / 5                         # half subnormal step * sqrt(n) / ||q||
    refs = {"quantized": q, "dense": d}
    assert selftest._row_tol(p_int, "quantized", torch.bfloat16, refs, 0) == pytest.approx(u_bf + sub, rel=1e-12)
    # the dense bound of an integer path: the Q8 error plus u, scaled by ||q|| / ||d||, at least 0.03
    want = 1 / math.sqrt(34) + (u_bf + sub) * 5 / math.sqrt(34)
    assert selftest._row_tol(p_int, "dense", torch.bfloat16, refs, 0) == pytest.approx(want, rel=1e-12)
    close = {"quantized": q, "dense": np.array([[3.0, 4.001]])}
    assert selftest._row_tol(p_int, "dense", torch.bfloat16, close, 0) == 0.03
    # a floating path is judged on the dense reference with u alone, whichever is asked
    sub_d = 2.0 ** -25 * math.sqrt(2) / math.sqrt(34)
    assert selftest._row_tol(p_flt, "dense", torch.float16, refs, 0) == pytest.approx(u_h + sub_d, rel=1e-12)
    # a row of subnormal size: the absolute half spacing dominates
    tiny = {"quantized": np.array([[2.0 ** -130, 0.0]]), "dense": np.array([[2.0 ** -130, 0.0]])}
    assert selftest._row_tol(p_int, "quantized", torch.bfloat16, tiny, 0) == pytest.approx(
        u_bf + 2.0 ** -4 * math.sqrt(2), rel=1e-12)


# --- summary, counts, cells, the text table and the markdown grid ----------------------------
def _v(fault, path, status, **kw):
    return selftest.Verdict(fault=fault, path=path, status=status, **kw)


def test_summary_counts_each_status_and_is_ok_only_without_a_failing_one():
    n = {"caught": 1, "UNDETECTED": 2, "known hole": 3, "n/a": 4, "error": 5, "control": 6, "FALSE ALARM": 7}
    vs = [_v("ulp", "gemv", s) for s, k in n.items() for _ in range(k)]
    assert selftest.summary(vs) == {"ok": False, **n}
    line = selftest.text_table(vs).splitlines()[-1]
    assert line == ("1 caught, 2 undetected, 3 known holes, 5 errors, 4 n/a, 6 controls passed, "
                    "7 false alarms")
    for bad in ("UNDETECTED", "error", "FALSE ALARM"):
        assert selftest.summary([_v("ulp", "gemv", "caught"), _v("ulp", "mmq", bad)])["ok"] is False, bad
    good = [_v("ulp", "gemv", s) for s in ("caught", "n/a", "control", "known hole")]
    assert selftest.summary(good)["ok"] is True


@pytest.mark.parametrize("kw, cell", [
    (dict(status="caught", caught_by=["written", "dots"]), "written, dots"),
    (dict(status="caught", caught_by=["rms dense", "per-element", "written"], target="per-element", planted="P"),
     "per-element (P); also rms dense, written"),
    (dict(status="caught", caught_by=["per-element"], target="per-element", planted="P"), "per-element (P)"),
    (dict(status="control", caught_by=[], target="rms dense", planted="P"), "control: rms dense passed it (P)"),
    (dict(status="n/a", reason="n/a: why"), "n/a: why"),
    (dict(status="UNDETECTED", reason="no check failed"), "UNDETECTED: no check failed"),
    (dict(status="error"), "error"),
    (dict(status="known hole", reason="why"), "known hole: why"),
])
def test_cells(kw, cell):
    assert _v("f", "p", **kw).cell() == cell


def test_the_text_table_aligns_columns_and_gives_a_repro_only_for_failures():
    vs = [_v("ulp", "int_gemv", "caught", caught_by=["per-element", "written"], repro="R1"),
          _v("last_row", "gemv", "UNDETECTED", reason="no check failed", repro="R2"),
          _v("host_value", "gemv", "n/a", reason="n/a on cpu: needs CUDA graphs", repro="R3"),
          _v("ulp", "gemv", "error", reason="raised X", repro="R4"),
          _v("element_inside", "gemv", "FALSE ALARM", target="per-element", reason="flagged", repro="R5"),
          _v("as_counterpart", "gemv", "known hole", reason="why", repro="R6")]
    want = ["fault           path      caught by",
            "--------------  --------  ---------",
            "ulp             int_gemv  per-element, written",
            "last_row        gemv      UNDETECTED: no check failed",
            " " * 28 + "reproduce: R2",
            "host_value      gemv      n/a on cpu: needs CUDA graphs",
            "ulp             gemv      error: raised X",
            " " * 28 + "reproduce: R4",
            "element_inside  gemv      FALSE ALARM: flagged",
            " " * 28 + "reproduce: R5",
            "as_counterpart  gemv      known hole: why",
            "1 caught, 1 undetected, 1 known holes, 1 errors, 1 n/a, 0 controls passed, 1 false alarms"]
    assert selftest.text_table(vs).splitlines() == want


def test_markdown_and_html_leave_a_cell_blank_where_a_fault_was_not_tried_on_a_path():
    vs = [_v("ulp", "gemv", "caught", caught_by=["per-element"]), _v("ulp", "mmq", "caught", caught_by=["dots"]),
          _v("last_row", "gemv", "caught", caught_by=["written"])]
    md = selftest.markdown(vs)
    rows = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert rows == ["| fault | gemv | mmq |", "| ulp | per-element | dots |", "| last_row | written |  |"]
    assert f"torch: {torch.__version__}" in md          # the provenance line names what ran it
    page = selftest.html(vs)
    assert ('<tr class=""><td>ulp</td><td>per-element</td><td>dots</td></tr>' in page
            and '<tr class=""><td>last_row</td><td>written</td><td></td></tr>' in page), page
    # the faults' descriptions, written out here
    assert ("<td>ulp</td><td>one output element off by 1 ulp</td>" in page
            and "<td>last_row</td><td>the last output row left unwritten</td>" in page), page


# --- the bench self-test's attribution ---------------------------------------------------------
AA = {"lo": 0.99, "hi": 1.01}        # the A/A interval: within 1% of 1


def _bench_caught(times, info=None, aa=AA):
    return bench_selftest._caught("f", times, {"after": {}, **(info or {})}, aa)


def test_the_sol_is_the_fastest_read_of_each_round():
    # reads of 10 and 9 µs: the SOL is 9; a kernel at 9.5 µs is slower than it, one at 8 faster
    assert _bench_caught({"sol": [10.0] * 5, "sol2": [9.0] * 5, "f": [9.5] * 5}) == []
    assert _bench_caught({"sol": [10.0] * 5, "sol2": [9.0] * 5, "f": [8.0] * 5}) == ["faster than SOL"]
    assert _bench_caught({"sol": [9.0] * 5, "f": [8.0] * 5}, aa=None) == ["faster than SOL"]
    assert _bench_caught({"sol": None, "f": [8.0] * 5}) == []          # no SOL timed: no such check
    assert _bench_caught({"sol": [9.0] * 5, "f": None}) == []          # the contestant not timed: none either
    # exactly as fast as the SOL (ratio 1, the edge of an A/A band of 1) is not faster than it
    assert _bench_caught({"sol": [9.0] * 5, "f": [9.0] * 5}, aa=None) == []


def test_faster_than_sol_must_leave_the_aa_noise_band():
    wide = {"lo": 0.9, "hi": 1.2}
    # 9 / 8.5 = 1.059: above 1 and above the band's low edge, inside its high edge: not a finding
    assert _bench_caught({"sol": [9.0] * 5, "f": [8.5] * 5}, aa=wide) == []
    assert _bench_caught({"sol": [9.0] * 5, "f": [7.0] * 5}, aa=wide) == ["faster than SOL"]   # 1.286


def test_checks_after_timing_drift_and_throttle_are_named_in_order():
    info = {"after": {"f": {"output": {"ok": False}, "inputs": {"ok": True}, "wall clock": {"ok": False}},
                      "a": {"fresh input": {"ok": False}}},
            "bracket": {"first": [10.0, 10.0, 10.0], "last": [11.0, 11.0, 11.0]},      # 10% slower: drift
            "throttled": [4, 5]}
    got = bench_selftest._caught("f", {"sol": [9.0] * 3, "f": [8.0] * 3}, info, AA)
    assert got == ["check after timing: output", "check after timing: wall clock", "faster than SOL",
                   "drift bracket", "throttle flags"]
    calm = {"after": {}, "bracket": {"first": [10.0] * 3, "last": [10.4] * 3}, "throttled": []}   # 4% < 5%
    assert bench_selftest._caught("f", {"f": [8.0] * 3}, calm, AA) == []


def test_throttled_samples_slow_down_after_the_set_sample():
    class T:
        per = 7

        def sample(self, reps, during=None):
            return 10.0

    state = {"n": 0, "hot": False, "at": 2}
    t = bench_selftest.Throttled(T(), state)
    assert [t.sample(1) for _ in range(4)] == [10.0, 10.0, 12.5, 12.5] and state["hot"] and t.per == 7


def test_the_sampler_reports_a_power_cap_and_low_clocks_only_when_hot():
    state = {"hot": False}
    s = bench_selftest._sampler(state)
    assert s.read() == {"sm_mhz": 1980, "throttle": 0}
    state["hot"] = True
    assert s.read() == {"sm_mhz": 1584, "throttle": 0x04}
    assert bench_selftest._sampler(None).read() == {"sm_mhz": 1980, "throttle": 0}


class _Kit:
    """Timers that time nothing: scenario's verdict logic with canned times (_time patched)."""
    sol_kinds = ("sol", "sol2")

    def __init__(self, refuses=False):
        self.kinds, self.closed, self.refuses = [], 0, refuses

    def resolution_refuses(self):
        return self.refuses

    def timer(self, kind):
        self.kinds.append(kind)
        kit = self

        class T:
            per = 1

            def close(self):
                kit.closed += 1
        return T()


def _canned(monkeypatch, f, info=None, seen=None):
    def fake_time(timers, st, sampler, compare):
        if seen is not None:
            seen.update(timers=timers, sampler=sampler)
        return {"a": [10.0] * 5, "a2": [10.0] * 5, "f": f}, {"after": {}, **(info or {})}
    monkeypatch.setattr(bench_selftest, "_time", fake_time)


def test_a_fault_caught_only_by_a_check_not_meant_for_it_is_missed(monkeypatch):
    _canned(monkeypatch, [10.0] * 5, {"throttled": [3]})
    row = bench_selftest.scenario(_Kit(), "cached_output", bench_selftest.Settings())
    assert row["caught_by"] == ["throttle flags"] and row["ok"] is False
    res = {"rows": [row]}
    assert bench_selftest.lines(res)[1].endswith(
        "MISSED (expected: check after timing: fresh input or check after timing: output or faster than SOL)")


def test_the_clean_control_fails_when_any_check_fires(monkeypatch):
    _canned(monkeypatch, [10.0] * 5, {"throttled": [3]})
    kit = _Kit()
    row = bench_selftest.scenario(kit, bench_selftest.CLEAN, bench_selftest.Settings())
    assert row["ok"] is False and row["expected"] == []
    assert bench_selftest.lines({"rows": [row]})[1].endswith(" FALSE ALARM")
    assert kit.kinds == ["good", "good", "good", "sol", "sol2"] and kit.closed == 5
    _canned(monkeypatch, [10.0] * 5)
    row = bench_selftest.scenario(_Kit(), bench_selftest.CLEAN, bench_selftest.Settings())
    assert row["ok"] is True and bench_selftest.lines({"rows": [row]})[1].endswith(" ok (no check fired)")


@pytest.mark.parametrize("refuses, want", [(True, ["A/A indistinguishable", "A/B resolution"]),
                                           (False, ["A/A indistinguishable"])])
def test_a_disguised_control_is_named_by_the_aa_verdict_and_the_resolution(monkeypatch, refuses, want):
    _canned(monkeypatch, [10.0] * 5)               # B times exactly as A: within the noise
    row = bench_selftest.scenario(_Kit(refuses), "control_disguise", bench_selftest.Settings())
    assert row["caught_by"] == want and row["ok"] and row["note"] == "B over A within noise"
    assert bench_selftest.lines({"rows": [row]})[1].endswith(" caught  [B over A within noise]")
    _canned(monkeypatch, [5.0] * 5)                # B twice as fast: a real difference, not the control
    row = bench_selftest.scenario(_Kit(refuses), "control_disguise", bench_selftest.Settings())
    assert "A/A indistinguishable" not in row["caught_by"] and row["note"] == "B over A faster"


def test_the_throttle_starts_after_warmup_bracket_and_half_the_rounds(monkeypatch):
    seen = {}
    _canned(monkeypatch, [10.0] * 5, seen=seen)
    kit = _Kit()
    bench_selftest.scenario(kit, "throttle_midway", bench_selftest.Settings(pairs=9, warmup=2))
    assert kit.kinds == ["good", "good", "good"]    # no SOL read: it would only add samples
    state = next(iter(seen["timers"].values())).state
    # 3 timers: 2 warm-up rounds (6 samples), the 3-sample bracket, 9 // 2 = 4 rounds (12 samples)
    assert state["at"] == 6 + 3 + 12 and all(isinstance(t, bench_selftest.Throttled) for t in seen["timers"].values())


def test_run_puts_the_clean_control_first(monkeypatch):
    _canned(monkeypatch, [10.0] * 5)
    res = bench_selftest.run(_Kit(), faults=["side_stream"])
    assert [r["fault"] for r in res["rows"]] == [bench_selftest.CLEAN, "side_stream"] and res["ok"] is False


def test_the_table_row_names_every_check_that_fired():
    rows = [{"fault": "half_weights", "expected": ["x"], "caught_by": ["check after timing: output", "faster than SOL"],
             "ok": True, "note": ""},
            {"fault": "side_stream", "expected": ["a", "b"], "caught_by": [], "ok": False, "note": "n"}]
    got = bench_selftest.lines({"rows": rows})
    assert got[1] == f"{'half_weights':<22} {'check after timing: output, faster than SOL':<70} caught"
    assert got[2] == f"{'side_stream':<22} {'-':<70} MISSED (expected: a or b)  [n]"


def test_the_disguise_is_refused_only_when_the_resolution_finds_the_sides_equal(monkeypatch):
    from pq2verify.bench import resolve
    seen = []

    def preflight(cfg, plan, device, refuse):
        seen.append((cfg.a, cfg.b, cfg.ms, os.environ.get("PQ2_PATH_INT_GEMV"), device))
        if refuse:
            raise resolve.SameSides("same")
        return {}
    monkeypatch.delenv("PQ2_PATH_INT_GEMV", raising=False)
    monkeypatch.setattr(resolve, "preflight", lambda *a: preflight(*a, refuse=False))
    assert bench_selftest.disguise_refused("cpu") is False
    monkeypatch.setattr(resolve, "preflight", lambda *a: preflight(*a, refuse=True))
    assert bench_selftest.disguise_refused("cpu") is True
    # legacy vs tuned at M=1, with the tuned set's M=1 served by int_gemv; the variable is gone after
    assert seen == [("legacy", "tuned", (1,), "on", "cpu")] * 2 and "PQ2_PATH_INT_GEMV" not in os.environ


def test_env_vars_restores_what_was_there(monkeypatch):
    monkeypatch.setenv("PQ2_TEST_KEPT", "before")
    monkeypatch.delenv("PQ2_TEST_NEW", raising=False)
    with bench_selftest.env_vars(PQ2_TEST_KEPT="during", PQ2_TEST_NEW="during"):
        assert (os.environ.get("PQ2_TEST_KEPT"), os.environ.get("PQ2_TEST_NEW")) == ("during", "during")
    assert (os.environ.get("PQ2_TEST_KEPT"), os.environ.get("PQ2_TEST_NEW")) == ("before", None)


# --- the reference self-checks fail on a reference broken the way each guards ------------------
def _selfcheck(monkeypatch, module, name, wrap):
    from reference import metrics, pq2, projection, q8
    mod = {"pq2": pq2, "q8": q8, "projection": projection, "metrics": metrics}[module]
    monkeypatch.setattr(mod, name, wrap(getattr(mod, name)))
    return {n: ok for n, ok, _ in selfcheck.run_all()}


def _q8_with(change):
    def wrap(real):
        def quantize(a, **kw):
            qz = real(a, **kw)
            a64 = a.double().numpy() if isinstance(a, torch.Tensor) else np.asarray(a, dtype=np.float64)
            return qz._replace(**change(a64, qz))
        return quantize
    return wrap


def _half_away(a, qz):
    """Ties (x.5 with scale 1: the ties input's amax-127 groups) rounded away from zero."""
    q = qz.q.copy()
    tie = np.abs(a - np.trunc(a)) == 0.5
    q[tie] = (np.trunc(a) + np.sign(a))[tie].astype(q.dtype)
    return {"q": q}


def _minus_128(a, qz):
    q = qz.q.copy()
    q[0, 200] = -128             # outside the ties check's compared slice: only the range sees it
    return {"q": q}


@pytest.mark.parametrize("module, name, wrap, check", [
    # a decode whose scales are one fp16 step off (well under 1): exact equality must see it
    ("pq2", "decode", lambda real: lambda *a, **kw: real(*a, **kw) * (1 + 2.0 ** -10), "decode == decode by hand"),
    ("pq2", "decode", lambda real: lambda w, layout="raw", **kw: real(w, layout=layout, **kw) * (
        -1 if layout == "prepared" else 1), "raw decode == prepared decode"),
    ("q8", "quantize_q8", _q8_with(_half_away), "Q8 ties round half to even"),
    ("q8", "quantize_q8", _q8_with(lambda a, qz: {"scales": np.where(qz.scales == 0, np.float32(1), qz.scales)}),
     "Q8 zero group"),
    ("projection", "quantized", lambda real: lambda *a, **kw: real(*a, **kw) * (1 + 4e-12),
     "quantized projection == direct FP64"),
    # NaN scored as a 100% error: still within a bound of 1.0, so it would pass
    ("metrics", "relative_rms", lambda real: lambda y, r: 1.0 if np.isnan(y).any() else real(y, r),
     "NaN never passes"),
])
def test_each_reference_selfcheck_fails_on_the_fault_it_guards(monkeypatch, module, name, wrap, check):
    assert all(ok for _, ok, _ in selfcheck.run_all())      # the real reference passes them all
    got = _selfcheck(monkeypatch, module, name, wrap)
    assert got[check] is False, f"{check}: {got}; reproduce: pytest -p no:randomly {HERE} -k reference_selfcheck"


# The range test once read np.abs of the int8 codes: no code exceeds 127 there and np.abs(int8
# -128) wraps to -128, so a quantizer emitting -128 (outside the symmetric [-127, 127]) passed.
def test_a_code_of_minus_128_fails_the_q8_range_selfcheck(monkeypatch):
    got = _selfcheck(monkeypatch, "q8", "quantize_q8", _q8_with(_minus_128))
    assert got["Q8 ties round half to even"] is False, (
        f"{got}; reproduce: pytest -p no:randomly {HERE} -k a_code_of_minus_128")
