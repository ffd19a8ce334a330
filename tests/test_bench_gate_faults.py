"""Faults injected into the bench's numerics gate (bench/gate.py) and its check after timing
(bench/checkafter.py) that the other bench tests let pass.

Each test names the fault it kills. Every expected value is worked out by hand in the test's
docstring, never taken from the function under test. CPU only; checks.evaluate, the registry
and dispatch are replaced by stand-ins where the gate's own logic is under test."""
import importlib
import types

import torch

from kernels import dispatch
from pq2verify import checks, registry
from pq2verify.bench import checkafter

gate_mod = importlib.import_module("pq2verify.bench.gate")   # pq2verify.bench.gate is also the function

F = "tests/test_bench_gate_faults.py"


def repro(test: str) -> str:
    return f"reproduce: .venv/bin/python -m pytest -q -p no:randomly '{F}::{test}'"


# --- bench/gate.py: gate() -------------------------------------------------------------------
class _Case:
    id, path = "c1", "no-such-path"

    def repro(self):
        return "R"


def _result(ok, failures=()):
    r = types.SimpleNamespace(ok=ok, failures=list(failures))
    for k in gate_mod._DETAIL:
        setattr(r, k, f"v-{k}")
    return r


def test_gate_records_the_repro_by_default(monkeypatch):
    """repro defaults to True: a gate called without it keeps case.repro() ('R') in its detail.
    Kills `repro: bool = True` -> False."""
    t = "test_gate_records_the_repro_by_default"
    monkeypatch.setattr(checks, "evaluate", lambda case, device, inp, reruns: _result(True))
    g = gate_mod.gate(_Case(), None, "cpu", reruns=1, record_output=False)
    assert g.detail.get("repro") == "R", (g.detail, repro(t))
    assert (g.ok, g.status, g.reason, g.output_print) == (True, "PASS", "", None), (g, repro(t))
    g = gate_mod.gate(_Case(), None, "cpu", reruns=1, repro=False, record_output=False)
    assert "repro" not in g.detail, (g.detail, repro(t))


def test_a_failed_gate_or_no_recording_never_runs_the_path_again(monkeypatch):
    """The eager run after the gate happens only when the checks passed AND record_output is
    set. Failed checks ['a', 'b'] with record_output: BLOCKED, reason 'a; b', no print. Passed
    checks without record_output: PASS, no print. The path 'no-such-path' is not registered, so
    a run after the gate (the `and` -> `or` fault) would turn either into 'the eager run after
    the gate raised ...'. Kills `if r.ok and record_output` -> `or`."""
    t = "test_a_failed_gate_or_no_recording_never_runs_the_path_again"
    monkeypatch.setattr(checks, "evaluate", lambda case, device, inp, reruns: _result(False, ["a", "b"]))
    g = gate_mod.gate(_Case(), None, "cpu", reruns=1, record_output=True)
    assert (g.ok, g.status, g.reason, g.output_print) == (False, "BLOCKED", "a; b", None), (g, repro(t))
    assert g.detail["claim"] == "v-claim", (g.detail, repro(t))
    monkeypatch.setattr(checks, "evaluate", lambda case, device, inp, reruns: _result(True))
    g = gate_mod.gate(_Case(), None, "cpu", reruns=1, record_output=False)
    assert (g.ok, g.reason, g.output_print) == (True, "", None), (g, repro(t))


def test_a_passed_gate_records_the_print_of_the_paths_output(monkeypatch):
    """Passed checks with record_output: the path's kernel runs on (x, w) and its output
    int32 [1, 2, 3, 4] is printed as (numel 4, sum 1+2+3+4 = 10, odd-indexed 2+4 = 6)."""
    t = "test_a_passed_gate_records_the_print_of_the_paths_output"
    monkeypatch.setattr(checks, "evaluate", lambda case, device, inp, reruns: _result(True))
    seen = []
    kern = lambda x, w: (seen.append((x, w)), torch.tensor([1, 2, 3, 4], dtype=torch.int32))[1]
    monkeypatch.setattr(registry, "get", lambda path: types.SimpleNamespace(kernel=lambda: kern))
    g = gate_mod.gate(_Case(), types.SimpleNamespace(x="X", w="W"), "cpu", reruns=1, record_output=True)
    assert (g.ok, g.output_print, seen) == (True, (4, 10, 6), [("X", "W")]), (g, repro(t))


# --- bench/gate.py: decode_dense and BaselineInputs ------------------------------------------
def _weight():
    """Raw PQ2 weight N=3, K=128 (one block a row: fp16 scale, then 32 code bytes). Row 0:
    scale 2, bytes 0xAA (every 2-bit code 2, i.e. +1): all +2. Row 1: scale 0.5, bytes 0x00
    (code 0, i.e. -1): all -0.5. Row 2: scale 3, bytes 0x55 (code 1, i.e. 0): all 0. Every byte
    holds four equal codes, so the bit order within a byte does not matter."""
    from kernels.format import PQ2Weight
    rows = []
    for scale, byte in ((2.0, 0xAA), (0.5, 0x00), (3.0, 0x55)):
        s = torch.tensor([scale], dtype=torch.float16).view(torch.uint8)
        rows.append(torch.cat([s, torch.full((32,), byte, dtype=torch.uint8)]))
    return PQ2Weight.from_raw(torch.stack(rows))


def test_decode_dense_in_chunks_of_two_rows():
    """Rows 2, -0.5, 0 (see _weight) decoded in chunks of 2 rows: chunk [0, 2) then [2, 3), the
    last one short. Kills, in decode_dense: `min(w.n, r0 + rows)` -> max (a chunk past N),
    `r0 + rows` -> `r0 - rows`, `r1 - r0` -> `r1 + r0` (both reshapes; wrong only for r0 > 0),
    `code - 1.0` -> `code + 1.0` and the constant 1.0 -> 2.0."""
    t = "test_decode_dense_in_chunks_of_two_rows"
    want = torch.tensor([2.0, -0.5, 0.0])[:, None].expand(3, 128)
    for chunk in (2, 1, 3, 4096):
        got = gate_mod.decode_dense(_weight(), torch.float32, rows_per_chunk=chunk)
        assert got.shape == (3, 128) and torch.equal(got, want), (chunk, got[:, :2], repro(t))


def test_baseline_inputs_reference_is_x_times_the_decoded_rows():
    """x = [[1, ..., 1]] (K = 128), rows [2, 0]: the decoded rows are 0 (row 2) and +2 (row 0),
    so the reference is [[128 x 0, 128 x 2]] = [[0, 256]], the same object on a second call.
    Also BaselineInputs.dense is True. Kills `if self._ref is None` -> `is not None` (it returns
    None) and `dense = True` -> False."""
    t = "test_baseline_inputs_reference_is_x_times_the_decoded_rows"
    inp = types.SimpleNamespace(case="c", device="cpu", x=torch.ones(1, 128, dtype=torch.bfloat16),
                                rows=torch.tensor([2, 0]), w=_weight())
    b = gate_mod.BaselineInputs(inp, torch.bfloat16)
    assert b.dense is True and gate_mod.BaselineInputs.dense is True, repro(t)
    r1 = b.reference("dense")
    assert r1 is not None and [list(map(float, row)) for row in r1] == [[0.0, 256.0]], (r1, repro(t))
    assert b.reference("dense") is r1, repro(t)


# --- bench/gate.py: traced_path --------------------------------------------------------------
def test_traced_path_names_the_one_traced_call(monkeypatch):
    """A stand-in pq2_matmul that records one call of 'mmq' (dispatch.count): traced_path is
    'mmq'. One that records two calls ('mmq' and 'gemv') or none is refused with RuntimeError.
    Kills `sum(t.values()) != 1` -> `==` and the constant 1 -> 2."""
    t = "test_traced_path_names_the_one_traced_call"
    calls = []
    monkeypatch.setattr(dispatch, "pq2_matmul", lambda x, w, kernels: [dispatch.count(n) for n in calls])
    inp = types.SimpleNamespace(x=None, w=None)
    calls[:] = ["mmq"]
    assert gate_mod.traced_path("default", inp) == "mmq", repro(t)
    for names in (["mmq", "gemv"], []):
        calls[:] = names
        try:
            got = gate_mod.traced_path("default", inp)
        except RuntimeError as e:
            assert "expected one traced call" in str(e), (e, repro(t))
        else:
            raise AssertionError(f"{names}: traced_path returned {got!r}; {repro(t)}")


# --- bench/checkafter.py ---------------------------------------------------------------------
def test_same_without_a_tolerance_is_bit_exact():
    """_same's tol defaults to 0: bit-equal bytes. 1.0 against 1.0 + 2^-23 (one float32 ulp)
    differs; against 1.0 it is the same. Kills `tol: float = 0.0` -> 1.0 (relative RMS 2^-23 <= 1
    would pass)."""
    t = "test_same_without_a_tolerance_is_bit_exact"
    a = torch.tensor([1.0, 1.0 + 2.0 ** -23])
    b = torch.ones(2)
    assert checkafter._same(a, b) is False, repro(t)
    assert checkafter._same(b.clone(), b) is True, repro(t)


def test_relative_rms_against_an_all_zero_reference_admits_only_zero():
    """a = [0.5], b = [0], tol 1: sqrt(sum (a-b)^2) = 0.5 against 1 x sqrt(sum b^2) = 0: fails. The
    sums start at 0; kills the start `r2 = 0.0` -> 1.0 (then 0.5 <= 1 x sqrt(1) would pass)."""
    t = "test_relative_rms_against_an_all_zero_reference_admits_only_zero"
    assert checkafter._same(torch.tensor([0.5]), torch.zeros(1), 1.0) is False, repro(t)
    assert checkafter._same(torch.zeros(1), torch.zeros(1), 1.0) is True, repro(t)


def test_relative_rms_sees_the_first_element():
    """a = [3, 1, 1], b = [1, 1, 1], tol 0.1: the difference is only in element 0: sqrt(4) = 2
    against 0.1 x sqrt(3) = 0.17: fails. Kills `range(0, numel, CHUNK)` -> range(1, ...), which
    skips element 0 (0 <= 0.1 x sqrt(2) would pass)."""
    t = "test_relative_rms_sees_the_first_element"
    assert checkafter._same(torch.tensor([3.0, 1.0, 1.0]), torch.ones(3), 0.1) is False, repro(t)


class _Partial:
    """A 'graph' whose replay writes out[:3] = 2 x[:3] and leaves out[3] as it was (partial
    work). expect and reference: 2 x of the current x."""

    def __init__(self, full=False, ref_tol=None):
        self.x = torch.tensor([1.0, 2.0, 3.0, 4.0])
        self.y = torch.zeros(4)
        self.y[3] = 8.0          # what the last element would be for the first x
        self.full = full
        kw = {} if ref_tol is None else {"ref_tol": ref_tol}
        self.probe = checkafter.Probe(self.y, lambda: self.x * 2, self.x, [self.x], None, 0.0,
                                      lambda: self.x * 2, **kw)

    def replay_sync(self):
        n = 4 if self.full else 3
        self.y[:n] = self.x[:n] * 2

    def wall(self, reps):
        return 1.0


def test_a_partial_graph_fails_the_fresh_input_replay_at_the_default_ref_tol():
    """First replay on x = [1, 2, 3, 4]: out [2, 4, 6, 8], equal to 2x: 'output' passes. Fresh x
    is x reversed and negated, [-4, -3, -2, -1]; the partial replay gives [-8, -6, -4, 8] against
    the reference [-8, -6, -4, -2]: sqrt(sum d^2) = 10, sqrt(sum ref^2) = sqrt(64+36+16+4) =
    sqrt(120) ~ 10.95; 10 > 0.1 x 10.95 = 1.1: fails at the default ref_tol 0.1 (and would pass
    at 1.1: kills `ref_tol: float = 0.1` -> 1.1). A graph that computes all 4 elements passes,
    and x is restored to [1, 2, 3, 4] afterwards."""
    t = "test_a_partial_graph_fails_the_fresh_input_replay_at_the_default_ref_tol"
    tm = _Partial()
    assert tm.probe.ref_tol == 0.1, repro(t)
    got = checkafter.run(tm, checkafter.prints(tm.probe), None, 1)
    assert got["output"]["ok"] and got["inputs"]["ok"], (got, repro(t))
    assert got["fresh input"]["ok"] is False, (got, repro(t))
    assert tm.x.tolist() == [1.0, 2.0, 3.0, 4.0], (tm.x, repro(t))
    tm = _Partial(full=True)
    got = checkafter.run(tm, checkafter.prints(tm.probe), None, 1)
    assert got["fresh input"] == {"ok": True, "why": ""}, (got, repro(t))
    tm = _Partial(ref_tol=1.0)     # 10 <= 1 x 10.95: the same partial output within a loose tolerance
    got = checkafter.run(tm, checkafter.prints(tm.probe), None, 1)
    assert got["fresh input"]["ok"] is True, (got, repro(t))


def test_relative_rms_squares_the_reference():
    """a = [2.25], b = [2], tol 0.1: |a - b| = 0.25 against 0.1 x sqrt(2^2) = 0.2: fails. Kills
    `y.pow(2)` -> pow(3) in the reference's sum (0.1 x sqrt(2^3) = 0.283 would pass)."""
    t = "test_relative_rms_squares_the_reference"
    assert checkafter._same(torch.tensor([2.25]), torch.tensor([2.0]), 0.1) is False, repro(t)
    assert checkafter._same(torch.tensor([2.125]), torch.tensor([2.0]), 0.1) is True, repro(t)   # 0.125 <= 0.2


def test_a_crash_in_the_checks_or_in_the_eager_run_blocks_the_timing(monkeypatch):
    """checks.evaluate raising ValueError('boom'): BLOCKED, reason 'raised ValueError: boom'
    (kills the crash's Gate(..., False, ...) -> True). Checks passed but the path's kernel
    raising RuntimeError('lost') in the eager run for the print: BLOCKED, reason 'the eager run
    after the gate raised RuntimeError: lost' (kills that Gate's False -> True)."""
    t = "test_a_crash_in_the_checks_or_in_the_eager_run_blocks_the_timing"

    def boom(case, device, inp, reruns):
        raise ValueError("boom")
    monkeypatch.setattr(checks, "evaluate", boom)
    g = gate_mod.gate(_Case(), None, "cpu", reruns=1, record_output=True)
    assert (g.ok, g.status, g.reason, g.output_print) == (False, "BLOCKED", "raised ValueError: boom", None), \
        (g, repro(t))

    def lost(x, w):
        raise RuntimeError("lost")
    monkeypatch.setattr(checks, "evaluate", lambda case, device, inp, reruns: _result(True))
    monkeypatch.setattr(registry, "get", lambda path: types.SimpleNamespace(kernel=lambda: lost))
    g = gate_mod.gate(_Case(), types.SimpleNamespace(x=1, w=2), "cpu", reruns=1, record_output=True)
    assert (g.ok, g.status, g.reason) == (False, "BLOCKED", "the eager run after the gate raised RuntimeError: lost"), \
        (g, repro(t))


def test_input_prints_of_another_count_than_the_reads_fail_the_inputs_check():
    """The partial-graph probe reads one input (x). Prints taken before timing: none ([]) or two
    (x's print twice). zip() of [] and one print compares nothing, so '0 of 0 changed' would
    pass; each count other than the one read is a failed 'inputs' check naming both counts."""
    t = "test_input_prints_of_another_count_than_the_reads_fail_the_inputs_check"
    for copies in (0, 2):
        tm = _Partial(full=True)
        prints = checkafter.prints(tm.probe)
        assert len(prints) == 1, (prints, repro(t))
        before = prints * copies
        got = checkafter.run(tm, before, None, 1)["inputs"]
        assert got["ok"] is False and f"{len(before)} input prints" in got["why"] and "1 inputs" in got["why"], (
            got, repro(t))
    tm = _Partial(full=True)
    assert checkafter.run(tm, checkafter.prints(tm.probe), None, 1)["inputs"] == {"ok": True, "why": ""}, repro(t)
