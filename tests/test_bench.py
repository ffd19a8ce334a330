"""Benchmarks gated on numerics (pq2verify.bench).

On the CPU: the gate's logic with deliberately wrong fake kernels, the engine (alternating
rounds, sampler, budget, resume), the dry run through the CLI, the report and plot, and the
bench tests' gate on the interpreter (small shapes; timing skips with a reason).
On a GPU (`pytest -m bench --device cuda --benchmark-json=FILE`): every (shape, M, kernel set)
gated then timed with pytest-benchmark over a CUDA graph of rotating weight copies, and the
decode step per kernel set.
"""
import json
import os
import sys
import time
import types
from collections import Counter
from dataclasses import replace

import pytest
import torch

from pq2verify import backend, bench, bench_report, checks, inputs, registry
from pq2verify.bench import Config, FakeEnv, Item, Shape

DEVICE = backend.device()
SMALL = Shape("b", 64, 384)


# --- fake kernels: one right, several subtly wrong ---------------------------------------
def _right(x, w, *, out=None, dots=None):
    from reference import pq2
    wd = torch.from_numpy(pq2.decode(w.to("cpu")))
    y = (x.cpu().double() @ wd.T).to(x.dtype).to(x.device)
    if out is None:
        return y
    out.copy_(y)
    return out


def _wrong(x, w, *, out=None, dots=None):
    out.copy_(_right(x, w) * 1.02)          # 2% off: far over bf16's rounding budget
    return out


def _unwritten(x, w, *, out=None, dots=None):
    out[:-1] = _right(x, w)[:-1]            # the last row keeps the NaN the gate filled in
    return out


def _crash(x, w, *, out=None, dots=None):
    raise RuntimeError("kernel launch failed (fake)")


def _one_ulp(x, w, *, out=None, dots=None):
    out.copy_(_right(x, w))
    out.view(torch.int16)[0, 0] += 1        # within tolerance, but not the claimed bytes
    return out


FAKES = {"fake_right": _right, "fake_wrong": _wrong, "fake_unwritten": _unwritten, "fake_crash": _crash,
         "fake_one_ulp": _one_ulp}


@pytest.fixture
def fakes(monkeypatch):
    """Registry paths whose kernels are the functions above (floating, against the dense FP64
    reference, so the bound is bf16 rounding); fake_one_ulp claims fake_right's exact bytes."""
    for name, fn in FAKES.items():
        mod = types.ModuleType(f"fake_kernels_{name}")
        mod.run = fn
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
        path = registry.Path(name, mod.__name__, "tuned", 1, None, arithmetic="floating", reference="dense",
                             has_dots=False, bit_identical_to="fake_right" if name == "fake_one_ulp" else None)
        monkeypatch.setitem(registry.BY_NAME, name, path)
    return FAKES


def _gate(path, m=2, shape=SMALL):
    case = bench.bench_case(path, shape, m, Config())
    return bench.gate(case, checks.Inputs(case, "cpu"), "cpu", reruns=1)


def test_gate_allows_a_correct_kernel(fakes):
    g = _gate("fake_right")
    assert g.ok and g.status == "PASS", g.reason
    assert g.detail["rel_rms_dense"] <= g.detail["tol_dense"] and g.detail["written"]


@pytest.mark.parametrize("path,why", [("fake_wrong", "relative RMS vs dense FP64 reference"),
                                      ("fake_unwritten", "output not written"),
                                      ("fake_crash", "raised RuntimeError: kernel launch failed"),
                                      ("fake_one_ulp", "exactness claim 'bytes == fake_right' does not hold")])
def test_gate_blocks_a_wrong_kernel(fakes, path, why):
    g = _gate(path)
    assert not g.ok and g.status == "BLOCKED"
    assert why in g.reason
    assert g.detail["repro"].startswith("pq2verify check --case fake_")


class GatedFakeTime(bench.RealEnv):
    """Real gates on the CPU, fixed paths per kernel set, fake timers that record what was built."""

    def __init__(self, paths):
        super().__init__("cpu")
        self.can_time, self.paths, self.built = True, paths, []

    def side(self, kset, case0, inp):
        path = self.paths[kset]
        return path, self.gate(replace(case0, path=path), inp)

    def timer(self, c):
        self.built.append(c.label)
        return bench.FakeTimer(c, 1)

    def sampler(self):
        return bench.Sampler(lambda: {"sm_mhz": 1980.0, "power_w": 500.0}, 0)

    def release(self):
        pass


def test_blocked_side_is_never_timed(fakes):
    env = GatedFakeTime({"legacy": "fake_right", "tuned": "fake_wrong"})
    row = bench.run_shape(env, Config(pairs=7, warmup=1), Item("shape", 2, SMALL), bw=4000.0)
    a, b, bf = row["sides"]["a"], row["sides"]["b"], row["sides"]["bf16"]
    assert row["status"] == "blocked"
    assert (a["gate"], b["gate"], bf["gate"]) == ("PASS", "BLOCKED", "PASS"), bf["reason"]
    assert "relative RMS" in b["reason"]
    assert sorted(env.built) == ["a", "bf16"]                 # b's graph was never built
    assert "time" not in b and a["time"]["n"] == 7
    assert "b_over_a" not in row["ratios"] and "a_over_bf16" in row["ratios"]
    assert bench_report.shape_cells(row)[6] == "BLOCKED"
    assert any("fake_wrong" in line for line in bench_report.blocked_lines({"rows": [row]}))


def test_a_passing_pair_is_timed_and_compared(fakes):
    env = GatedFakeTime({"legacy": "fake_right", "tuned": "fake_right"})
    row = bench.run_shape(env, Config(pairs=7, warmup=1), Item("shape", 1, SMALL), bw=4000.0)
    assert row["status"] == "timed" and row["control"]          # same path both sides: A/A
    assert sorted(env.built) == ["a", "b", "bf16"]
    assert "A/A" in bench_report.ratio_cell(row["ratios"]["b_over_a"], row["control"])
    assert row["sides"]["b"]["clocks"]["sm_mhz"]["median"] == 1980.0


def test_timed_calls_are_the_gated_function(fakes):
    """The thunks a graph would capture: the gated x, distinct copies of the gated weight, one
    preallocated output; run here eagerly on the CPU."""
    cfg = Config(rotate_gb=4 * bench.pq2_nbytes(SMALL.n, SMALL.k) / bench.GB)     # 4 copies
    case = bench.bench_case("fake_right", SMALL, 3, cfg)
    inp = checks.Inputs(case, "cpu")
    want = _right(inp.x, inp.w)
    c = bench.contestant_for("b", "fake_right", SMALL, 3, cfg, inp)
    thunks = c.build()
    assert len(thunks) == len(c.calls) == c.per == 4 and c.nbytes == bench.pq2_nbytes(SMALL.n, SMALL.k)
    ws = [t.args[1] for t in thunks]
    assert ws[0] is inp.w and len({w.data.data_ptr() for w in ws}) == 4
    assert all(torch.equal(w.data, inp.w.data) for w in ws) and all(t.args[0] is inp.x for t in thunks)
    for t in thunks:
        t.keywords["out"].fill_(float("nan"))
        assert torch.equal(t(), want)
    binp = bench.BaselineInputs(inp, torch.bfloat16)
    b = bench.contestant_for("bf16", "cublas", SMALL, 3, cfg, inp, binp)
    bt = b.build()
    assert b.per == len(bt) == 1 and b.nbytes == SMALL.n * SMALL.k * 2      # 7.5x the PQ2 bytes: one copy
    assert all(torch.equal(t(), inp.x @ binp.w.t()) for t in bt)


def test_step_calls_use_distinct_weights_in_model_order(fakes):
    cfg = Config()
    parts = {}
    for i, nm in enumerate(bench.STEP_COUNTS):
        sh = Shape(nm, 8 + i, 128)
        case = bench.bench_case("fake_right", sh, 2, cfg)
        inp = checks.Inputs(case, "cpu")
        parts[nm] = (sh, inp, bench.BaselineInputs(inp, torch.bfloat16))
    paths = {nm: "fake_right" for nm in parts}
    for dense in (False, True):
        c = bench.step_contestant("s", None if dense else paths, parts, 2, bench.step_copies(parts, dense), dense)
        thunks = c.build()
        assert len(thunks) == 257 and c.per == 1
        ws = [t.args[1] for t in thunks]
        ptrs = {(w.data if not dense else w).data_ptr() for w in ws}
        assert len(ptrs) == 257                                   # no weight is read twice in a step
        order = bench.step_order()
        assert [t.keywords["out"].shape[1] for t in thunks] == [parts[nm][0].n for nm in order]
        y = thunks[-1]()                                          # lm_head
        ref = _right(parts["lm_head"][1].x, parts["lm_head"][1].w)
        assert torch.equal(y, ref) if not dense else torch.equal(y, parts["lm_head"][1].x @ parts["lm_head"][2].w.t())


def test_baseline_decode_matches_the_reference():
    from reference import pq2
    for layout in ("prepared", "raw"):
        w = inputs.ternary_weight(40, 256, seed=3, layout=layout)
        ref = torch.from_numpy(pq2.decode(w))
        assert torch.equal(bench.decode_dense(w, torch.float32, rows_per_chunk=16).double(), ref)
        assert torch.equal(bench.decode_dense(w, torch.bfloat16), ref.to(torch.bfloat16))


# --- the engine ----------------------------------------------------------------------------
class Rec:
    per = 2

    def __init__(self, name, log, us):
        self.name, self.log, self.us = name, log, us

    def sample(self, reps, during=None):
        self.log.append(self.name)
        if during:
            during()
        return self.us


def test_rounds_alternate_and_ratios_are_per_round():
    log = []
    timers = {lab: Rec(lab, log, us) for lab, us in (("a", 30.0), ("b", 10.0), ("bf16", 60.0))}
    smp = bench.Sampler(lambda: {"sm_mhz": 1.0}, 0)
    times, reps, orders = bench.time_rounds(timers, 7, 1, 1.0, smp)
    assert log[:3] == ["a", "b", "bf16"]                         # the warm-up round
    assert orders[0] == ["a", "b", "bf16"] and orders[1] == ["bf16", "b", "a"] and len(orders) == 7
    assert all(len(v) == 7 for v in times.values())
    assert reps == {"a": 17, "b": 50, "bf16": 9}                 # samples of >= 1 ms (2 units a replay)
    r = bench.round_ratios(times, [("a", "b"), ("bf16", "b")])
    assert r["b_over_a"]["median"] == 3.0 and r["b_over_bf16"]["median"] == 6.0
    assert smp.summary("b")["n"] == 7 and smp.summary(None)["n"] == 0


def test_sampler_thread_tags_readings():
    n = iter(range(10 ** 6))
    with bench.Sampler(lambda: {"sm_mhz": float(next(n))}, 0.001) as smp:
        smp.mark("x")
        time.sleep(0.05)
        smp.mark(None)
    s = smp.summary("x")
    assert s["n"] >= 3 and s["sm_mhz"]["min"] < s["sm_mhz"]["max"]


def test_decode_step_is_the_257_projections():
    order = bench.step_order()
    assert len(order) == 257 and Counter(order) == bench.STEP_COUNTS
    assert order[-1] == "lm_head" and order[12:16] == ["qkv", "out", "gate_up", "down"]
    shapes = bench.step_shapes()
    pq2 = sum(bench.pq2_nbytes(shapes[s].n, shapes[s].k) for s in order)
    bf16 = sum(bench.dense_nbytes(shapes[s].n, shapes[s].k, "bf16") for s in order)
    assert 6.75e9 < pq2 < 6.85e9 and 51e9 < bf16 < 51.3e9        # SPEC §6: 6.8 GB; bf16 51.2 GB


def test_plan_puts_the_targets_first():
    shapes = bench.select_shapes("gate_up,in_proj_ba", "bonsai27b")
    plan = bench.make_plan(Config(ms=(2, 1, 2048, 128), step_ms=(1, 16)), shapes, with_step=True)
    assert [i.key for i in plan] == ["bandwidth", "shape:gate_up:m1", "shape:in_proj_ba:m1", "step:m1",
                                     "shape:gate_up:m2048", "shape:in_proj_ba:m2048", "step:m16",
                                     "shape:gate_up:m2", "shape:in_proj_ba:m2",
                                     "shape:gate_up:m128", "shape:in_proj_ba:m128"]
    with pytest.raises(ValueError, match="unknown"):
        bench.select_shapes("gate_upp", "bonsai27b")
    with pytest.raises(ValueError, match="at least 7"):
        Config(pairs=5).check()


def test_budget_stops_and_resume_finishes(tmp_path):
    jl = tmp_path / "r.jsonl"
    cfg = Config(shapes="gate_up,down", ms=(1,), step_ms=(1,), pairs=7, warmup=1, budget_s=25)
    ticks = iter(range(0, 10 ** 6, 10))
    env1 = FakeEnv()
    r1 = bench.run(cfg, env1, jsonl=jl, clock=lambda: next(ticks))
    assert [r["key"] for r in r1["rows"]] == ["bandwidth", "shape:gate_up:m1"]
    assert r1["not_run"] == ["shape:down:m1", "step:m1"]
    assert "not run" in " ".join(bench_report.summary_lines(r1))
    env2 = FakeEnv()
    r2 = bench.run(replace(cfg, budget_s=None), env2, jsonl=jl, resume=True)
    assert r2["resumed"] == ["bandwidth", "shape:gate_up:m1"] and not r2["not_run"]
    assert len(r2["rows"]) == 4 and r2["rows"][-1]["status"] == "timed"
    assert "bf16" in env2.built and env2.built.count("a") == 2   # down, then the step
    lines = [json.loads(s) for s in jl.read_text().splitlines()]
    assert [x["kind"] for x in lines] == ["header", "bandwidth", "shape", "shape", "step"]
    with pytest.raises(ValueError, match="other settings"):
        bench.run(replace(cfg, pairs=9), FakeEnv(), jsonl=jl, resume=True)


def test_a_broken_line_is_rerun(tmp_path):
    jl = tmp_path / "r.jsonl"
    cfg = Config(shapes="out", ms=(1,), step_ms=(), pairs=7, warmup=1)
    bench.run(cfg, FakeEnv(), jsonl=jl)
    jl.write_text(jl.read_text()[:-40])                          # a crash cut the last line
    env = FakeEnv()
    r = bench.run(cfg, env, jsonl=jl, resume=True)
    assert r["resumed"] == ["bandwidth"] and env.built == ["a", "b", "bf16"]


def test_blocked_dry_run_reports_and_targets(tmp_path):
    env = FakeEnv(blocked={"small_mma"}, free_bytes=30e9)        # too little for the 54 GB BF16 graph
    cfg = Config(shapes="bonsai27b", ms=(1, 16, 2048), step_ms=(1, 16), pairs=7, warmup=1)
    res = bench.run(cfg, env, jsonl=tmp_path / "r.jsonl")
    assert "shape:gate_up:m16" in res["blocked"] and "step:m16" in res["blocked"]
    tg = {t["target"]: t for t in res["targets"]}
    t16 = tg["decode step M=16: tuned at >= 70% of the bandwidth floor"]
    assert t16["met"] is False and t16["gap"].startswith("BLOCKED: gate_up (small_mma)")
    t1 = tg["decode step M=1: tuned at >= 85% of the bandwidth floor"]
    assert t1["met"] is not None and "floor" in t1["got"]
    step1 = next(r for r in res["rows"] if r["key"] == "step:m1")
    assert step1["sides"]["bf16"]["method"] == "sum" and "sum of per-shape" in step1["sides"]["bf16"]["note"]
    assert step1["ratios"]["b_over_bf16"]["median"] > 1
    md, png = bench_report.write(res, tmp_path / "rep.md")
    text = md.read_text()
    assert "## Blocked" in text and "small_mma" in text and "## Targets (H200)" in text
    assert png is not None and png.stat().st_size > 10_000
    assert bench_report.console_tables(res)


def test_slower_tuned_path_is_listed():
    row = {"kind": "shape", "status": "timed", "shape": "out", "m": 1,
           "sides": {"a": {"path": "int_gemv"}, "b": {"path": "single"}},
           "ratios": {"b_over_a": {"median": 0.9, "min": 0.85, "max": 0.95, "n": 7}}}
    got = bench.slower_than_legacy([row], Config())
    assert got[0]["slower"] and got[0]["verdict"] == "slower than legacy: remove from tuned selection"
    flipped = {**row, "sides": {"a": row["sides"]["b"], "b": row["sides"]["a"]},
               "ratios": {"b_over_a": {"median": 1 / 0.9, "min": 1 / 0.95, "max": 1 / 0.85, "n": 7}}}
    got = bench.slower_than_legacy([flipped], Config(a="tuned", b="legacy"))
    assert got[0]["tuned"] == "single" and got[0]["speedup"]["median"] == pytest.approx(0.9)


def test_cli_dry_run_writes_everything(tmp_path, capsys):
    from pq2verify import cli
    j, md, page = tmp_path / "b.json", tmp_path / "b.md", tmp_path / "b.html"
    rc = cli.main(["--device", DEVICE, "bench", "--dry-run", "--quick", "--shapes", "gate_up,out,in_proj_ba",
                   "--json", str(j), "--report", str(md), "--html", str(page)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "decode step M=1" in out and "targets (H200)" in out
    res = json.loads(j.read_text())
    assert {r["key"] for r in res["rows"]} >= {"bandwidth", "shape:gate_up:m1", "step:m1", "step:m16"}
    assert (res["config"]["pairs"], res["config"]["budget_s"], res["config"]["ms"]) == (7, 180.0, [1, 16, 2048])
    assert (tmp_path / "b.jsonl").exists() and md.with_suffix(".png").exists()
    html = page.read_text()    # the report's tables as tables, the plot inline
    assert html.startswith("<!doctype html>") and "<table>" in html and "data:image/png;base64," in html
    rc = cli.main(["--device", DEVICE, "bench", "--dry-run", "--quick", "--shapes", "gate_up,out,in_proj_ba",
                   "--json", str(j), "--resume"])
    assert rc == 0 and "resumed from the JSON lines file" in capsys.readouterr().out


def test_read_probe_reads_every_element(device):
    buf = torch.ones(100_003, dtype=torch.int32, device="cuda" if device == "cuda" else "cpu")
    thunk, part = bench.read_probe(buf, block=1024, iters=4)
    thunk()
    assert int(part.sum()) == 100_003


def test_path_is_proven_by_the_trace(device):
    dev = "cuda" if device == "cuda" else "cpu"
    case = bench.bench_case("native", Shape("t", 32, 128), 1, Config())
    inp = checks.Inputs(case, dev)
    assert bench.traced_path("legacy", inp) == "int_gemv"
    assert bench.traced_path("tuned", inp) == "single"


# --- the benchmarks: gate, then time (GPU); on the CPU the gate runs and timing skips ------
def _bench_params():
    if DEVICE == "cuda":
        shapes = bench.select_shapes("bonsai27b", "bonsai27b")
        ms = [int(v) for v in os.environ.get("PQ2_BENCH_M", "1,16,2048").split(",")]
    else:   # the interpreter: one small shape, one decode M and one prefill M
        shapes, ms = [SMALL, Shape("ba", 96, 384, True)], [1, 17]
    for s in shapes:
        for m in ms:
            for kset in ("legacy", "tuned") + (() if s.dense else ("bf16",)):
                yield pytest.param(s, m, kset, id=f"{s.name}-m{m}-{kset}")


@pytest.fixture(scope="module")
def env():
    return bench.RealEnv(DEVICE)


def _record(benchmark, **kv):
    benchmark.extra_info.update({k: v for k, v in kv.items() if v is not None})


@pytest.mark.bench
@pytest.mark.parametrize("shape,m,kset", list(_bench_params()))
def test_bench(shape, m, kset, env, benchmark):
    """Gate on the inputs about to be timed (a failure fails the test: no timing), then time a
    CUDA graph of one call per rotating weight copy. extra_info: path, gate, clocks, µs per call."""
    cfg = Config(pairs=7)
    case0 = bench.bench_case("cublas" if shape.dense else "native", shape, m, cfg)
    inp = env.inputs(case0)
    binp = None
    if kset == "bf16":
        binp = env.baseline(inp)
        path, g = "cublas", env.baseline_gate(replace(case0, path="cublas", layout="dense"), binp)
    else:
        path, g = env.side(kset, case0, inp)
    benchmark.group = f"{shape.name} {shape.n}x{shape.k} M={m}"
    _record(benchmark, kset=kset, path=path, gate=g.status, reason=g.reason or None, case=case0.id,
            checks={k: v for k, v in g.detail.items() if isinstance(v, (int, float, str, bool))})
    if not g.ok:
        pytest.fail(f"BLOCKED {case0.id} ({kset} -> {path}): {g.reason}")
    if not env.can_time:
        pytest.skip(f"{env.why_not}; gate {g.status} for {path}")
    c = bench.contestant_for(kset, path, shape, m, cfg, inp, binp)
    env.release()
    timer = env.timer(c)
    try:
        with env.sampler() as smp:
            smp.mark("t")
            benchmark.pedantic(timer.replay_sync, rounds=15, warmup_rounds=3, iterations=1)
            t = bench.spread([timer.sample(3, during=smp.poll) for _ in range(7)])
            smp.mark(None)
    finally:
        timer.close()
        env.release()
    _record(benchmark, calls_per_round=len(c.calls), weight_bytes=c.nbytes, us_per_call=t,
            gbps=c.nbytes / t["median"] / 1e3, tops=c.flops / t["median"] / 1e6, clocks=smp.summary("t"))


@pytest.mark.bench
@pytest.mark.gpu
@pytest.mark.parametrize("m,kset", [(1, "legacy"), (1, "tuned"), (16, "legacy"), (16, "tuned")])
def test_bench_decode_step(m, kset, env, benchmark):
    """The 257 projections of one decode step as one graph (distinct weight copies, 6.8 GB),
    gated shape by shape first."""
    cfg = Config(pairs=7)
    parts, sides = bench.step_parts(env, cfg, m, {"t": kset}, baseline=False)
    side = sides["t"]
    benchmark.group = f"decode step M={m}"
    _record(benchmark, kset=kset, paths=side["paths"], gate=side["gate"], reason=side["reason"] or None)
    if side["gate"] != "PASS":
        pytest.fail(f"BLOCKED decode step M={m} ({kset}): {side['reason']}")
    env.release()
    c = bench.step_contestant("t", side["paths"], parts, m, bench.step_copies(parts))
    timer = env.timer(c)
    try:
        with env.sampler() as smp:
            smp.mark("t")
            benchmark.pedantic(timer.replay_sync, rounds=10, warmup_rounds=2, iterations=1)
            t = bench.spread([timer.sample(1, during=smp.poll) for _ in range(7)])
            smp.mark(None)
    finally:
        timer.close()
        env.release()
    _record(benchmark, weight_bytes=c.nbytes, ms_per_step=t["median"] / 1e3, us_per_step=t,
            gbps=c.nbytes / t["median"] / 1e3, clocks=smp.summary("t"))
