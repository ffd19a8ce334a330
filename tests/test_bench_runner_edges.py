"""Edges of the bench's runner (results as they go, resume, budget) and its environments
(FakeEnv's model and gates, RealEnv's bookkeeping), on the dry run: no kernel runs here."""
import json
from dataclasses import replace

import pytest

from pq2verify import bench
from pq2verify.bench import Config, FakeEnv, envs, runner
from pq2verify.bench.contestants import Call, Contestant
from pq2verify.bench.gate import Gate, bench_case
from pq2verify.bench.plan import Shape

OUT = Config(shapes="out", ms=(1,), step_ms=(), pairs=7, warmup=1)
KEYS = ["bandwidth", "aa", "shape:out:m1", "aa:last"]        # OUT's plan, in order


def _lines(jl):
    return [json.loads(s) for s in jl.read_text().splitlines()]


# --- runner ------------------------------------------------------------------------------
def test_a_cut_line_before_finished_rows_keeps_them(tmp_path):
    # a crash can cut any line (a concurrent writer, a full disk): the rows after it still count
    jl = tmp_path / "r.jsonl"
    bench.run(OUT, FakeEnv(), jsonl=jl)
    lines = jl.read_text().splitlines(keepends=True)
    assert json.loads(lines[1])["key"] == "bandwidth"
    jl.write_text(lines[0] + lines[1][:-40] + "\n" + "".join(lines[2:]))
    r = bench.run(OUT, FakeEnv(), jsonl=jl, resume=True)
    assert r["resumed"] == ["aa", "shape:out:m1"]


def test_a_resumed_bandwidth_row_still_sets_the_stream_bandwidth(tmp_path):
    jl = tmp_path / "r.jsonl"
    bench.run(OUT, FakeEnv(), jsonl=jl)
    bw = _lines(jl)[1]["stream_read_gbps"]
    r = bench.run(OUT, FakeEnv(seed=5), jsonl=jl, resume=True)
    assert r["resumed"][0] == "bandwidth"
    assert r["stream_read_gbps"] == bw
    # the closing A/A ran again, so its % of bandwidth is against the file's bandwidth
    side = r["rows"][-1]["sides"]["a"]
    assert side["pct_bw"] == pytest.approx(side["gbps"] / bw)


def test_resume_on_a_missing_file_still_writes_the_header(tmp_path):
    jl = tmp_path / "new" / "deeper" / "r.jsonl"        # folders made as needed
    r = bench.run(OUT, FakeEnv(), jsonl=jl, resume=True)
    assert r["resumed"] == []
    kinds = [x["kind"] for x in _lines(jl)]
    assert kinds == ["header", "bandwidth", "aa", "shape", "aa"]


def test_resume_appends_and_keeps_the_first_runs_rows(tmp_path):
    jl = tmp_path / "r.jsonl"
    bench.run(OUT, FakeEnv(), jsonl=jl)
    first = jl.read_text()
    bench.run(OUT, FakeEnv(), jsonl=jl, resume=True)
    text = jl.read_text()
    assert text.startswith(first)
    # only the closing A/A is this run's own: one more line
    assert [x.get("key") for x in _lines(jl)] == [None, *KEYS, "aa:last"]


def test_the_closing_aa_is_never_taken_from_the_file(tmp_path):
    jl = tmp_path / "r.jsonl"
    bench.run(OUT, FakeEnv(), jsonl=jl)
    env = FakeEnv()
    r = bench.run(OUT, env, jsonl=jl, resume=True)
    assert "aa:last" not in r["resumed"]
    assert env.built.count("a") == 1 and env.built.count("a2") == 1      # only the closing A/A was timed


def test_progress_counts_every_item_once(tmp_path):
    seen = []
    bench.run(OUT, FakeEnv(), jsonl=tmp_path / "r.jsonl", progress=lambda i, n, row: seen.append((i, n, row["key"])))
    assert seen == [(1, 4, "bandwidth"), (2, 4, "aa"), (3, 4, "shape:out:m1"), (4, 4, "aa:last")]


def test_extended_rounds_stop_when_the_budget_is_spent(tmp_path):
    # noisy timings and a 0.1% interval never narrow: only the budget stops the extra rounds
    now = [0]

    def tick(i, n, row):
        now[0] += 10
    cfg = replace(OUT, budget_s=5, ci_width=0.001, max_pairs=25)
    r = bench.run(cfg, FakeEnv(noise=0.3), jsonl=tmp_path / "r.jsonl", clock=lambda: now[0], progress=tick)
    assert [x["key"] for x in r["rows"]] == ["bandwidth", "aa:last"]
    assert r["not_run"] == ["aa", "shape:out:m1"]
    assert r["rows"][-1]["timing"]["stopped"] == "budget" and r["rows"][-1]["timing"]["rounds"] == 7


class _Broken(FakeEnv):
    """A side that raises for one kset: the item is an error row."""

    def side(self, kset, case0, inp):
        if kset == "tuned":
            raise RuntimeError("broken side (fake)")
        return super().side(kset, case0, inp)


def test_an_error_row_is_not_written_and_a_resume_retries_it(tmp_path):
    jl = tmp_path / "r.jsonl"
    cfg = replace(OUT, a="legacy", b="tuned")
    r = bench.run(cfg, _Broken(), jsonl=jl)
    err = [x for x in r["rows"] if x["status"] == "error"]
    assert [x["key"] for x in err] == ["shape:out:m1"]
    assert err[0]["shape"] == "out" and err[0]["m"] == 1 and err[0]["kind"] == "shape"
    assert err[0]["error"] == "RuntimeError: broken side (fake)"
    # the last two frames: where it raised (side) and its caller
    assert err[0]["traceback"].count('File "') == 2 and "in side" in err[0]["traceback"]
    assert "shape:out:m1" not in [x.get("key") for x in _lines(jl)]
    r2 = bench.run(cfg, FakeEnv(), jsonl=jl, resume=True)
    assert r2["resumed"] == ["bandwidth", "aa"]
    assert r2["rows"][2]["key"] == "shape:out:m1" and r2["rows"][2]["status"] != "error"


def test_load_jsonl_skips_blank_and_keyless_lines(tmp_path):
    jl = tmp_path / "r.jsonl"
    sig = {"env": "x"}
    jl.write_text(json.dumps({"kind": "header", "config": sig}) + "\n\n"
                  + json.dumps({"kind": "note"}) + "\n" + json.dumps({"key": "a", "v": 1}) + "\n")
    assert runner.load_jsonl(jl, sig) == {"a": {"key": "a", "v": 1}}
    assert runner.load_jsonl(tmp_path / "none.jsonl", sig) == {}


# --- envs ----------------------------------------------------------------------------------
def test_fake_us_by_hand():
    bw = envs.FAKE_BW
    # M=1: the weight read at the path's fraction of the bandwidth, plus 2 µs of launch
    assert envs.fake_us(Call("single", 100, 200, 1, 8_700_000)) == pytest.approx(8_700_000 / (bw * 0.87) * 1e6 + 2)
    # a path not in the table reads at half the bandwidth
    assert envs.fake_us(Call("nope", 100, 200, 1, 1_000_000)) == pytest.approx(1_000_000 / (bw * 0.5) * 1e6 + 2)
    # M=16 is still bandwidth-bound, even when its flops at mmq's rate would take longer
    flops16 = 2 * 16 * 4096 * 4096
    t16 = envs.fake_us(Call("mmq", 4096, 4096, 16, 1000))
    assert t16 == pytest.approx(1000 / (bw * 0.5) * 1e6 + 2)
    # M=17: the flops at mmq's 0.75e15 op/s take longer than the read
    flops17 = 2 * 17 * 4096 * 4096
    assert flops16 / 0.75e15 > 1000 / (bw * 0.5)
    assert envs.fake_us(Call("mmq", 4096, 4096, 17, 1000)) == pytest.approx(flops17 / 0.75e15 * 1e6 + 2)
    # ... and the read when it is the longer of the two
    big = 10**12
    assert envs.fake_us(Call("mmq", 4096, 4096, 17, big)) == pytest.approx(big / (bw * 0.5) * 1e6 + 2)
    # a power-proxy spin: its nominal µs plus the launch
    assert envs.fake_us(Call("spin", 0, 0, 1, 0, us=7.5)) == 9.5


def test_fake_timer_is_per_unit_and_within_its_noise():
    calls = [Call("single", 100, 200, 1, 8_700_000)] * 4
    one = 8_700_000 / (envs.FAKE_BW * 0.87) * 1e6 + 2
    t = envs.FakeTimer(Contestant("x", calls, None, per=4), seed=1, noise=0.1)
    xs = [t.sample(1) for _ in range(200)]
    assert all(one * 0.9 <= x <= one * 1.1 for x in xs)
    assert min(xs) < one < max(xs)          # noise both ways around the model
    assert envs.FakeTimer(Contestant("x", calls, None, per=4), seed=1, noise=0).sample(1) == pytest.approx(one)
    hit = []
    t.sample(1, during=lambda: hit.append(1))
    assert hit == [1]


def test_each_timer_built_gets_its_own_noise():
    env = FakeEnv(noise=0.1)
    c = Contestant("a", [Call("single", 100, 200, 1, 10**6)], None, per=1)
    t1, t2 = env.timer(c), env.timer(c)
    assert env.built == ["a", "a"]
    assert [t1.sample(1) for _ in range(3)] != [t2.sample(1) for _ in range(3)]


def _case(path="int_gemv", m=1):
    return bench_case(path, Shape("out", 5120, 6144), m, OUT)


def test_fake_gates_block_only_the_listed_paths():
    env = FakeEnv(blocked={"int_gemv", "cublas"})
    case = _case()
    inp = env.inputs(case)
    assert tuple(inp.x.shape) == (1, 6144) and inp.w.layout == "prepared"
    path, g = env.side("legacy", case, inp)
    assert path == "int_gemv" and not g.ok and "fake" in g.reason
    assert g.detail["case"] == replace(case, path="int_gemv").id
    assert not env.baseline_gate(case, inp).ok
    assert env.first_calls["int_gemv"]["kset"] == "legacy" and env.first_calls["int_gemv"]["ms"] == envs.FAKE_FIRST_MS
    ok = FakeEnv()
    assert ok.side("legacy", case, inp)[1].ok and ok.baseline_gate(case, inp).ok


def test_fake_inputs_have_the_case_rows():
    c = bench_case("mmq", Shape("out", 5120, 6144), 64, OUT)
    assert tuple(FakeEnv().inputs(c).x.shape) == (64, 6144)


def test_the_first_fake_call_of_a_path_is_kept():
    env = FakeEnv()
    c1, c2 = _case(), replace(_case(), seed=_case().seed + 1)
    env.side("legacy", c1, env.inputs(c1))
    env.side("legacy", c2, env.inputs(c2))
    assert env.first_calls["int_gemv"]["case"] == c1.id != c2.id


def test_fake_host_cost_is_per_path():
    # the fake clock advances by the path's table entry per call (default 50 µs)
    env = FakeEnv()
    assert env.host_cost("cublas", None)["median_us"] == pytest.approx(12.0)
    assert env.host_cost("mmq", None)["median_us"] == pytest.approx(108.0)
    assert env.host_cost("no_such_path", None)["median_us"] == pytest.approx(50.0)


def test_fake_free_bytes_and_make_env():
    assert FakeEnv(free_bytes=30e9).free_bytes() == 30_000_000_000
    assert isinstance(envs.make_env("dry-run"), FakeEnv)
    r = envs.make_env("cpu")
    assert isinstance(r, envs.RealEnv) and r.device == "cpu" and r.kind == "interpreter"
    assert not r.can_time and r.default_shapes == "small" and r.free_bytes() == 0 and r.runs_kernels
    assert envs.make_env("cuda").device == "cuda"        # made, not used: nothing touches a GPU


def test_real_gates_are_cached_apart_for_the_baseline(monkeypatch):
    made = []

    def fake_gate(case, inp, device, *, reruns, repro, record_output):
        made.append((case.id, reruns, repro, record_output))
        return Gate(case.path, True, "", {"n": len(made)})
    monkeypatch.setattr(envs, "gate", fake_gate)
    env = envs.RealEnv("cpu")
    env.reruns = 3
    case = _case()
    g1 = env.gate(case, None)
    assert env.gate(case, None) is g1                      # the same case: cached
    b = env.baseline_gate(case, None)
    assert b is not g1 and b.detail["n"] == 2
    assert made == [(case.id, 3, True, False), (case.id, 3, False, False)]
    # where it times, the path's gate keeps its output for the check after timing; the baseline's not
    made.clear()
    cuda = envs.RealEnv("cuda")          # only made: the gate is faked, nothing touches a GPU
    cuda.gate(case, None)
    cuda.baseline_gate(case, None)
    assert made == [(case.id, 2, True, True), (case.id, 2, False, False)]


def test_a_raising_real_side_is_a_failed_gate_on_the_resolved_path(monkeypatch):
    def boom(kset, inp):
        raise RuntimeError("no trace (fake)")
    monkeypatch.setattr(envs, "traced_path", boom)
    env = envs.RealEnv("cpu")
    case = _case()
    path, g = env.side("legacy", case, envs.FakeInputs(case))
    assert path == "int_gemv" and not g.ok
    assert g.reason == "pq2_matmul(kernels='legacy') raised RuntimeError: no trace (fake)"


def test_a_real_side_gates_the_path_it_traced(monkeypatch):
    seen = []
    monkeypatch.setattr(envs, "traced_path", lambda kset, inp: "mmq")
    monkeypatch.setattr(envs, "gate", lambda case, inp, device, **kw: seen.append(case.path) or Gate(case.path, True, ""))
    env = envs.RealEnv("cpu")
    path, g = env.side("tuned", _case(), None)
    assert path == "mmq" and seen == ["mmq"] and g.path == "mmq"


def test_the_run_hands_its_reruns_to_the_env(tmp_path):
    env = FakeEnv()
    bench.run(replace(OUT, reruns=5), env, jsonl=tmp_path / "r.jsonl")
    assert env.reruns == 5


def test_no_ms_means_the_env_default(tmp_path):
    cfg = replace(OUT, ms=None)
    runner.prepare(cfg, FakeEnv())
    assert cfg.ms == (1, 2, 4, 8, 16, 128, 2048)          # plan.DEFAULT_MS, written out
    cfg = replace(OUT, ms=None, shapes="b")
    runner.prepare(cfg, envs.RealEnv("cpu"))
    assert cfg.ms == (1, 2, 17)                             # plan.INTERP_MS: the interpreter's few Ms


def test_without_resume_a_rerun_starts_the_file_afresh(tmp_path):
    jl = tmp_path / "r.jsonl"
    bench.run(OUT, FakeEnv(), jsonl=jl)
    r = bench.run(OUT, FakeEnv(), jsonl=jl)
    assert r["resumed"] == []
    assert [x.get("key") for x in _lines(jl)] == [None, *KEYS]


class _NoTiming(FakeEnv):
    can_time = False
    why_not = "no timer here (fake)"


def test_the_no_timing_note_only_where_timing_is_off(tmp_path):
    r = bench.run(OUT, _NoTiming(), jsonl=tmp_path / "a.jsonl")
    assert r["note"] == "no timer here (fake); no decode step without a GPU"
    assert "note" not in bench.run(OUT, FakeEnv(), jsonl=tmp_path / "b.jsonl")


def test_a_budget_spent_exactly_still_starts_the_next_item(tmp_path):
    # "after this many seconds": at exactly 20 s of a 20 s budget the next item still starts
    now = [0]

    def tick(i, n, row):
        now[0] += 10
    cfg = replace(OUT, budget_s=20)
    r = bench.run(cfg, FakeEnv(), jsonl=tmp_path / "r.jsonl", clock=lambda: now[0], progress=tick)
    assert [x["key"] for x in r["rows"]] == KEYS and r["not_run"] == []
    r = bench.run(replace(OUT, budget_s=19), FakeEnv(), jsonl=tmp_path / "s.jsonl", clock=lambda: now[0], progress=tick)
    assert r["not_run"] == ["shape:out:m1"]


def test_a_header_that_cannot_be_written_is_reported(tmp_path):
    jl = tmp_path / "d"
    jl.mkdir()                       # a folder where the file should be: every write fails
    r = bench.run(OUT, FakeEnv(), jsonl=jl)
    assert [x["key"] for x in r["rows"]] == KEYS        # the run still goes on
    assert len(r["write_errors"]) == 5                  # the header, then each of the 4 rows
    assert r["write_errors"][0].startswith(f"--jsonl {jl}: could not write: ")


def test_a_dry_run_step_runs_no_chain(tmp_path):
    # the dry run runs no kernel: the step's chained values are only checked by a real run
    cfg = Config(shapes="gate_up,down", ms=(1,), step_ms=(1,), pairs=7, warmup=1)
    r = bench.run(cfg, FakeEnv(), jsonl=tmp_path / "r.jsonl")
    step = [x for x in r["rows"] if x["key"] == "step:m1"][0]
    assert step["status"] == "timed"
    assert not any("values" in step["sides"][s] for s in ("a", "b"))
