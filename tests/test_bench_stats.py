"""The bench's statistics and instruments on the CPU (issue 25), with synthetic timings whose
expected intervals and verdicts come from this file's own derivations: bootstrap intervals of
per-round ratios, the noise floor and verdicts, extended rounds, the drift bracket, throttle
flags, NVML without pynvml, the speed of light as the best of its sweep and a contestant faster
than it, the checks after timing, the bench self-test's logic with fakes, and the regression
gate against a stored run."""
import json
import math
import random
import sys
import types

import numpy as np
import pytest
import torch

from kernels import backend
from pq2verify import bench, bench_cli, cli
from pq2verify.bench import checkafter, selftest, stats
from pq2verify.bench.plan import Config

DEVICE = backend.device()
REPRO = "./pq2 test tests/test_bench_stats.py -k "


# --- bootstrap intervals ----------------------------------------------------------------------
def _binom_ge(n: int, p: float, k: int) -> float:
    return sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1))


def test_the_median_interval_is_the_exact_bootstrap_quantile():
    """For n odd and distinct values x_(1) < ... < x_(n), a resample's median is <= x_(j) when
    at least (n+1)/2 of its n draws are among the j smallest: F(j) = P(Bin(n, j/n) >= (n+1)/2).
    The 2.5% and 97.5% quantiles are the first x_(j) with F(j) >= 0.025 and >= 0.975 (the
    Monte Carlo estimate may land on a neighbour only where F is within its error of the level)."""
    rng = np.random.default_rng(5)
    for n in (7, 9, 15):
        x = np.sort(rng.normal(1.2, 0.05, n))
        F = [_binom_ge(n, j / n, (n + 1) // 2) for j in range(1, n + 1)]
        ci = stats.bootstrap_median(list(rng.permutation(x)), boot=20000, seed=3)
        se = 3 * math.sqrt(0.025 * 0.975 / 20000)          # three standard errors of a quantile's level
        for level, got in ((0.025, ci["lo"]), (0.975, ci["hi"])):
            ok = [x[j] for j in range(n) if F[j] >= level - se and (j == 0 or F[j - 1] < level + se)]
            assert any(got == v for v in ok), (n, level, got, ok, REPRO + "exact_bootstrap")
        assert ci["median"] == x[n // 2] and ci["n"] == n


def test_a_paired_ratio_ignores_drift_both_sides_share():
    """Both sides slowed alike in a round (clock drift): the per-round ratio is exactly 1.2 in
    every round, so the interval is [1.2, 1.2] however wide the times spread."""
    drift = [1.0, 1.3, 0.8, 1.1, 1.25, 0.9, 1.05, 1.4, 0.95]
    tx = [12.0 * d for d in drift]
    ty = [10.0 * d for d in drift]
    r = stats.ratio_interval(tx, ty)
    assert r["lo"] == pytest.approx(1.2) and r["hi"] == pytest.approx(1.2) and r["median"] == pytest.approx(1.2)
    assert stats.verdict(r) == "faster" and stats.verdict(stats.ratio_interval(ty, tx)) == "slower"


def test_the_interval_covers_the_true_ratio_about_as_often_as_it_claims():
    """200 synthetic runs of 15 rounds, true speedup 1.05, 2% lognormal noise per sample: the
    true median ratio must lie in at least 85% of the 95% intervals (the percentile bootstrap of
    a median from 15 rounds undercovers a little; 85% is 6 standard errors below 95%)."""
    rng = np.random.default_rng(11)
    hit = 0
    for t in range(200):
        tx = 10.5 * np.exp(rng.normal(0, 0.02, 15))
        ty = 10.0 * np.exp(rng.normal(0, 0.02, 15))
        r = stats.ratio_interval(list(tx), list(ty), boot=2000, seed=t)
        hit += r["lo"] <= 1.05 <= r["hi"]
    assert hit >= 170, (hit, REPRO + "covers")


@pytest.mark.parametrize("ci,aa,want", [
    ({"lo": 1.01, "hi": 1.03}, None, "faster"),                       # no A/A row: against 1 alone
    ({"lo": 1.01, "hi": 1.03}, {"lo": 0.97, "hi": 1.035}, "within noise"),   # inside the noise floor
    ({"lo": 1.04, "hi": 1.06}, {"lo": 0.97, "hi": 1.035}, "faster"),
    ({"lo": 0.90, "hi": 0.96}, {"lo": 0.97, "hi": 1.035}, "slower"),
    ({"lo": 0.95, "hi": 0.975}, {"lo": 0.97, "hi": 1.035}, "within noise"),
    ({"lo": 0.98, "hi": 0.99}, {"lo": 1.01, "hi": 1.02}, "slower"),   # the band always holds 1
    (None, None, "not measured"),
])
def test_a_verdict_leaves_the_noise_floor_or_is_within_noise(ci, aa, want):
    assert stats.verdict(ci, aa) == want


# --- rounds: extension, drift bracket, throttle flags ------------------------------------------
class Seq:
    """A timer returning the given µs in turn (cycling); every call recorded."""
    per = 1

    def __init__(self, vals, log=None, name=""):
        self.vals, self.i, self.log, self.name = list(vals), 0, log, name

    def sample(self, reps, during=None):
        if during:
            during()
        if self.log is not None:
            self.log.append(self.name)
        v = self.vals[self.i % len(self.vals)]
        self.i += 1
        return v


def test_rounds_stop_when_the_interval_is_narrow():
    info = {}
    times, _, orders = bench.time_rounds({"a": Seq([10.0]), "b": Seq([5.0])}, 7, 1, 1.0, info=info,
                                         compare=[("a", "b")], ci_width=0.02, max_pairs=25)
    assert len(orders) == 7 and info["stopped"] == "narrow" and info["rounds"] == 7


def test_rounds_extend_to_the_cap_or_the_budget_when_the_interval_stays_wide():
    """B alternating 4 and 6 µs against A's 10: ratios 2.5 and 1.67 never give a 2%-wide interval;
    rounds go on two at a time up to max_pairs (7, 9, 11), or stop at once on a spent budget."""
    info = {}
    _, _, orders = bench.time_rounds({"a": Seq([10.0]), "b": Seq([4.0, 6.0])}, 7, 0, 1.0, info=info,
                                     compare=[("a", "b")], ci_width=0.02, max_pairs=11)
    assert len(orders) == 11 and info["stopped"] == "max rounds"
    info = {}
    _, _, orders = bench.time_rounds({"a": Seq([10.0]), "b": Seq([4.0, 6.0])}, 7, 0, 1.0, info=info,
                                     compare=[("a", "b")], ci_width=0.02, max_pairs=25, deadline=lambda: True)
    assert len(orders) == 7 and info["stopped"] == "budget"


def test_the_control_is_bracketed_first_and_last_and_drift_is_flagged():
    """The control's BRACKET samples come before the first round and after the last; a control
    10% slower at the end (a clock drop) is flagged (beyond stats.DRIFT_TOL = 5%), a steady one
    is not."""
    log = []
    B = bench.timing.BRACKET
    warm, pairs = 1, 7
    # the control's samples in order: warm-up, bracket, one per round, bracket
    a = Seq([10.0] * (warm + B + pairs) + [11.0] * B, log, "a")
    info = {}
    bench.time_rounds({"a": a, "b": Seq([5.0], log, "b")}, pairs, warm, 1.0, info=info)
    assert log[warm * 2:warm * 2 + B] == ["a"] * B and log[-B:] == ["a"] * B
    d = stats.drift(info["bracket"]["first"], info["bracket"]["last"])
    assert d["ratio"] == pytest.approx(1.1) and d["flagged"]
    steady = stats.drift([10.0] * 3, [10.2] * 3)
    assert steady["ratio"] == pytest.approx(1.02) and not steady["flagged"]


def _throttled_sampler(hot_rounds, labels, warm, pairs):
    """A sampler whose readings report a power cap during the given rounds (counting samples)."""
    B = bench.timing.BRACKET
    n = [0]
    per_round = len(labels)

    def read():
        i = n[0]
        n[0] += 1
        r = (i - B) // per_round       # one reading per sample: the opening bracket, then the rounds
        return {"sm_mhz": 1584.0 if r in hot_rounds else 1980.0, "throttle": 0x04 if r in hot_rounds else 0}
    return bench.Sampler(read, 0)


@pytest.mark.parametrize("pairs,hot,dropped", [(11, {3, 4}, True), (9, {2, 5}, True), (7, {2, 5}, False)])
def test_rounds_read_during_a_throttle_are_flagged_and_dropped(pairs, hot, dropped):
    """Rounds during which NVML reported a throttle reason are listed; they are dropped when at
    least 7 clean rounds remain (11 - 2 = 9; 9 - 2 = 7, exactly enough), else kept and said so
    (7 - 2 = 5)."""
    info = {}
    smp = _throttled_sampler(hot, ["a", "b"], 1, pairs)
    times, _, _ = bench.time_rounds({"a": Seq([10.0]), "b": Seq([5.0])}, pairs, 1, 1.0, smp, info=info)
    assert info["throttled"] == sorted(hot) and info["dropped"] is dropped
    assert len(times["a"]) == len(times["b"]) == (pairs - len(hot) if dropped else pairs)


def test_nvml_without_pynvml_and_with_an_old_one(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)            # not installed
    read, note = bench.nvml_reader()
    assert read is None and "NVML unavailable" in note
    nv = types.SimpleNamespace(nvmlInit=lambda: None, NVML_CLOCK_SM=0, NVML_CLOCK_MEM=1,
                               nvmlDeviceGetClockInfo=lambda h, c: 1980 if c == 0 else 3201,
                               nvmlDeviceGetPowerUsage=lambda h: 500_000)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.setattr(bench.timing, "_nvml_handle", lambda nv: "h")
    read, note = bench.nvml_reader()                             # no clock-event reasons at all
    assert read() == {"sm_mhz": 1980, "mem_mhz": 3201, "power_w": 500.0} and "not detected" in note
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x1 | 0x4   # idle (ignored) and a power cap
    read, note = bench.nvml_reader()
    assert read()["throttle"] == 0x4 and note == ""


# --- the noise floor, suspicious rows, the SOL as the best of its sweep -----------------------
def _aa(lo, hi):
    return {"kind": "aa", "key": "aa", "status": "timed", "ratios": {"a2_over_a": {"median": 1.0, "lo": lo, "hi": hi}},
            "sides": {"a": {"rounds": [10.0] * 7}}}


def test_a_side_faster_than_streaming_its_bytes_is_suspicious():
    """bw 4000 GB/s and 4 MB per call: streaming takes 1 µs. A side at 0.5 µs is 2x faster than
    the bytes allow (skipped work or a cache); one at 1.25 µs is not."""
    bw, nb = 4000.0, 4_000_000
    row = {"kind": "shape", "key": "shape:x:m1", "status": "timed", "ratios": {},
           "sides": {"a": {"path": "p", "bytes": nb, "rounds": [1.25] * 9},
                     "b": {"path": "q", "bytes": nb, "rounds": [0.5] * 9}}}
    res = {"rows": [_aa(0.99, 1.01), row], "stream_read_gbps": bw}
    j = bench.judge(res)
    assert len(j["suspicious"]) == 1 and j["suspicious"][0].startswith("shape:x:m1 b q: 2.00x")
    assert "suspicious" not in row["sides"]["a"]


def _step(sol_ms: dict, b_rounds, best):
    sol = {lab: {"time": {"median": v}, "pct_floor": 1.5 / v} for lab, v in sol_ms.items()}
    ratios = bench.round_ratios({"b": b_rounds, **{lab: [v] * len(b_rounds) for lab, v in sol_ms.items()}},
                                [("b", lab) for lab in sol_ms])
    return {"kind": "step", "key": "step:m1", "m": 1, "status": "timed", "floor_ms": 1.5, "sol": sol,
            "sol_best": best, "ratios": ratios,
            "sides": {"b": {"paths": {"out": "q"}, "gate": "PASS",
                            "time": {"median": float(np.median(b_rounds))}, "rounds": b_rounds}}}


def test_faster_than_the_best_sol_beyond_the_noise_is_suspicious():
    """The best SOL read takes 1.6 ms; B at 1.5 ms (6% faster) is suspicious with a 1% noise
    floor and within it with a 10% one; against a worse SOL read (2.3 ms) nothing would show
    which is why the SOL is the best of its sweep."""
    sols = {"sol": 2.0, "sol_pdl1": 2.3, "sol_pdl_all": 1.6}
    row = _step(sols, [1.5] * 9, "sol_pdl_all")
    assert bench.judge({"rows": [_aa(0.99, 1.01), row]})["suspicious"]
    row = _step(sols, [1.5] * 9, "sol_pdl_all")
    assert not bench.judge({"rows": [_aa(0.95, 1.10), row]})["suspicious"]


def test_the_targets_needed_time_is_read_against_the_best_sol():
    """M=1 wants >= 85% of a 1.5 ms floor: needs <= 1.5 / 0.85 = 1.765 ms, and <= 1.75 ms: 1.75 ms.
    Best SOL 1.6 ms: the target needs 1.6 / 1.75 = 91% of the SOL's speed. Had the SOL been the
    2.3 ms PDL-1 read alone, the target would read as below the speed of light."""
    row = _step({"sol": 2.0, "sol_pdl1": 2.3, "sol_pdl_all": 1.6}, [3.0] * 9, "sol_pdl_all")
    tg = next(t for t in bench.assess({"rows": [row]}, Config())["targets"] if t["target"] == "decode step M=1: tuned")
    need = min(1.5 / 0.85, 1.75)
    assert tg["needed_ms"] == pytest.approx(need) and tg["sol"]["label"] == "sol_pdl_all"
    assert tg["sol"]["needed_of_sol"] == pytest.approx(1.6 / need)
    assert "needs 91% of its speed" in tg["gap"] and "below the speed of light" not in tg["gap"]
    row = _step({"sol_pdl1": 2.3}, [3.0] * 9, "sol_pdl1")
    tg = next(t for t in bench.assess({"rows": [row]}, Config())["targets"] if t["target"] == "decode step M=1: tuned")
    assert "below the speed of light of this call structure" in tg["gap"]


def test_a_dry_run_with_a_path_faster_than_light_fails(tmp_path, capsys, monkeypatch):
    """A fake tuned M=1 path at 3x the bandwidth: the step row and the shape row are
    suspicious and the run FAILs (exit 1) instead of celebrating."""
    monkeypatch.setitem(bench.FAKE_EFF, "gemv", 3.0)
    argv = ["bench", "--dry-run", "--quick", "--shapes", "gate_up", "--m", "1", "--step-m", "none",
            "--jsonl", str(tmp_path / "r.jsonl")]
    rc = cli.main(["--device", DEVICE, *argv])
    out = capsys.readouterr().out
    # 47.6 MB a call: streaming 11.4 µs at the fake 4.16 TB/s; the fake gemv 3.7 + 2 µs
    assert rc == 1 and "SUSPICIOUS shape:gate_up:m1 b gemv" in out, out[-800:]
    assert out.strip().splitlines()[-1].startswith("FAIL: ") and "1 suspicious" in out


# --- checks after timing --------------------------------------------------------------------
class Mutating:
    """A timer whose samples write into a weight copy (a kernel that scribbles on its inputs)."""
    per = 1

    def __init__(self, w, y, x):
        self.w, self.y, self.x = w, y, x
        self.probe = checkafter.Probe(y, lambda: w @ x.t(), x, [x, w])

    def sample(self, reps, during=None):
        self.w[1, 0] += 1.0
        return 1.0

    def replay_sync(self):
        self.y.copy_(self.w @ self.x.t())

    def wall(self, reps):
        return 1.0


def test_inputs_changed_during_timing_are_caught_and_fingerprints_see_a_move():
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(4, 8, generator=g), torch.randn(1, 8, generator=g)
    y = torch.zeros(4, 1)
    t = Mutating(w, y, x)           # its expected output reads the scribbled weight too: only 'inputs' sees it
    before = checkafter.prints(t.probe)
    times = [t.sample(1) for _ in range(3)]
    got = checkafter.run(t, before, times, 1)
    assert got["inputs"]["ok"] is False and "1 of 2" in got["inputs"]["why"]
    assert got["output"]["ok"] and got["fresh input"]["ok"] and got["wall clock"]["ok"]
    a = torch.arange(16, dtype=torch.int32)
    b = a.clone()
    b[[3, 4]] = b[[4, 3]]                                   # same bytes, two neighbouring words swapped
    assert checkafter.fingerprint(a) != checkafter.fingerprint(b)


# --- the bench self-test's logic, with fakes -------------------------------------------------
class FakeTimer:
    """A 'graph' on the CPU: replays compute for real (so the checks after timing see what a
    kernel would leave), the times are this model's: µs the CUDA events would see, and the
    host clock's (WALL: the work another stream did)."""
    US = {"good": 10.0, "sol": 9.0, "cached": 0.5, "half": 5.0, "side": 0.2}
    WALL = {"side": 10.0}
    per = 1

    def __init__(self, kind, kit, checks=True):
        self.kind, self.kit = kind, kit
        n = kit.w[0].shape[0]
        self.y = torch.zeros(n, 1)
        self.pre = kit.w[0] @ kit.x.t()
        self.probe = (checkafter.Probe(self.y, lambda: kit.w[0] @ kit.x.t(), kit.x, [kit.x, *kit.w])
                      if kind != "sol" and checks else None)

    def _work(self):
        w, x, y = self.kit.w[-1], self.kit.x, self.y
        if self.kind == "cached":
            y.copy_(self.pre)
        elif self.kind == "half":
            h = y.shape[0] // 2
            y[:h] = w[:h] @ x.t()
        elif self.kind != "sol":
            y.copy_(w @ x.t())

    def sample(self, reps, during=None):
        self._work()
        if during:
            during()
        return self.US[self.kind] * (1 + self.kit.rng.uniform(-0.003, 0.003))

    def replay_sync(self):
        self._work()

    def wall(self, reps):
        return self.WALL.get(self.kind, self.US[self.kind])

    def close(self):
        pass


class FakeKit:
    sol_kinds = ("sol",)

    def __init__(self, checks=True):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(1, 32, generator=g)
        w = torch.randn(64, 32, generator=g)
        self.w = [w, w.clone(), w.clone()]
        self.rng = random.Random(1)
        self.checks = checks

    def resolution_refuses(self):
        return selftest.disguise_refused(DEVICE if DEVICE == "cpu" else "cuda")

    def timer(self, kind):
        return FakeTimer(kind, self, self.checks)


# fault -> the checks that must fire, from the fault's construction: a cached output cannot
# follow a rewritten x; half the rows left at zero differ from W x (and take half the time,
# under the SOL read's 9 µs); work the events miss shows on the host clock (and, at 0.2 µs,
# under the SOL); a disguised control resolves to the control's path and times within noise
# of it; a clock drop of THROTTLE (25%) halfway slows the closing bracket and is read by NVML.
WANT = {
    selftest.CLEAN: set(),
    "cached_output": {"check after timing: fresh input", "faster than SOL"},
    "half_weights": {"check after timing: output", "check after timing: fresh input", "faster than SOL"},
    "side_stream": {"check after timing: wall clock", "faster than SOL"},
    "control_disguise": {"A/B resolution", "A/A indistinguishable"},
    "throttle_midway": {"drift bracket", "throttle flags"},
}


def test_the_bench_selftest_catches_every_planted_fault_and_names_the_check():
    res = selftest.run(FakeKit())
    got = {r["fault"]: set(r["caught_by"]) for r in res["rows"]}
    assert got == WANT, (got, REPRO + "selftest_catches")
    assert res["ok"] and all(r["ok"] for r in res["rows"])
    table = "\n".join(selftest.lines(res))
    assert "none (clean control)" in table and "ok (no check fired)" in table
    assert sum(line.endswith(" caught") or " caught  [" in line for line in table.splitlines()) == len(selftest.FAULTS)


def test_the_bench_selftest_fails_when_a_check_is_missing():
    """Without probes (no checks after timing) the cached output is still faster than the SOL,
    but a kit whose fault is timed like the good kernel and carries no probe slips through:
    the self-test must say MISSED and fail."""
    kit = FakeKit(checks=False)
    FakeTimer.US["cached"] = 10.0
    try:
        res = selftest.run(kit, faults=["cached_output"])
    finally:
        FakeTimer.US["cached"] = 0.5
    row = next(r for r in res["rows"] if r["fault"] == "cached_output")
    assert row["caught_by"] == [] and not row["ok"] and not res["ok"]
    assert "MISSED" in "\n".join(selftest.lines(res))


# --- the regression gate -----------------------------------------------------------------------
def _run(rounds_b: list, key="shape:out:m1") -> dict:
    return {"header": {"config": {"env": "cuda", "device": "H200", "dtype": "bf16", "layout": "prepared"}},
            "rows": [{"kind": "shape", "key": key, "status": "timed",
                      "sides": {"b": {"rounds": rounds_b, "path": "gemv"}}}]}


def test_a_slowdown_whose_interval_excludes_one_fails_the_gate():
    """Stored B rounds ~100 µs (±0.5%); this run's ~105 µs: old/new = 0.952, every resample
    below 1, so a regression; at ~100.2 µs the interval straddles 1: within noise; a 10%
    tolerance lets the 5% slowdown pass."""
    rng = np.random.default_rng(2)
    old = list(100 * (1 + rng.uniform(-0.005, 0.005, 9)))
    slow = list(105 * (1 + rng.uniform(-0.005, 0.005, 9)))
    same = list(100.2 * (1 + rng.uniform(-0.005, 0.005, 9)))
    g = bench.baseline.compare(_run(slow), _run(old))
    assert len(g["regressions"]) == 1 and g["rows"][0]["speedup"]["hi"] < 1
    assert g["rows"][0]["speedup"]["median"] == pytest.approx(np.median(old) / np.median(slow))
    assert not bench.baseline.compare(_run(same), _run(old))["regressions"]
    assert not bench.baseline.compare(_run(slow), _run(old), tol=0.10)["regressions"]
    gone = bench.baseline.compare(_run(slow, key="shape:down:m1"), _run(old))
    assert gone["missing"] == ["shape:out:m1"] and not gone["rows"]


def _row(key, **sides):
    return {"kind": "shape", "key": key, "status": "timed",
            "sides": {s: {"rounds": v, "path": s} for s, v in sides.items()}}


def test_the_gate_judges_each_side_against_the_bf16_drift():
    """Both runs' BF16 side is a library the change cannot touch: a lease whose every side is 1%
    slower (BF16 too) is drift, within noise; B 5% slower with BF16 unchanged fails; the BF16
    side is the reference and the A/A rows are not judged."""
    rng = np.random.default_rng(3)

    def r(v):
        return list(v * (1 + rng.uniform(-0.002, 0.002, 9)))
    hdr = _run([1.0])["header"]
    old = {"header": hdr, "rows": [_row("shape:out:m2048", a=r(372), b=r(207), bf16=r(160)),
                                   _row("aa", a=r(372))]}
    drift = {"header": hdr, "rows": [_row("shape:out:m2048", a=r(376), b=r(209), bf16=r(161.6)),
                                     _row("aa", a=r(380))]}
    g = bench.baseline.compare(drift, old)
    assert not g["regressions"], g["regressions"]
    assert {(e["key"], e["side"]) for e in g["rows"]} == {("shape:out:m2048", s) for s in ("a", "b", "bf16")}
    assert all(not e["regression"] for e in g["rows"])
    raw = next(e for e in g["rows"] if e["side"] == "a")["raw"]
    assert raw["hi"] < 1, "the drift alone must exclude 1 (else this test shows nothing)"
    slow = {"header": hdr, "rows": [_row("shape:out:m2048", a=r(372), b=r(217.4), bf16=r(160))]}
    g = bench.baseline.compare(slow, old)
    assert len(g["regressions"]) == 1 and g["regressions"][0].startswith("shape:out:m2048 b: 0.95"), g["regressions"]


def test_bench_baseline_on_the_cli(tmp_path, capsys):
    """A dry run against its own stored result passes (the fake timings repeat exactly); against
    a stored run whose B was 10% faster it fails with the row named; a stored run from another
    device is refused before the run."""
    base = ["bench", "--dry-run", "--quick", "--shapes", "out", "--m", "1", "--step-m", "none"]
    j = tmp_path / "base.json"
    assert cli.main(["--device", DEVICE, *base, "--json", str(j)]) == 0
    capsys.readouterr()
    argv = [*base, "--baseline", str(j), "--jsonl", str(tmp_path / "x.jsonl")]
    rc = cli.main(["--device", DEVICE, *argv])
    out = capsys.readouterr().out
    assert rc == 0 and "0 slower beyond it" in out and "0 regressions" in out, out[-600:]
    res = json.loads(j.read_text())
    for r in res["rows"]:
        b = (r.get("sides") or {}).get("b")
        if b and b.get("rounds"):
            b["rounds"] = [v * 0.9 for v in b["rounds"]]
    faster = tmp_path / "faster.json"
    faster.write_text(json.dumps(res))
    rc = cli.main(["--device", DEVICE, *base, "--baseline", str(faster), "--jsonl", str(tmp_path / "y.jsonl")])
    out = capsys.readouterr().out
    assert rc == 1 and "REGRESSION shape:out:m1 b: 0.900x the stored run" in out, out[-600:]
    res["header"]["config"]["device"] = "NVIDIA B200"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(res))
    rc = cli.main(["--device", DEVICE, *base, "--baseline", str(other), "--jsonl", str(tmp_path / "z.jsonl")])
    assert rc == 2 and "recorded with other settings: device 'NVIDIA B200'" in capsys.readouterr().err
    assert bench_cli.verdict({"blocked": [], "errors": [], "not_run": [], "baseline": {"regressions": ["x"]}})[0] == "FAIL"


# --- on a GPU: the same logic on CUDA graphs -------------------------------------------------
@pytest.mark.gpu
def test_the_bench_selftest_on_cuda_graphs(device):
    """`./pq2 bench --selftest` as a test: every planted fault caught by one of its checks on real
    CUDA graphs, the clean control flagged by none."""
    res = selftest.run(selftest.GpuKit())
    table = "\n".join(selftest.lines(res))
    assert res["ok"], table + "\nreproduce: ./pq2 bench --selftest"
    got = {r["fault"]: set(r["caught_by"]) for r in res["rows"]}
    for fault, want in selftest.FAULTS.items():
        assert got[fault] & set(want), (fault, got[fault], table)
    assert got[selftest.CLEAN] == set(), table


@pytest.mark.gpu
@pytest.mark.parametrize("pdl,depth", [(False, None), (True, 0), (True, 1), (True, 2), (True, 4), (True, 8)])
def test_sol_sweep_reads_every_element_inside_a_graph(pdl, depth, device):
    """Every prefetch depth of the SOL sweep, captured in one CUDA graph with PDL edges, reads
    every element of its own buffer on each replay."""
    import functools
    import operator

    def xor(t):
        return functools.reduce(operator.xor, (t.to(torch.int64) & 0xFFFFFFFF).tolist(), 0)
    g = torch.Generator(device="cuda").manual_seed(3)
    bufs = [torch.randint(-2 ** 31, 2 ** 31 - 1, (n,), generator=g, dtype=torch.int32, device="cuda")
            for n in (1 << 22, 3 * (1 << 18) + 5, 4096)]
    calls = [bench.read_call(b, pdl, depth) for b in bufs]
    timer = bench.GraphTimer([t for t, _ in calls], 1)
    try:
        for _, part in calls:
            part.zero_()
        timer.replay_sync()
        assert all(xor(p.cpu()) == xor(b.cpu()) for b, (_, p) in zip(bufs, calls)), \
            f"reproduce: ./pq2 test --device cuda tests/test_bench_stats.py -k sol_sweep"
    finally:
        timer.close()
