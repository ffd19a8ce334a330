"""Edges of the bench's instruments that fault injection found unpinned: the speed-of-light
read's tiles at a GPU's SM count and where its PDL wait sits (a wrong SOL row once called a
reachable target impossible), the checks after timing (shape and dtype, the gate's own output
print, the wall clock's median, a check that raises, the fingerprint's words), the power
proxy's calibration (median of the readings that were read, the event fallback, the polling on
fake CUDA events) and the regression gate (a run equal to the stored one, the faster verdict,
A/A rows, a side timed in one run only, the settings compared). Expected values are derived
by hand from the planted inputs; nothing here needs a GPU."""
import inspect
import json
import time

import pytest
import torch

from pq2verify.bench import baseline, checkafter, power, sol

F = "tests/test_bench_sol_edges.py"


def repro(test: str) -> str:
    return f"reproduce: .venv/bin/python -m pytest -q -p no:randomly '{F}::{test}'"


# --- the speed-of-light read: tiles and the PDL sweep -----------------------------------------
class Launches:
    """Stands in for the Triton kernel: records each launch's grid and arguments."""

    def __init__(self):
        self.log = []

    def __getitem__(self, grid):
        return lambda buf, part, n, **kw: self.log.append({"grid": grid, "buf": buf, "part": part, "n": n, **kw})


@pytest.fixture
def h100(monkeypatch):
    """read_call as on a 132-SM GPU outside the interpreter, its launches recorded."""
    import kernels.common
    k = Launches()
    monkeypatch.setattr(sol, "_kernel", lambda: k)
    monkeypatch.setattr(sol, "_sms", lambda dev: 132)
    monkeypatch.setattr(kernels.common, "INTERPRET", False)
    return k


# (bytes, depth) -> (grid, ITERS, PRE). 16 KB chunks of 4096 words; a program takes at most 8
# chunks and fewer where that would leave under 2 programs per SM (264 on 132 SMs):
#  16 MiB: 1024 chunks of words, 1024 // 264 = 3 -> 3 a program, ceil(1024 / 3) = 342 programs
#  64 MiB: 4096 chunks, 4096 // 264 = 15 -> capped at 8: 512 programs
#  1,000,002 B (not a multiple of 4: read as bytes, 4096 a chunk): 245 chunks, under 264 -> 1 each
#  100 B: under one chunk: one program of one chunk
# PRE: 1 unless told, never more than the program's chunks.
TILES = [((16 << 20, None), (342, 3, 1)), ((16 << 20, 2), (342, 3, 2)), ((16 << 20, 8), (342, 3, 3)),
         ((64 << 20, None), (512, 8, 1)), ((64 << 20, 0), (512, 8, 0)), ((64 << 20, 8), (512, 8, 8)),
         ((1_000_002, None), (245, 1, 1)), ((1_000_002, 4), (245, 1, 1)), ((100, None), (1, 1, 1))]


@pytest.mark.parametrize("nbytes_depth, want", TILES, ids=[f"{b}B-depth{d}" for (b, d), _ in TILES])
def test_the_sol_read_tiles_at_a_gpus_sm_count(h100, nbytes_depth, want):
    """On the CPU the SM count is 1, so only a GPU run ever saw these tiles; here the count is
    an H100's and the launch is recorded instead of run. 8 warps, PDL compiled in and requested."""
    t = "test_the_sol_read_tiles_at_a_gpus_sm_count"
    nbytes, depth = nbytes_depth
    raw = torch.empty(nbytes, dtype=torch.uint8)
    buf = raw.view(torch.int32) if nbytes % 4 == 0 else raw
    thunk, part = sol.read_call(buf, True, depth)
    thunk()
    (got,) = h100.log
    assert (got["grid"], got["ITERS"], got["PRE"]) == ((want[0],), want[1], want[2]), (got, repro(t))
    assert part.numel() == want[0], (part.numel(), repro(t))
    assert (got["BLOCK"], got["num_warps"], got["PDL"], got["launch_pdl"]) == (4096, 8, True, True), repro(t)
    assert got["buf"] is buf and got["part"] is part and got["n"] == buf.numel(), repro(t)


def test_each_sol_row_reads_every_copy_once_at_its_own_depth(h100):
    """Three 64 MiB copies (8 chunks a program): 'sol' plain at the default 1 chunk; the PDL
    rows at 0, 1, 2, 4 and all 8 chunks before the wait; each row launches once per copy, in
    the copies' order, and counts their bytes once and no FLOPs."""
    t = "test_each_sol_row_reads_every_copy_once_at_its_own_depth"
    ws = [torch.empty(64 << 20, dtype=torch.uint8) for _ in range(3)]
    calls = [type("C", (), {"n": 8, "k": 8 << 20, "nbytes": 64 << 20})() for _ in ws]
    rows = sol.sol_contestants(lambda: ws, calls)
    want = {"sol": (False, 1), "sol_pdl0": (True, 0), "sol_pdl1": (True, 1), "sol_pdl2": (True, 2),
            "sol_pdl4": (True, 4), "sol_pdl_all": (True, 8)}
    assert [c.label for c in rows] == list(want), repro(t)
    for c in rows:
        h100.log.clear()
        for th in c.build():
            th()
        got = [(x["PDL"], x["PRE"]) for x in h100.log]
        assert got == [want[c.label]] * 3, (c.label, got, repro(t))
        assert [x["buf"].data_ptr() for x in h100.log] == [w.data_ptr() for w in ws], (c.label, repro(t))
        assert all(("launch_pdl" in x) == want[c.label][0] for x in h100.log), (c.label, repro(t))
        assert c.nbytes == 3 * (64 << 20), (c.label, c.nbytes, repro(t))
        assert c.flops == 0 and c.per == 1, (c.label, c.flops, repro(t))       # a read does no math: M = 0


@pytest.mark.parametrize("pre, chunks_before", [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (8, 4)])
def test_the_pdl_wait_comes_once_after_its_depth(monkeypatch, pre, chunks_before):
    """The kernel itself under the interpreter with PDL compiled in (read_call never asks for it
    there: no griddepcontrol), the two PDL calls replaced by recorders. One program of 4 chunks:
    at depth d it reads min(d, 4) chunks, then waits, exactly once; launch_dependents once, first.
    The chunks read at the wait: the last offsets the kernel computed (its local `o`), none
    before the first."""
    t = "test_the_pdl_wait_comes_once_after_its_depth"
    import triton.language as tl
    from kernels.common import INTERPRET
    if not INTERPRET:
        pytest.skip("the recorders stand in for griddepcontrol only under the interpreter")
    events = []

    def wait():
        o = inspect.currentframe().f_back.f_locals.get("o")
        events.append(("wait", 0 if o is None else int(o.handle.data[0]) // sol.BLOCK + 1))
    monkeypatch.setattr(tl.extra.cuda, "gdc_wait", wait)
    monkeypatch.setattr(tl.extra.cuda, "gdc_launch_dependents", lambda: events.append(("launch", None)))
    buf = torch.arange(4 * sol.BLOCK, dtype=torch.int32) * 7919
    part = torch.zeros(1, dtype=torch.int32)
    sol._kernel()[(1,)](buf, part, buf.numel(), ITERS=4, PRE=pre, BLOCK=sol.BLOCK, PDL=True)
    assert events == [("launch", None), ("wait", chunks_before)], (events, repro(t))
    events.clear()
    sol._kernel()[(1,)](buf, part, buf.numel(), ITERS=4, PRE=pre, BLOCK=sol.BLOCK, PDL=False)
    assert events == [], (events, repro(t))


# --- the checks after timing ------------------------------------------------------------------
def test_same_bytes_in_another_shape_or_dtype_is_not_the_same_output():
    """2x3 and 3x2 ones, float32 and int32 zeros: byte for byte equal, yet another output."""
    t = "test_same_bytes_in_another_shape_or_dtype_is_not_the_same_output"
    for tol in (0.0, 0.1):
        assert checkafter._same(torch.ones(2, 3), torch.ones(3, 2), tol) is False, (tol, repro(t))
        assert checkafter._same(torch.zeros(4), torch.zeros(4, dtype=torch.int32), tol) is False, (tol, repro(t))
        assert checkafter._same(torch.ones(2, 3), torch.ones(2, 3), tol) is True, (tol, repro(t))


def test_an_inf_in_the_timed_output_fails_even_where_the_rms_sums_are_inf():
    """a = [inf, 1], b = [1, inf]: sum (a-b)^2 and sum b^2 are both inf, and inf <= 0.1 x inf;
    only the finiteness of a fails it."""
    inf = float("inf")
    got = checkafter._same(torch.tensor([inf, 1.0]), torch.tensor([1.0, inf]), 0.1)
    assert got is False, repro("test_an_inf_in_the_timed_output_fails_even_where_the_rms_sums_are_inf")


def test_fingerprint_words_and_bytes():
    """int32 1..6: (6 words, sum 21, odd-indexed 2 + 4 + 6 = 12). 7 bytes 1..7 (no whole words):
    (7, 28, 12). Bytes 1..8 at an address 1 past a word: bytes, not words: (8, 36, 2+4+6+8 = 20)."""
    t = "test_fingerprint_words_and_bytes"
    assert checkafter.fingerprint(torch.arange(1, 7, dtype=torch.int32)) == (6, 21, 12), repro(t)
    assert checkafter.fingerprint(torch.arange(1, 8, dtype=torch.uint8)) == (7, 28, 12), repro(t)
    odd = torch.arange(0, 9, dtype=torch.uint8)[1:]
    assert odd.data_ptr() % 4 != 0
    assert checkafter.fingerprint(odd) == (8, 36, 20), repro(t)


class Timer:
    """A 'graph' whose replay writes out = x * 2 (expect agrees); wall: the host clock's µs."""

    def __init__(self, tol=0.0, gate_print=None, wall_us=1.0, fail=None):
        self.x = torch.arange(1.0, 5.0)
        self.y = torch.zeros(4)
        self.probe = checkafter.Probe(self.y, lambda: self.x * 2, None, [self.x], gate_print, tol)
        self.wall_us, self.fail = wall_us, fail

    def replay_sync(self):
        if self.fail:
            raise self.fail
        self.y.copy_(self.x * 2)

    def wall(self, reps):
        return self.wall_us


def test_a_bit_exact_output_must_also_match_the_gates_own_print():
    """The eager function agrees with the replay, but the gate's own output printed otherwise
    (zeros): a bit-exact probe fails 'output' naming the gate's output. With a tolerance (cuBLAS
    may pick its kernel per call) the print is not compared: ok."""
    t = "test_a_bit_exact_output_must_also_match_the_gates_own_print"
    other = checkafter.fingerprint(torch.zeros(4))
    tm = Timer(gate_print=other)
    got = checkafter.run(tm, checkafter.prints(tm.probe), None, 1)
    assert got["output"] == {"ok": False, "why": "the timed graph's output differs from the gate's own output"}, \
        (got, repro(t))
    tm = Timer(gate_print=checkafter.fingerprint(torch.arange(1.0, 5.0) * 2))
    assert checkafter.run(tm, checkafter.prints(tm.probe), None, 1)["output"]["ok"], repro(t)
    tm = Timer(tol=0.01, gate_print=other)
    assert checkafter.run(tm, checkafter.prints(tm.probe), None, 1)["output"]["ok"], repro(t)


@pytest.mark.parametrize("wall, ok", [(6.0, True), (6.2, False)])
def test_the_wall_clock_check_uses_the_median_event_time(wall, ok):
    """Event times 1, 9, 2, 8, 3 µs: median 3 (not the min 1 or max 9). Against a host clock of
    6 µs, 3 is exactly 0.5 x 6: passes (the edge is included); against 6.2 µs it fails."""
    t = "test_the_wall_clock_check_uses_the_median_event_time"
    tm = Timer(wall_us=wall)
    got = checkafter.run(tm, checkafter.prints(tm.probe), [1.0, 9.0, 2.0, 8.0, 3.0], 1)["wall clock"]
    assert (got["events_us"], got["wall_us"], got["ok"]) == (3.0, wall, ok), (got, repro(t))


def test_a_check_that_cannot_run_is_a_failed_check():
    t = "test_a_check_that_cannot_run_is_a_failed_check"
    tm = Timer(fail=RuntimeError("replay lost"))
    got = checkafter.run(tm, [], [1.0], 1)
    assert got == {"error": {"ok": False, "why": "RuntimeError: replay lost"}}, (got, repro(t))
    assert checkafter.failures({"b": got}) == ["b error: RuntimeError: replay lost"], repro(t)


# --- the power proxy's calibration ------------------------------------------------------------
def test_the_calibration_is_the_median_of_the_readings_that_were_read():
    """Readings 1950, 0, None, 1900, 1980 (0 and None: a failed read): median of 1950, 1900,
    1980 = 1950 from 3 readings (the last, 1980, is not the median; with the 0 kept it would
    be 1925)."""
    t = "test_the_calibration_is_the_median_of_the_readings_that_were_read"
    cal = power.calibration([1950, 0, None, 1900, 1980], 20_000_000, None)
    assert (cal["cycles_per_us"], cal["nvml_sm_mhz"], cal["readings"]) == (1950.0, 1950.0, 3), (cal, repro(t))


def test_the_event_fallback_takes_any_positive_time_and_no_other():
    """1000 cycles in 0.5 µs: 2000 cycles per µs. A time of 0 or below is no time: no clock."""
    t = "test_the_event_fallback_takes_any_positive_time_and_no_other"
    assert power.calibration([], 1000, 0.5)["cycles_per_us"] == 2000.0, repro(t)
    for bad in (0.0, -3.0):
        with pytest.raises(RuntimeError, match="no SM clock"):
            power.calibration([], 1000, bad)


def test_spin_cycles_round_to_nearest():
    """2.5 µs at 1000.3 MHz is 2500.75 cycles: 2501, not 2500."""
    assert power.cycles_for(2.5, 1000.3) == 2501, repro("test_spin_cycles_round_to_nearest")


class FakeEvent:
    """A CUDA event: the end event is pending for `pending` queries; elapsed_time in ms, only
    between events made with enable_timing=True (as CUDA requires)."""
    pending = 0

    def __init__(self, enable_timing=False):
        self.timing = enable_timing

    def record(self):
        pass

    def query(self):
        FakeEvent.pending -= 1
        return FakeEvent.pending < 0

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        if not (self.timing and end.timing):
            raise RuntimeError("Both events must be created with enable_timing=True")
        return 10.0


def test_measure_calibration_polls_nvml_until_the_spin_ends(monkeypatch):
    """The spin is pending for 4 polls; NVML reads 1900, (fails), 1980, 1950: 3 readings, median
    1950; the events' 10 ms = 10,000 µs for 20e6 cycles: 2000 cycles per µs beside it. A warm-up
    spin shorter than the calibration spin comes first. Without a reader: the events' 2000."""
    t = "test_measure_calibration_polls_nvml_until_the_spin_ends"
    spins = []
    monkeypatch.setattr(torch.cuda, "_sleep", spins.append)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    vals = iter([1900, None, 1980, 1950])

    def read():
        v = next(vals)
        if v is None:
            raise OSError("NVML busy")
        return {"sm_mhz": v}
    FakeEvent.pending = 4
    cal = power.measure_calibration(read)
    assert (cal["cycles_per_us"], cal["readings"], cal["events_cycles_per_us"]) == (1950.0, 3, 2000.0), \
        (cal, repro(t))
    assert len(spins) == 2 and spins[0] < spins[1] == power.CAL_CYCLES, (spins, repro(t))
    FakeEvent.pending = 4
    cal = power.measure_calibration(None)
    assert (cal["cycles_per_us"], cal["readings"]) == (2000.0, 0), (cal, repro(t))


# --- the regression gate ----------------------------------------------------------------------
CFG = {"env": "cuda", "device": "H200", "dtype": "bf16", "layout": "prepared"}


def _res(*rows):
    return {"header": {"config": CFG}, "rows": list(rows)}


def _row(key, **sides):
    return {"kind": "shape", "key": key, "status": "timed", "sides": {s: {"rounds": v} for s, v in sides.items()}}


def test_a_run_equal_to_the_stored_one_is_within_noise():
    """10 µs in every round of both runs: every resample's ratio is exactly 1, so the interval
    is [1, 1]: neither below 1 (a regression) nor above it (faster)."""
    t = "test_a_run_equal_to_the_stored_one_is_within_noise"
    g = baseline.compare(_res(_row("shape:x:m1", b=[10.0] * 9)), _res(_row("shape:x:m1", b=[10.0] * 9)))
    (e,) = g["rows"]
    assert (e["speedup"]["lo"], e["speedup"]["hi"]) == (1.0, 1.0), (e, repro(t))
    assert (e["regression"], e["verdict"], g["regressions"]) == (False, "within noise", []), (e, repro(t))


def test_a_side_1_5x_faster_is_faster():
    """15 µs stored, 10 µs now: 1.5x in every resample, above 1: 'faster'."""
    t = "test_a_side_1_5x_faster_is_faster"
    g = baseline.compare(_res(_row("shape:x:m1", b=[10.0] * 9)), _res(_row("shape:x:m1", b=[15.0] * 9)))
    (e,) = g["rows"]
    assert e["speedup"]["median"] == 1.5 and e["verdict"] == "faster" and not e["regression"], (e, repro(t))


def test_the_aa_rows_are_never_judged():
    """'aa' and 'aa:last' are the run's own noise floor: 10 -> 20 µs there is no regression and
    no row of the gate; the same slowdown on a shape row is one."""
    t = "test_the_aa_rows_are_never_judged"
    old = _res(_row("aa", a=[10.0] * 9), _row("aa:last", a=[10.0] * 9), _row("shape:x:m1", a=[10.0] * 9))
    new = _res(_row("aa", a=[20.0] * 9), _row("aa:last", a=[20.0] * 9), _row("shape:x:m1", a=[20.0] * 9))
    g = baseline.compare(new, old)
    assert [e["key"] for e in g["rows"]] == ["shape:x:m1"], (g["rows"], repro(t))
    assert len(g["regressions"]) == 1 and g["regressions"][0].startswith("shape:x:m1 a: 0.500x"), (g, repro(t))


def test_a_side_timed_in_one_run_only_is_not_compared():
    """Stored A and B, this run B only (A not run): B is judged, A is skipped, not an error;
    without BF16 in both runs the ratio is raw (against_bf16 False); with it, True."""
    t = "test_a_side_timed_in_one_run_only_is_not_compared"
    g = baseline.compare(_res(_row("shape:x:m1", b=[10.0] * 9)), _res(_row("shape:x:m1", a=[5.0] * 9, b=[10.0] * 9)))
    assert [(e["side"], e["against_bf16"]) for e in g["rows"]] == [("b", False)], (g["rows"], repro(t))
    g = baseline.compare(_res(_row("shape:x:m1", b=[10.0] * 9, bf16=[8.0] * 9)),
                         _res(_row("shape:x:m1", b=[10.0] * 9, bf16=[8.0] * 9)))
    assert [(e["side"], e.get("against_bf16")) for e in g["rows"]] == [("b", True), ("bf16", None)], \
        (g["rows"], repro(t))


@pytest.mark.parametrize("text", ['{"header": {}}', '{"rows": []}', "[1, 2]"], ids=["no-rows", "no-header", "list"])
def test_a_stored_file_without_rows_or_header_is_refused(tmp_path, text):
    p = tmp_path / "b.json"
    p.write_text(text)
    with pytest.raises(ValueError, match="not a bench --json result"):
        baseline.load(p)
    p.write_text(json.dumps({"header": {}, "rows": []}))
    assert baseline.load(p) == {"header": {}, "rows": []}


@pytest.mark.parametrize("key", ["env", "device", "dtype", "layout"])
def test_a_stored_run_with_other_settings_is_refused_naming_them(key):
    """Each of env, device, dtype and layout alone makes the timings incomparable."""
    t = "test_a_stored_run_with_other_settings_is_refused_naming_them"
    baseline.check_comparable(_res(), dict(CFG), "b.json")
    with pytest.raises(ValueError, match=f"recorded with other settings: {key} "):
        baseline.check_comparable(_res(), {**CFG, key: "other"}, "b.json")
