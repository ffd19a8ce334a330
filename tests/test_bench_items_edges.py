"""Edges of the bench's items (bench/items.py) and contestants (bench/contestants.py), on the CPU.

The dry run's timer (envs.FakeTimer) with noise 0 gives each call exactly
nbytes / (FAKE_BW * FAKE_EFF[path]) s + 2 µs, so the numbers a row reports can be worked out
here from the shape alone: packed PQ2 is n * (k / 128) * 34 bytes, dense BF16 n * k * 2.
"""
import math

import pytest
import torch

from kernels.format import PQ2Weight
from pq2verify import bench
from pq2verify.bench import Config, FakeEnv, Item, Shape
from pq2verify.bench import contestants as C
from pq2verify.bench import items as I
from pq2verify.bench.envs import FAKE_BW, FAKE_EFF

REPRO = "pytest -p no:randomly -q tests/test_bench_items_edges.py -k "
OUT = Shape("out", 5120, 6144)          # bonsai27b's out projection (PQ2)


def _us(nbytes, path):
    """The fake timer's µs for one call that reads nbytes (M <= 16: bandwidth only)."""
    return nbytes / (FAKE_BW * FAKE_EFF.get(path, 0.5)) * 1e6 + 2.0


def _pq2_bytes(n, k):
    return n * (k // 128) * 34


# --- timing notes ------------------------------------------------------------------------------
def test_timing_notes_carry_the_bracket_drift_and_its_control():
    row = {}
    I._timing_notes(row, {"bracket": {"label": "a", "first": [10.0, 10.0, 10.0], "last": [12.0, 12.0, 12.0]},
                          "rounds": 9, "stopped": "ci", "throttled": [3, 4]})
    tm = row["timing"]
    # 12 / 10: the control got 20% slower between the brackets
    assert tm["drift"]["ratio"] == pytest.approx(1.2) and tm["control"] == "a", REPRO + "bracket"
    assert (tm["rounds"], tm["stopped"], tm["throttled"], tm["dropped"]) == (9, "ci", 2, False)
    row = {}
    I._timing_notes(row, {})            # nothing timed: no bracket, no drift, nothing failed
    assert row["timing"]["drift"] is None and row["timing"]["control"] is None and "check_failures" not in row


# --- a shape row -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def out_row():
    cfg = Config(pairs=7, warmup=1)
    return cfg, bench.run_shape(FakeEnv(noise=0), cfg, Item("shape", 4, OUT), bw=4000.0)


def test_a_shape_rows_sides_are_a_then_b_with_their_fake_times(out_row):
    cfg, row = out_row
    sides = row["sides"]
    assert (sides["a"]["kset"], sides["b"]["kset"], sides["bf16"]["path"]) == ("legacy", "tuned", "cublas"), \
        REPRO + "sides_are"
    nb = {"a": _pq2_bytes(OUT.n, OUT.k), "b": _pq2_bytes(OUT.n, OUT.k), "bf16": OUT.n * OUT.k * 2}
    want = {s: _us(nb[s], sides[s]["path"]) for s in nb}
    for s in nb:
        v = sides[s]
        assert v["time"]["median"] == pytest.approx(want[s], rel=1e-9), s        # µs, not ms
        assert v["bytes"] == nb[s]
        assert v["calls"] == math.ceil(1e9 / nb[s])                             # 1 GB of copies
        assert v["gbps"] == pytest.approx(nb[s] / want[s] / 1e3, rel=1e-9)
        assert v["pct_bw"] == pytest.approx(nb[s] / want[s] / 1e3 / 4000.0, rel=1e-9)
        assert v["tops"] == pytest.approx(2 * 4 * OUT.n * OUT.k / want[s] / 1e6, rel=1e-9)
    # speedups: t_x / t_y per round
    assert row["ratios"]["b_over_a"]["median"] == pytest.approx(want["a"] / want["b"], rel=1e-9)
    assert row["ratios"]["b_over_bf16"]["median"] == pytest.approx(want["bf16"] / want["b"], rel=1e-9)
    assert row["ratios"]["a_over_bf16"]["median"] == pytest.approx(want["bf16"] / want["a"], rel=1e-9)


def test_a_shape_rows_fit_points_read_a_fraction_of_the_rows(out_row):
    """N/4 and N/2 read a quarter and a half of the bytes: the fit's slope is the full row's
    bandwidth only if the fractions were really sliced."""
    _, row = out_row
    for s in ("a", "b", "bf16"):
        f = row["sides"][s]["fit"]
        assert f["rows"] == [OUT.n // 4, OUT.n // 2, OUT.n], REPRO + "fit_points"
        assert f["gbps"] == pytest.approx(FAKE_BW * FAKE_EFF.get(row["sides"][s]["path"], 0.5) / 1e9, rel=1e-6)


# --- the A/A row -------------------------------------------------------------------------------
def test_the_aa_row_times_the_control_twice_and_a_blocked_control_not_at_all():
    cfg = Config(pairs=7, warmup=1)
    env = FakeEnv(noise=0)
    row = bench.run_aa(env, cfg, Item("aa", 4, OUT), bw=4000.0)
    a, a2 = row["sides"]["a"], row["sides"]["a2"]
    want = _us(_pq2_bytes(OUT.n, OUT.k), a["path"])
    assert row["status"] == "timed" and a["path"] == a2["path"] and a["kset"] == "legacy", REPRO + "aa_row"
    assert a["time"]["median"] == pytest.approx(want, rel=1e-9) and a2["time"]["median"] == pytest.approx(want, rel=1e-9)
    assert row["ratios"]["a2_over_a"]["median"] == pytest.approx(1.0)
    env = FakeEnv(noise=0, blocked={a["path"]})
    row = bench.run_aa(env, cfg, Item("aa", 4, OUT), bw=4000.0)
    assert row["status"] == "blocked" and env.built == [] and row["ratios"] == {}, REPRO + "aa_row"


# --- the summed BF16 step ----------------------------------------------------------------------
def _shape_rows(m, us_per_shape, dense_side="a"):
    """Shape rows at M = m: each PQ2 shape's bf16 side and each dense shape's cuBLAS side timed."""
    rows = {}
    for nm, us in us_per_shape.items():
        if nm in bench.STEP_DENSE:
            sides = {dense_side: {"path": "cublas", "time": {"median": us}}, "b": {"path": "cublas"}}
        else:
            sides = {"a": {"path": "native", "time": {"median": 999.0}}, "bf16": {"path": "cublas",
                                                                                  "time": {"median": us}}}
        rows[f"shape:{nm}:m{m}"] = {"sides": sides}
    return rows


def test_the_summed_bf16_step_is_each_shapes_cublas_time_times_its_calls():
    us = {"gate_up": 10.0, "down": 9.0, "in_proj": 8.0, "qkv": 3.0, "out": 4.0, "lm_head": 50.0, "in_proj_ba": 1.0}
    # 64*10 + 64*9 + 48*8 + 16*3 + 64*4 + 1*50 + 48*1 = 2002 µs
    want_ms = 2.002
    row = {"sides": {"bf16": {}, "a": {"time": {"median": 2.0, "min": 1.0, "max": 4.0, "n": 7}},
                     "b": {"time": {"median": 1.0, "min": 0.5, "max": 2.0, "n": 7}}}, "ratios": {}}
    I._summed_bf16(row, _shape_rows(4, us), 4)
    assert row["sides"]["bf16"]["time"]["median"] == pytest.approx(want_ms), REPRO + "summed_bf16"
    r = row["ratios"]["a_over_bf16"]
    # the fastest ratio comes from A's slowest round and the other way round
    assert (r["median"], r["min"], r["max"]) == pytest.approx((want_ms / 2.0, want_ms / 4.0, want_ms / 1.0))
    assert row["ratios"]["b_over_bf16"]["median"] == pytest.approx(want_ms / 1.0)
    # a missing BF16 row: the step is not summed and the shape is named
    rows = _shape_rows(4, us)
    del rows["shape:qkv:m4"]["sides"]["bf16"]
    row = {"sides": {"bf16": {}, "a": {}, "b": {}}, "ratios": {}}
    I._summed_bf16(row, rows, 4)
    assert "time" not in row["sides"]["bf16"] and "qkv" in row["sides"]["bf16"]["note"], REPRO + "summed_bf16"


# --- the launch row ----------------------------------------------------------------------------
def test_a_launch_rows_blocked_path_is_not_run():
    cfg = Config(pairs=7, warmup=1)
    env = FakeEnv(noise=0)
    path, _ = env.side("legacy", bench.bench_case("native", OUT, 4, cfg), env.inputs(bench.bench_case("native", OUT, 4, cfg)))
    row = I.run_launch(FakeEnv(noise=0, blocked={path}), cfg, Item("launch", 4, OUT), {})
    bad = [e for e in row["entries"] if e["path"] == path]
    assert len(bad) == 1 and bad[0]["host"] is None and "gate BLOCKED" in bad[0]["error"], REPRO + "launch_blocked"
    assert row["status"] == "instrument failed"


class _FailingBuild(FakeEnv):
    """The dry run, but the graph of each label in `fail` cannot be built."""

    def __init__(self, fail, **kw):
        super().__init__(noise=0, **kw)
        self.fail = set(fail)

    def timer(self, c):
        if c.label in self.fail:
            raise RuntimeError("no graph")
        return super().timer(c)


def test_a_failed_side_is_an_error_and_a_failed_fit_point_only_a_note():
    cfg = Config(pairs=7, warmup=1)
    row = bench.run_shape(_FailingBuild({"b/2"}), cfg, Item("shape", 4, OUT), bw=4000.0)
    assert row["status"] == "timed", REPRO + "failed_side"
    assert "N/2" in row["sides"]["b"]["fit_error"] and row["sides"]["b"]["fit"]["rows"] == [OUT.n // 4, OUT.n]
    row = bench.run_shape(_FailingBuild({"b"}), cfg, Item("shape", 4, OUT), bw=4000.0)
    assert row["status"] == "error" and "no graph" in row["sides"]["b"]["error"], REPRO + "failed_side"
    assert "b_over_a" not in row["ratios"] and "a_over_bf16" in row["ratios"]


# --- contestants -------------------------------------------------------------------------------
def _raw_weight(n, k, seed=0, scale=None):
    """A raw PQ2 weight of random codes 0..2 and random (or given) fp16 scales."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 3, (n, k // 128, 128), generator=g, dtype=torch.uint8)
    code_bytes = (codes[..., 0::4] | codes[..., 1::4] << 2 | codes[..., 2::4] << 4 | codes[..., 3::4] << 6)
    s = (torch.rand(n, k // 128, generator=g) + 0.5 if scale is None else torch.full((n, k // 128), scale))
    s = s.to(torch.float16).view(torch.uint8).view(n, k // 128, 2)
    return PQ2Weight(torch.cat([s, code_bytes], dim=2).reshape(n, -1).contiguous(), n, k, "raw")


@pytest.mark.parametrize("layout", ["raw", "prepared"])
def test_a_row_slice_is_a_copy_of_the_first_rows(layout):
    w = _raw_weight(5, 256, seed=1)
    w = w if layout == "raw" else w.to_prepared()
    s = C.row_slice(w, 3)
    assert (s.n, s.k, s.layout) == (3, 256, layout), REPRO + "row_slice"
    assert torch.equal(s.codes_matrix(), w.codes_matrix()[:3])
    assert torch.equal(s.scales_matrix().view(torch.int16), w.scales_matrix()[:3].view(torch.int16))
    assert s.data.data_ptr() != w.data.data_ptr()
    d = torch.arange(12.0).view(4, 3)
    assert torch.equal(C.row_slice(d, 2), d[:2]) and C.row_slice(d, 2).data_ptr() != d.data_ptr()


@pytest.mark.parametrize("layout", ["raw", "prepared"])
def test_a_scaled_clone_multiplies_the_scales_by_exactly_two_to_the_e(layout):
    w = _raw_weight(2, 256, seed=2, scale=0.75)
    w = w if layout == "raw" else w.to_prepared()
    before = w.data.clone()
    c = C.scaled_clone(w, 3)
    assert bool((c.scales_matrix() == 6.0).all()), REPRO + "scaled_clone"        # 0.75 * 8
    assert torch.equal(c.codes_matrix(), w.codes_matrix()) and torch.equal(w.data, before)
    assert c.data.data_ptr() != w.data.data_ptr()
    assert torch.equal(C.scaled_clone(w, 0).data, before) and C.scaled_clone(w, 0).data.data_ptr() != w.data.data_ptr()
    d = torch.full((2, 2), 3.0)
    assert bool((C.scaled_clone(d, -1) == 1.5).all()) and bool((d == 3.0).all())


@pytest.mark.parametrize("scale, e, ok", [
    (2.0 ** -13, -1, True),            # lands on fp16's smallest normal, 2^-14: still exact
    (2.0 ** -13, -2, False),           # 2^-15 is subnormal
    (0.0, -20, True),                  # a zero scale stays zero
    (32752.0, 1, True),                # 65504, fp16's largest finite
    (65504.0, 1, False),               # overflows to inf
    (1.0, 16, False),                  # 65536 overflows to inf
])
def test_a_scaled_clone_refuses_to_leave_fp16s_normal_range(scale, e, ok):
    w = _raw_weight(1, 128, seed=3, scale=scale)
    if ok:
        assert float(C.scaled_clone(w, e).scales_matrix()[0, 0]) == scale * 2.0 ** e, REPRO + "normal_range"
    else:
        with pytest.raises(ValueError, match="normal range"):
            C.scaled_clone(w, e)


def test_weight_bytes_are_words_when_they_divide_and_bytes_when_not():
    w = torch.arange(4, dtype=torch.bfloat16)            # 8 bytes: two int32 words
    b = C.weight_bytes(w)
    assert (b.dtype, b.numel()) == (torch.int32, 2), REPRO + "weight_bytes"
    b = C.weight_bytes(torch.arange(3, dtype=torch.bfloat16))     # 6 bytes
    assert (b.dtype, b.numel()) == (torch.uint8, 6)
    p = _raw_weight(1, 128)                               # 34 bytes
    assert (C.weight_bytes(p).dtype, C.weight_bytes(p).numel()) == (torch.uint8, 34)
    p = _raw_weight(2, 128)                               # 68 bytes: 17 words
    assert (C.weight_bytes(p).dtype, C.weight_bytes(p).numel()) == (torch.int32, 17)


def test_a_rotation_starts_with_the_gated_weight_then_distinct_copies():
    w = _raw_weight(2, 128, seed=4)
    r = C.rotation(w, 3)
    assert len(r) == 3 and r[0] is w, REPRO + "rotation"
    ptrs = {x.data.data_ptr() for x in r}
    assert len(ptrs) == 3 and all(torch.equal(x.data, w.data) for x in r)
    assert len(C.rotation(w, 1)) == 1 and C.rotation(w, 1)[0] is w


def test_a_contestants_bytes_and_flops_are_per_time_unit():
    calls = [C.Call("p", 8, 16, 2, 100)] * 4
    c = C.Contestant("x", calls, None, 4)         # a shape row: 4 calls, times per call
    assert (c.nbytes, c.flops) == (100, 2 * 2 * 8 * 16), REPRO + "per_unit"
    c = C.Contestant("x", calls, None, 1)         # a step: times per replay
    assert (c.nbytes, c.flops) == (400, 4 * 2 * 2 * 8 * 16)


def test_a_one_row_fraction_is_still_a_fit_point():
    """N = 4: N/4 is a single row, which is still a weight to time (zero rows would not be)."""
    tiny = Shape("tiny", 4, 256)
    row = bench.run_shape(FakeEnv(noise=0), Config(pairs=7, warmup=1), Item("shape", 1, tiny), bw=4000.0)
    assert row["sides"]["b"]["fit"]["rows"] == [1, 2, 4], REPRO + "one_row"


def _decoded(w):
    """w's matrix by hand from its raw bytes: (code - 1) * the block's fp16 scale, in float64."""
    blocks = w.data.view(w.n, w.k // 128, 34)
    s = blocks[:, :, :2].contiguous().view(torch.float16).double()          # [n, g, 1]
    cb = blocks[:, :, 2:].long()
    codes = torch.stack([(cb >> (2 * t)) & 3 for t in range(4)], dim=-1).reshape(w.n, w.k // 128, 128)
    return ((codes - 1).double() * s).reshape(w.n, w.k)


class _Recorder:
    """A registry path whose kernel only records the weight it was handed (no kernel runs)."""

    def __init__(self):
        self.seen = []

    def kernel(self):
        def run(x, w, out=None):
            self.seen.append(w)
            return out
        return run


def test_a_path_contestant_probes_every_copy_bit_exact_against_an_independent_product(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(C.registry, "get", lambda name: rec)
    shape, m = Shape("s", 4, 256), 2
    w = _raw_weight(4, 256, seed=5)
    ws = C.rotation(w, 3)
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    c = C.path_contestant("b", "native", shape, m, Config(), x, lambda: ws, 3, gate_print=(1, 2, 3))
    assert [k.path for k in c.calls] == ["native"] * 3 and c.per == 3, REPRO + "path_contestant"
    t = c.build()
    p = t.probe
    assert len(t) == 3 and p.tol == 0.0 and p.gate_print == (1, 2, 3), REPRO + "path_contestant"   # bit-equal
    assert p.x is x and p.reads[0] is x and [r.data_ptr() for r in p.reads[1:]] == [v.data.data_ptr() for v in ws]
    for f in t:
        f()
    assert [id(v) for v in rec.seen] == [id(v) for v in ws]      # one call per copy, in order
    rec.seen.clear()
    p.expect()
    assert len(rec.seen) == 1 and rec.seen[0] is w              # the eager rerun reads the gated weight
    # the reference is torch.mm on the decoded weight, not the path (bf16 rounding: 1e-2)
    want = x.double() @ _decoded(w).t()
    got = p.reference().double()
    assert float((got - want).norm() / want.norm()) < 1e-2 and len(rec.seen) == 1


def test_a_bf16_contestant_rotates_copies_of_the_decoded_weight_within_cublas_tolerance():
    shape, m = Shape("s", 4, 256), 2
    wd = torch.randn(4, 256, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    # 4 * 256 * 2 = 2048 bytes a copy: 5000 bytes of rotation need 3 copies
    c = C.bf16_contestant("bf16", shape, m, Config(), x, lambda: wd, 5000, gate_print=(4, 5, 6))
    assert len(c.calls) == 3 and c.per == 3 and c.calls[0].nbytes == 2048, REPRO + "bf16_contestant"
    t = c.build()
    p = t.probe
    assert len(t) == 3 and p.tol == 1e-3 and p.gate_print == (4, 5, 6)
    assert p.reads[0] is x and p.reads[1] is wd and len({r.data_ptr() for r in p.reads[1:]}) == 3
    assert torch.equal(p.reference(), torch.mm(x, wd.t()))
    # a weight as large as the rotation: one copy, the gated weight itself
    p = C.bf16_contestant("bf16", shape, m, Config(), x, lambda: wd, 2048).build().probe
    assert len(p.reads) == 2 and torch.equal(p.reference(), torch.mm(x, wd.t())), REPRO + "bf16_contestant"


class _Inp:
    def __init__(self, x, w):
        self.x, self.w = x, w


def test_contestant_for_gives_the_bf16_side_cublas_and_its_gate_print():
    shape, m = Shape("s", 4, 256), 2
    w = _raw_weight(4, 256, seed=9)
    x = torch.zeros(m, 256, dtype=torch.bfloat16)
    cfg = Config(rotate_gb=2048 * 2 / 1e9)          # two BF16 copies (2048 bytes each); 272 B of PQ2: 16
    c = C.contestant_for("bf16", "cublas", shape, m, cfg, _Inp(x, w), _Inp(x, torch.zeros(4, 256)), None, (7,))
    assert [k.path for k in c.calls] == ["cublas", "cublas"] and c.build().probe.gate_print == (7,), \
        REPRO + "contestant_for"
    copies, count = C.weight_copies(_Inp(x, w), shape, cfg)
    assert count == math.ceil(4096 / 272) == 16 and len(copies()) == 16 and copies()[0] is w
    c = C.contestant_for("a", "native", shape, m, cfg, _Inp(x, w))
    assert len(c.calls) == 16 and c.calls[0].nbytes == 272


# --- the decode step ---------------------------------------------------------------------------
def test_the_steps_floor_is_its_bytes_at_the_stream_read_bandwidth():
    shapes = bench.step_shapes()
    # 257 PQ2 calls (packed bytes) and 48 dense in_proj_ba calls (BF16 bytes), each read once
    total = sum(cnt * _pq2_bytes(shapes[nm].n, shapes[nm].k) for nm, cnt in bench.STEP_COUNTS.items()) \
        + sum(cnt * shapes[nm].n * shapes[nm].k * 2 for nm, cnt in bench.STEP_DENSE.items())
    floor_ms = total / 4000e9 * 1e3
    row = bench.run_step(FakeEnv(noise=0), Config(pairs=7, warmup=1, spin_us=0), Item("step", 4), 4000.0, {})
    assert row["weight_bytes"] == total and row["floor_ms"] == pytest.approx(floor_ms, rel=1e-12), REPRO + "floor"
    assert row["control"] is False and row["status"] == "timed"
    for s in ("a", "b"):
        v = row["sides"][s]
        assert v["pct_floor"] == pytest.approx(floor_ms / v["time"]["median"], rel=1e-12) and v["pct_floor"] < 1
    # the BF16 step fits in memory: timed as one graph of cuBLAS calls on the decoded weights
    bf = row["sides"]["bf16"]
    bf_ms = sum(cnt * _us(shapes[nm].n * shapes[nm].k * 2, "cublas")
                for nm, cnt in {**bench.STEP_COUNTS, **bench.STEP_DENSE}.items()) / 1e3
    assert bf["method"] == "graph" and bf["time"]["median"] == pytest.approx(bf_ms, rel=1e-9), REPRO + "floor"
    assert "pct_floor" not in bf and row["ratios"]["b_over_bf16"]["median"] > 1
    for lab, v in row["sol"].items():
        assert v["pct_floor"] == pytest.approx(floor_ms / v["time"]["median"], rel=1e-12), lab
        assert v["tops"] == 0, lab               # a speed-of-light read does no arithmetic


# --- the bandwidth row -------------------------------------------------------------------------
def test_the_stream_read_is_the_faster_read_probe():
    cfg = Config(pairs=7, warmup=1, bw_gb=2.0)
    row = I.run_bandwidth(FakeEnv(noise=0), cfg)
    nb = int(2.0 * 1e9)
    # the Triton read reaches 97% of FAKE_BW, torch.sum 90%: the faster one is the stream read
    want = nb / _us(nb, "probe:read") / 1e3
    assert row["stream_read_gbps"] == pytest.approx(want, rel=1e-9), REPRO + "stream_read"
    assert row["probes"]["read_sum"]["gbps"] == pytest.approx(nb / _us(nb, "probe:sum") / 1e3, rel=1e-9)


# --- the power proxy's summary -----------------------------------------------------------------
def _prow():
    return {"spins": 10, "sides": {"spin": {}, "a+spin": {}, "b+spin": {}}}


def test_the_power_summary_takes_the_spins_out_per_round():
    # µs per round: the spins alone 100, A with spins 1100 (matrix 1000), B with spins 600 (500)
    times = {"spin": [100.0] * 5, "a+spin": [1100.0] * 5, "b+spin": [600.0] * 5, "a": [1000.0] * 5,
             "b": [250.0] * 5}
    prow = _prow()
    I._power_summary(prow, times, 0.5)
    a, b = prow["sides"]["a+spin"], prow["sides"]["b+spin"]
    assert prow["sides"]["spin"]["us_per_spin"] == pytest.approx(10.0), REPRO + "power_summary"
    assert (a["matrix"]["median"], b["matrix"]["median"]) == pytest.approx((1.0, 0.5))          # ms
    assert (a["matrix_pct_floor"], b["matrix_pct_floor"]) == pytest.approx((0.5, 1.0))
    # plain A is 1000 µs: its matrix time is all of it; plain B is 250, its matrix time 500
    assert a["matrix_over_plain"]["median"] == pytest.approx(1.0) and b["matrix_over_plain"]["median"] == pytest.approx(2.0)
    assert prow["b_over_a"]["median"] == pytest.approx(2.0)
    prow = _prow()
    I._power_summary(prow, times, None)              # no bandwidth row: no floor
    assert prow["sides"]["a+spin"]["matrix_pct_floor"] is None, REPRO + "power_summary"
    prow = _prow()                                   # spins that are all the time: no matrix time to divide by
    I._power_summary(prow, {**times, "a+spin": [100.0] * 5}, 0.5)
    assert prow["sides"]["a+spin"]["matrix"]["median"] == 0.0 and prow["sides"]["a+spin"]["matrix_pct_floor"] is None


@pytest.mark.parametrize("kind", ["aa", "shape"])
def test_noisy_rows_extend_their_rounds_on_the_compared_ratio(kind):
    """30% noise never gives a 0.1% wide interval: the compared ratio keeps the rounds going to
    max_pairs (an uncompared row would stop at `pairs`, its reason None)."""
    cfg = Config(pairs=7, warmup=1, ci_width=0.001, max_pairs=11)
    fn = bench.run_aa if kind == "aa" else bench.run_shape
    row = fn(FakeEnv(noise=0.3, seed=5), cfg, Item(kind, 4, OUT), bw=4000.0)
    assert (row["timing"]["rounds"], row["timing"]["stopped"]) == (11, "max rounds"), REPRO + "extend"


def test_a_power_proxy_check_failing_after_timing_is_the_proxys_note_not_the_steps(monkeypatch):
    real = I.measure

    def measure(env, contestants, cfg, **kw):
        out = real(env, contestants, cfg, **kw)
        kw["info"]["after"] = {"a": {"fresh": {"ok": True}}, "a+spin": {"fresh": {"ok": False, "why": "stale"}}}
        return out
    monkeypatch.setattr(I, "measure", measure)
    row = bench.run_step(FakeEnv(noise=0), Config(pairs=7, warmup=1, spin_us=5.0), Item("step", 4), 4000.0, {})
    assert row["status"] == "timed" and "check_failures" not in row, REPRO + "proxy_check"
    assert row["power"]["check_failures"] == ["a+spin fresh: stale"] and set(row["after"]) == {"a"}


def test_a_failed_sol_read_is_noted_and_a_failed_step_side_is_an_error():
    cfg = Config(pairs=7, warmup=1, spin_us=0)
    row = bench.run_step(_FailingBuild({"sol"}), cfg, Item("step", 4), 4000.0, {})
    assert row["status"] == "timed" and "no graph" in row["sol"]["sol"]["error"], REPRO + "failed_sol"
    row = bench.run_step(_FailingBuild({"b"}), cfg, Item("step", 4), 4000.0, {})
    assert row["status"] == "error" and "no graph" in row["sides"]["b"]["error"], REPRO + "failed_sol"


def test_a_launch_entry_takes_the_gpu_time_of_its_own_path_in_the_shape_row():
    cfg = Config(pairs=7, warmup=1)
    env = FakeEnv(noise=0)
    case = bench.bench_case("native", OUT, 4, cfg)
    pa, pb = (env.side(ks, case, env.inputs(case))[0] for ks in ("legacy", "tuned"))
    assert pa != pb
    # B's shape row ran another path than the one resolved now: its time is not this path's
    rows = {"shape:out:m4": {"sides": {"a": {"path": pa, "time": {"median": 7.0}},
                                       "b": {"path": "other", "time": {"median": 3.0}}}}}
    row = I.run_launch(env, cfg, Item("launch", 4, OUT), rows)
    gpu = {e["path"]: e["gpu_us"] for e in row["entries"]}
    assert gpu == {pa: 7.0, pb: None} and row["status"] == "timed", REPRO + "launch_gpu"
    rows = {"shape:out:m4": {"sides": {"b": {"path": pb, "time": {"median": 3.0}}}}}     # A's side missing
    row = I.run_launch(env, cfg, Item("launch", 4, OUT), rows)
    assert {e["path"]: e["gpu_us"] for e in row["entries"]} == {pa: None, pb: 3.0}


def test_the_fit_fractions_time_the_first_rows_of_the_same_weight(monkeypatch):
    monkeypatch.setattr(C.registry, "get", lambda name: _Recorder())      # no kernel runs
    shape, m = Shape("s", 8, 256), 2
    w = _raw_weight(8, 256, seed=10)
    dense = torch.randn(8, 256, generator=torch.Generator().manual_seed(11)).to(torch.bfloat16)
    x = torch.zeros(m, 256, dtype=torch.bfloat16)
    sides = {"a": {"path": "native"}, "bf16": {"path": "cublas"}}
    # 1000 bytes of rotation: 8 copies of the 136-byte PQ2 quarter, one of the 1 KB BF16 one
    out = I._fractions(sides, ["a", "bf16"], shape, m, Config(rotate_gb=1e-6), _Inp(x, w), _Inp(x, dense))
    by = {c.label: c for c in out}
    assert sorted(by) == ["a/2", "a/4", "bf16/2", "bf16/4"], REPRO + "fractions"
    for d in (4, 2):
        rows = 8 // d
        pa = by[f"a/{d}"].build().probe
        # every copy holds the first rows' bytes (8 rows of 2 blocks of 34 bytes, raw layout)
        assert all(torch.equal(r.reshape(-1), w.data[:rows].reshape(-1)) for r in pa.reads[1:]), d
        assert pa.out.shape == (m, rows) and by[f"a/{d}"].calls[0].nbytes == rows * 2 * 34
        pb = by[f"bf16/{d}"].build().probe
        assert all(torch.equal(r, dense[:rows]) for r in pb.reads[1:]) and pb.out.shape == (m, rows), d
