"""The step at serving clocks (bench.power) and the launch cost outside graphs (bench.launch).

On the CPU: the spin calibration, the graphs with and without spins, the matrix time as the
per-round difference, the host-µs measurement on a fake clock, the first-call cache verdict,
and both through the dry run (expected values from the fake model, derived here); failures in
either are noted in their rows and do not fail the run. On a GPU (`-m gpu`): the spin is
calibrated and lasts what it was asked, and the host cost of a real path is measured with the
GPU kept busy.
"""
import json
import statistics

import pytest

from pq2verify import bench
from pq2verify.bench import report as bench_report
from pq2verify.bench import Config, FakeEnv, Item, launch, power
from pq2verify.bench.checkafter import Thunks
from pq2verify.bench.contestants import Call, Contestant
from pq2verify.bench.envs import FAKE_HOST_US, FAKE_SM_MHZ

REPRO = "pytest -p no:randomly -q tests/test_bench_power_launch.py -k "


# --- power proxy ---------------------------------------------------------------------------------
def test_spin_calibration_reads_the_sm_clock_or_falls_back_to_the_events():
    cal = power.calibration([1900, 1980, 1950], 20_000_000, 10_500.0)
    assert cal["cycles_per_us"] == 1950 and cal["nvml_sm_mhz"] == 1950 and "NVML" in cal["source"], REPRO + "calibration"
    # 20e6 cycles in 10,500 µs: 1,904.76 cycles per µs, kept beside the NVML clock as a cross-check
    assert cal["events_cycles_per_us"] == pytest.approx(20e6 / 10_500)
    ev = power.calibration([], 20_000_000, 10_000.0)
    assert ev["cycles_per_us"] == pytest.approx(2000.0) and "event" in ev["source"], REPRO + "calibration"
    with pytest.raises(RuntimeError, match="no SM clock"):
        power.calibration([], 20_000_000, None)
    assert power.cycles_for(5.0, 1980.0) == 9900 and power.cycles_for(1e-6, 1000.0) == 1


def _contestant(n: int, log: list):
    calls = [Call("p", 8, 16, 1, 100 + i) for i in range(n)]

    def build():
        t = Thunks((lambda i=i: log.append(("call", i))) for i in range(n))
        t.probe = "the step's probe"
        return t
    return Contestant("b", calls, build, 1)


def test_a_spin_follows_every_call_and_the_probe_is_kept():
    log = []
    c = power.with_spins(_contestant(3, log), "b+spin", 777, 4.0, spin=lambda cyc: log.append(("spin", cyc)))
    t = c.build()
    for f in t:
        f()
    assert log == [("call", 0), ("spin", 777), ("call", 1), ("spin", 777), ("call", 2), ("spin", 777)], \
        REPRO + "spin_follows"
    assert t.probe == "the step's probe" and c.label == "b+spin" and c.per == 1
    assert c.nbytes == 100 + 101 + 102            # spins read no weight bytes
    assert [x.path for x in c.calls] == ["p", "spin"] * 3 and c.calls[1].us == 4.0
    log.clear()
    s = power.spins_only(5, 42, 4.0, spin=lambda cyc: log.append(cyc))
    for f in s.build():
        f()
    assert log == [42] * 5 and s.label == "spin" and s.nbytes == 0
    assert power.matrix_rounds([10.0, 12.0], [4.0, 5.0]) == [6.0, 7.0]


def test_the_step_at_serving_clocks_separates_the_matrix_time_from_the_spins():
    """Noise-free fake timings: a spin costs its µs plus 2 µs of launch (the fake model), so
    b+spin = b + 305 (spin + 2) and the spins alone = 305 (spin + 2): the matrix time is b's."""
    env = FakeEnv(noise=0)
    spin = 7.5
    row = bench.run_step(env, Config(pairs=7, warmup=1, spin_us=spin), Item("step", 4), 4000.0, {})
    assert row["status"] == "timed", REPRO + "serving_clocks"
    pw = row["power"]
    assert pw["cycles"] == round(spin * FAKE_SM_MHZ) == 14850 and pw["spins"] == 305
    assert {"a+spin", "b+spin", "spin"} <= set(env.built)
    spin_ms = 305 * (spin + 2.0) / 1e3
    assert pw["sides"]["spin"]["time"]["median"] == pytest.approx(spin_ms)
    assert pw["sides"]["spin"]["us_per_spin"] == pytest.approx(spin + 2.0)
    for s in ("a", "b"):
        plain = row["sides"][s]["time"]["median"]
        sp = pw["sides"][f"{s}+spin"]
        assert sp["time"]["median"] == pytest.approx(plain + spin_ms), REPRO + "serving_clocks"
        assert sp["matrix"]["median"] == pytest.approx(plain) and sp["matrix"]["lo"] == pytest.approx(plain)
        assert sp["matrix_over_plain"]["median"] == pytest.approx(1.0)
        assert sp["matrix_pct_floor"] == pytest.approx(row["floor_ms"] / plain)
    a, b = (row["sides"][s]["time"]["median"] for s in ("a", "b"))
    assert pw["b_over_a"]["median"] == pytest.approx(a / b)
    cells = dict(zip(bench_report.POWER_COLS, bench_report.power_cells(row)))
    assert cells["spin µs (cycles; cycles/µs)"] == "7.5 (14850; 1,980)"
    assert cells["B+spin ms"] == f"{b + spin_ms:.3f}" and cells["B matrix ms"].startswith(f"{b:.3f} [")
    assert cells["note"] == "-"
    # no spin asked: no power-proxy graphs at all
    env0 = FakeEnv(noise=0)
    row0 = bench.run_step(env0, Config(pairs=7, warmup=1, spin_us=0), Item("step", 4), 4000.0, {})
    assert "power" not in row0 and not {"a+spin", "b+spin", "spin"} & set(env0.built)


class _BrokenSpins(FakeEnv):
    def __init__(self, cal_fails=False):
        super().__init__(noise=0)
        self.cal_fails = cal_fails

    def spin_calibration(self):
        if self.cal_fails:
            raise RuntimeError("no clock")
        return super().spin_calibration()

    def timer(self, c):
        if c.label == "b+spin":
            raise RuntimeError("capture refused")
        return super().timer(c)


def test_a_failed_power_proxy_is_noted_and_the_step_stands(tmp_path):
    row = bench.run_step(_BrokenSpins(), Config(pairs=7, warmup=1), Item("step", 1), 4000.0, {})
    pw = row["power"]
    assert row["status"] == "timed" and row["sides"]["b"]["time"], REPRO + "failed_power"
    assert "capture refused" in pw["sides"]["b+spin"]["error"] and pw["sides"]["a+spin"]["matrix"]
    assert "b+spin ERROR graph build failed" in bench_report.power_cells(row)[-1]
    row = bench.run_step(_BrokenSpins(cal_fails=True), Config(pairs=7, warmup=1), Item("step", 1), 4000.0, {})
    assert row["status"] == "timed" and row["power"]["error"] == "spin calibration failed: RuntimeError: no clock"
    res = bench.run(Config(shapes="gate_up", ms=(1,), step_ms=(1,), pairs=7, warmup=1), _BrokenSpins(),
                    jsonl=tmp_path / "r.jsonl")
    assert not res["errors"] and not res["suspect"], REPRO + "failed_power"
    assert any(line.startswith("POWER PROXY step:m1 b+spin") for line in bench_report.summary_lines(res))
    md = bench_report.markdown(res, None)
    assert "### At serving clocks" in md and "- spin calibration: NVML SM clock during a 20000000-cycle spin" in md
    assert "b+spin ERROR graph build failed: RuntimeError: capture refused" in md, REPRO + "failed_power"


# --- launch cost -----------------------------------------------------------------------------------
class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_host_microseconds_are_the_median_per_call_and_idle_rounds_are_counted():
    clock, costs = _Clock(), iter([10, 30, 20, 50, 40, 60])       # µs of six calls, two rounds of three
    settled, started = [], []

    def call():
        clock.t += next(costs) * 1e-6

    def busy(n):
        started.append(n)
        return lambda: len(started) == 2          # the second round outlasted its spin
    h = launch.host_us(call, calls=3, rounds=2, clock=clock, busy=busy, settle=lambda: settled.append(1))
    assert h["median_us"] == pytest.approx(35.0) and h["min_us"] == pytest.approx(10.0)   # median of 10..60
    assert h["max_us"] == pytest.approx(60.0) and h["n"] == 6, REPRO + "host_microseconds"
    assert h["idle_rounds"] == 1 and started == [3, 3] and len(settled) == 2


def test_the_first_call_says_whether_the_cache_was_warm():
    clock, syncs = _Clock(), []

    def fn():
        clock.t += 1.5
        return "path"
    for counts, cache in (([4, 6], "cold: compiled (2 new cache entries)"), ([4, 4], "warm: loaded from the "
                                                                                      "on-disk cache")):
        it = iter(counts)
        out, rec = launch.first_call(fn, lambda: syncs.append(1), clock=clock, entries=lambda: next(it))
        assert out == "path" and rec["ms"] == pytest.approx(1500.0) and rec["cache"] == cache, REPRO + "first_call"
    assert len(syncs) == 4
    d = launch.cache_dir()
    assert d and launch.cache_entries("/nonexistent/pq2verify-cache") == 0


def _launch_res(tmp_path, env):
    cfg = Config(shapes="gate_up,in_proj_ba", ms=(2048,), step_ms=(), pairs=7, warmup=1)
    return bench.run(cfg, env, jsonl=tmp_path / "r.jsonl")


def test_the_launch_cost_table_flags_a_launcher_bound_path(tmp_path):
    """Fake host µs per path (FAKE_HOST_US) against the fake GPU time per call: each copy's
    weight bytes over the fake bandwidth, or its int8/bf16 rate at M > 16, plus 2 µs."""
    res = _launch_res(tmp_path, FakeEnv(noise=0))
    rows = {r["key"]: r for r in res["rows"]}
    shapes = bench.step_shapes()
    seen = 0
    for nm in ("gate_up", "in_proj_ba"):
        lr = rows[f"launch:{nm}:m2048"]
        assert lr["status"] == "timed", REPRO + "launch_cost_table"
        sh = shapes[nm]
        for e in lr["entries"]:
            nb = sh.n * sh.k * 2 if sh.dense or e["path"] == "cublas" else sh.n * (sh.k // 128) * 34
            t = nb / (bench.FAKE_BW * bench.FAKE_EFF.get(e["path"], 0.5))
            t = max(t, 2 * 2048 * sh.n * sh.k / bench.FAKE_RATE.get(e["path"], 0.1e15))
            gpu = t * 1e6 + 2.0
            host = FAKE_HOST_US.get(e["path"], 50.0)
            assert e["gpu_us"] == pytest.approx(gpu) and e["host"]["median_us"] == pytest.approx(host), \
                REPRO + "launch_cost_table"
            assert e["dominates"] == (host > gpu) and e["host_over_gpu"] == pytest.approx(host / gpu)
            assert e["first_call"]["ms"] == bench.envs.FAKE_FIRST_MS
            seen += 1
    # in_proj_ba's 96x5120 bf16 matrix is a few µs on the fake GPU: its 12 µs launcher dominates
    ba = rows["launch:in_proj_ba:m2048"]["entries"]
    assert [e["sides"] for e in ba] == ["a,b"] and ba[0]["dominates"] and "launcher-bound" in ba[0]["note"]
    assert not any(e["dominates"] for e in rows["launch:gate_up:m2048"]["entries"]) and seen >= 2
    md = bench_report.markdown(res, None)
    assert "## Launch cost outside graphs" in md and "No cached launch plan was built" in md
    assert "| in_proj_ba | 2048 | a,b | cublas | 12.0 (12.0) |" in md, REPRO + "launch_cost_table"
    assert any("launcher-bound in eager prefill" in line and "cublas at in_proj_ba M=2048" in line
               for line in bench_report.summary_lines(res))
    assert json.loads(json.dumps(res, default=str))["rows"][-2]["kind"] == "launch"


class _BrokenHost(FakeEnv):
    def host_cost(self, path, inp):
        if path == "cublas":
            raise RuntimeError("launcher exploded")
        return super().host_cost(path, inp)


def test_a_failed_launch_measurement_is_a_row_that_says_so(tmp_path, capsys):
    res = _launch_res(tmp_path, _BrokenHost(noise=0))
    rows = {r["key"]: r for r in res["rows"]}
    ba = rows["launch:in_proj_ba:m2048"]
    assert ba["status"] == "instrument failed" and ba["entries"][0]["error"] == "RuntimeError: launcher exploded"
    assert rows["launch:gate_up:m2048"]["status"] == "timed"
    assert not res["errors"], REPRO + "failed_launch"        # the measurements of the kernels stand
    assert "LAUNCH COST launch:in_proj_ba:m2048 cublas: RuntimeError: launcher exploded" in \
        bench_report.summary_lines(res)
    assert bench_report.launch_cells(ba, ba["entries"][0])[-1] == "ERROR RuntimeError: launcher exploded"
    # a launch row that failed as a whole (no entries) still has its line in the table
    res["rows"].append({"kind": "launch", "key": "launch:down:m128", "shape": "down", "m": 128,
                        "status": "instrument failed", "error": "inputs: MemoryError: "})
    cells = [c for r, e in bench_report.launch_entries(res) if r["key"] == "launch:down:m128"
             for c in [bench_report.launch_cells(r, e)]]
    assert cells and cells[0][-1] == "ERROR inputs: MemoryError: ", REPRO + "failed_launch"


def test_the_launch_rows_run_after_the_budget_is_spent(tmp_path):
    """Cheap, and the table is asked for: a spent budget leaves the kernels' rows, not them."""
    clock = iter(range(0, 10_000, 100))
    cfg = Config(shapes="gate_up", ms=(1, 2048), step_ms=(), pairs=7, warmup=1, budget_s=150)
    res = bench.run(cfg, FakeEnv(), jsonl=tmp_path / "r.jsonl", clock=lambda: next(clock))
    assert "shape:gate_up:m1" in res["not_run"] or "shape:gate_up:m2048" in res["not_run"], REPRO + "budget"
    assert "launch:gate_up:m2048" not in res["not_run"]
    assert any(r["key"] == "launch:gate_up:m2048" for r in res["rows"])


# --- GPU ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_a_spin_lasts_what_it_was_asked_inside_a_graph(device):
    """Calibrated cycles per µs, then 50 spins of 10 µs in one graph: about 500 µs a replay
    (each graph node adds at most a few µs of launch)."""
    read, _ = bench.nvml_reader()
    cal = power.measure_calibration(read)
    assert 300 < cal["cycles_per_us"] < 3000, cal
    c = power.spins_only(50, power.cycles_for(10.0, cal["cycles_per_us"]), 10.0)
    timer = bench.GraphTimer(c.build(), 1)
    try:
        t = statistics.median(timer.sample(20) for _ in range(5))
    finally:
        timer.close()
    assert 0.85 * 500 < t < 500 + 50 * 5, f"{t:.1f} µs per replay of 50 x 10 µs spins; calibration {cal}"


@pytest.mark.gpu
def test_host_cost_of_a_real_path_is_measured_with_the_gpu_busy(device):
    env = bench.RealEnv("cuda")
    shape = bench.Shape("g", 1024, 2048)
    case = bench.bench_case("native", shape, 128, Config())
    inp = env.inputs(case)
    path, g = env.side("legacy", case, inp)
    assert g.ok and path in env.first_calls and env.first_calls[path]["ms"] > 0
    h = env.host_cost(path, inp)
    assert h["n"] == launch.CALLS * launch.ROUNDS and 0 < h["median_us"] < 5000, h
    assert h["idle_rounds"] == 0, f"a round outlasted its {launch.BUSY_US_PER_CALL} µs-per-call spin: {h}"


def test_the_first_call_of_each_path_is_the_one_recorded(monkeypatch):
    """RealEnv.side times the trace that first runs a path (device synchronized around it) and
    keeps that record: a later call of the same path never replaces it."""
    import torch

    from pq2verify.bench import envs
    env = bench.RealEnv("cpu")
    env.can_time = True                            # as on a GPU, without one
    syncs, paths = [], iter(["native", "native", "mmq"])
    counts = iter([3, 5, 5, 5, 5, 5])              # entries around each call: the first one compiled
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: syncs.append(1))
    monkeypatch.setattr(envs, "traced_path", lambda kset, inp: next(paths))
    monkeypatch.setattr(launch, "cache_entries", lambda d: next(counts))
    monkeypatch.setattr(env, "gate", lambda case, inp, baseline=False: bench.Gate(case.path, True, ""))
    case = bench.bench_case("native", bench.Shape("g", 64, 256), 32, Config())
    got = [env.side(k, case, None)[0] for k in ("legacy", "tuned", "tuned")]
    assert got == ["native", "native", "mmq"] and len(syncs) == 6, REPRO + "first_call_of_each"
    assert env.first_calls["native"]["cache"] == "cold: compiled (2 new cache entries)"
    assert env.first_calls["native"]["kset"] == "legacy" and env.first_calls["native"]["case"] == case.id
    assert env.first_calls["mmq"]["cache"] == "warm: loaded from the on-disk cache"
