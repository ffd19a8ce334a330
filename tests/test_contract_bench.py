"""The bench's command-line contract (issues 23 class 6 and 24), on --dry-run (fake gates and
timings on the CPU): an A/B compares two different paths; outputs never collide with each other
or an input; a failed write after the verdict is exit 3 with the verdict kept; a run cut by its
budget is PARTIAL (exit 1), never OK; nonsense numbers and empty values are usage errors (exit
2) before any work. Each row once passed, ran anyway, or lost a file."""
import json
import os

import pytest

from kernels import backend
from pq2verify import bench, cli

DEVICE = backend.device()
QUICK = ["bench", "--dry-run", "--quick", "--shapes", "out", "--m", "1", "--step-m", "none"]


def _cmd(argv) -> str:
    """The one-line command that reproduces a case."""
    return "./pq2 --device " + DEVICE + " " + " ".join(a if a and " " not in a else repr(a) for a in argv)


@pytest.fixture(autouse=True)
def _cli(run_cli):
    global _in_process
    _in_process = run_cli


def _main(capsys, argv):
    """(exit code, stdout, stderr) of an in-process `pq2verify --device DEVICE ARGV`."""
    return _in_process(["--device", DEVICE, *argv])


@pytest.fixture
def no_run(monkeypatch):
    """The run itself raises: a usage error must come before it."""
    def refuse(*a, **k):
        raise AssertionError("the bench run started before the bad input was refused")
    monkeypatch.setattr(bench, "run", refuse)


# --- usage errors before any work (exit 2), each naming the option ----------------------------
BAD = [
    # issue 23 class 6: an A/B must compare two different things
    (["--a", "tuned", "--b", "tuned"], "--a tuned and --b tuned resolve to the same path for every item"),
    (["--a", "legacy", "--b", "legacy"], "resolve to the same path for every item"),
    # issue 24 class 1: two outputs on one file, an output on an input
    (["--jsonl", "{F}", "--json", "{F}"], "the same file as --json"),
    (["--json", "{d}/r.jsonl"], "the same file as --json"),            # --jsonl defaults to --json's .jsonl
    (["--report", "{d}/r.md", "--json", "{d}/r.png"], "the same file as --json"),   # the report's plot
    (["--report", "{F}", "--html", "{F}"], "the same file as --report"),
    (["--json", "{B}", "--baseline", "{B}"], "is the input --baseline"),
    # issue 24 class 2: an unwritable output is refused before the work
    (["--json", "/dev/full"], "--json /dev/full: cannot write"),
    (["--jsonl", "/dev/full"], "--jsonl /dev/full: cannot write"),
    # issue 24 classes 4 and 5: nonsense numbers
    (["--budget-s", "-1"], "argument --budget-s: expected a positive number, got '-1'"),
    (["--budget-s", "0"], "argument --budget-s: expected a positive number, got '0'"),
    (["--budget-s", "nan"], "argument --budget-s: expected a positive number, got 'nan'"),
    (["--rotate-gb", "-5"], "argument --rotate-gb: expected a positive number, got '-5'"),
    (["--rotate-gb", "0"], "argument --rotate-gb: expected a positive number, got '0'"),
    (["--bw-gb", "inf"], "argument --bw-gb: expected a positive number, got 'inf'"),
    (["--min-sample-ms", "-1"], "argument --min-sample-ms: expected a positive number"),
    (["--ci-width", "0"], "argument --ci-width: expected a positive number"),
    (["--spin-us", "-1"], "argument --spin-us: expected a number >= 0, got '-1'"),
    (["--spin-us", "nan"], "argument --spin-us: expected a number >= 0, got 'nan'"),
    (["--max-pairs", "0"], "argument --max-pairs: expected an integer >= 1"),
    (["--max-pairs", "3"], "--max-pairs 3: at least --pairs (7)"),
    (["--baseline-tol", "1.5"], "argument --baseline-tol: expected a fraction in [0, 1)"),
    (["--m", "1,1"], "argument --m: 1 given twice"),
    (["--m", "none", "--step-m", "none"], "leave no shape and no decode step to time"),
    # issue 24 class 3: empty values
    (["--shapes", ""], "argument --shapes: expected comma-separated names, got ''"),
    (["--shapes", ","], "argument --shapes: expected comma-separated names, got ','"),
    (["--shapes", "out,"], "argument --shapes: expected comma-separated names, got 'out,'"),
    (["--shapes", "out,out"], "argument --shapes: out given twice"),
    (["--m", ""], "argument --m: expected comma-separated integers >= 1, got ''"),
    (["--step-m", ","], "argument --step-m: expected comma-separated integers >= 1"),
    (["--a", ""], "argument --a: expected a value, got an empty string"),
    (["--b", " "], "argument --b: expected a value, got an empty string"),
    (["--json", ""], "--json: empty path"),
    (["--jsonl", ""], "--jsonl: empty path"),
    (["--report", ""], "--report: empty path"),
    (["--html", ""], "--html: empty path"),
    # options a mode cannot honour, inputs that are not there
    (["--baseline", "{d}/nosuch.json"], "argument --baseline: no such file"),
    (["--baseline", "{F}"], "not a bench --json result"),
    (["--selftest"], "--selftest times planted faults on a CUDA GPU"),
    (["--selftest", "--report", "{d}/s.md"], "--report does not go with --selftest"),
]


@pytest.mark.parametrize("argv,says", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_bench_input_is_refused_before_any_work(argv, says, tmp_path, capsys, no_run):
    f, b = tmp_path / "F", tmp_path / "base.json"
    f.write_text("x")
    b.write_text(json.dumps({"header": {"config": {}}, "rows": []}))
    argv = [a.format(F=f, d=tmp_path, B=b) for a in argv]
    full = ["bench", "--dry-run", "--quick", *argv]
    rc, out, err = _main(capsys, full)
    assert rc == 2 and says in err, f"exit {rc}, stderr {err!r}; reproduce: {_cmd(full)}"
    assert f.read_text() == "x" and json.loads(b.read_text())["rows"] == [], f"an input was written: {_cmd(full)}"


# --- A == B per item: not timed, no ratio; the rest of the run goes on ------------------------
def test_an_item_whose_a_and_b_resolve_alike_is_not_timed(tmp_path, capsys, monkeypatch):
    # PQ2_PATH_GEMV=on puts both sets on gemv at M=1; at M=16 legacy (int_gemv) and tuned differ
    monkeypatch.setenv("PQ2_PATH_GEMV", "on")
    j = tmp_path / "r.json"
    argv = ["bench", "--dry-run", "--quick", "--shapes", "out", "--m", "1,16", "--step-m", "none", "--json", str(j)]
    rc, out, err = _main(capsys, argv)
    repro = "PQ2_PATH_GEMV=on " + _cmd(argv)
    assert rc == 0, f"exit {rc}: {err}; reproduce: {repro}"
    rows = {r["key"]: r for r in json.loads(j.read_text())["rows"]}
    m1, m16 = rows["shape:out:m1"], rows["shape:out:m16"]
    assert m1["status"] == "same" and m1["ratios"] == {} and "time" not in m1["sides"]["b"], repro
    assert "out M=1: A == B (gemv), not timed" in out, repro
    assert m16["status"] == "timed" and m16["ratios"]["b_over_a"]["median"] > 0, repro
    assert m1["sides"]["a"]["path"] == m1["sides"]["b"]["path"] != m16["sides"]["b"]["path"], repro


def test_the_resolution_is_decided_before_timing():
    """resolve.preflight names, per item, the paths of A and B from dispatch alone."""
    cfg = bench.Config(a="legacy", b="tuned", shapes="out,in_proj_ba", ms=(1, 16), step_ms=())
    env = bench.FakeEnv()
    plan, res = bench.prepare(cfg, env)
    assert res["shape:out:m1"]["a"] == bench.envs.dispatch.resolve(
        1, bench.FakeWeight(5120, 6144, "prepared"), bench.FakeInputs(bench.bench_case(
            "native", bench.select_shapes("out", "x")[0], 1, cfg)).x, "legacy").name
    assert not res["shape:out:m16"]["same"]
    assert set(res) == {"shape:out:m1", "shape:out:m16", "shape:in_proj_ba:m1", "shape:in_proj_ba:m16"}
    with pytest.raises(bench.SameSides, match="resolve to the same path"):
        bench.prepare(bench.Config(a="tuned", b="tuned", shapes="out", ms=(1,), step_ms=()), env)
    with pytest.raises(bench.SameSides):              # a dense shape on cuBLAS both ways compares nothing
        bench.prepare(bench.Config(a="legacy", b="legacy", shapes="in_proj_ba", ms=(1,), step_ms=()), env)


# --- the budget: a run that did not run every item is PARTIAL, exit 1 -------------------------
def test_a_run_cut_by_its_budget_is_partial_not_ok(tmp_path, capsys):
    argv = [*QUICK, "--m", "1,16", "--budget-s", "1e-9", "--jsonl", str(tmp_path / "r.jsonl")]
    rc, out, err = _main(capsys, argv)
    assert rc == 1, f"exit {rc}; reproduce: {_cmd(argv)}"
    last = out.strip().splitlines()[-1]
    assert last.startswith("PARTIAL: ") and "not run (budget spent: --resume continues)" in last, \
        f"{last!r}; reproduce: {_cmd(argv)}"
    n = int(last.split(" not run")[0].rsplit(", ", 1)[-1])
    assert n >= 3, f"{n} not run; reproduce: {_cmd(argv)}"         # bandwidth, the A/A row, the shapes
    assert f"PARTIAL: {n} items not run" in out
    rc, out, _ = _main(capsys, [*QUICK, "--m", "1,16", "--jsonl", str(tmp_path / "r.jsonl"), "--resume"])
    assert rc == 0 and out.strip().splitlines()[-1].startswith("OK: "), "the resume finishes the run"


# --- a write that fails after the run: exit 3, the verdict printed first ----------------------
def test_a_failed_write_after_the_verdict_is_exit_3(tmp_path, capsys, monkeypatch):
    j = tmp_path / "r.json"
    real = bench.run

    def run_then_block(*a, **k):        # the disk "fills" while the run goes: --json becomes unwritable
        res = real(*a, **k)
        j.mkdir()
        return res
    monkeypatch.setattr(bench, "run", run_then_block)
    argv = [*QUICK, "--json", str(j), "--report", str(tmp_path / "r.md")]
    rc, out, err = _main(capsys, argv)
    assert rc == 3, f"exit {rc}: {err}; reproduce: {_cmd(argv)}"
    assert "OK: " in out and f"--json {j}: could not write" in err, (out[-300:], err)
    assert out.index("OK: ") < out.index(f"wrote {tmp_path / 'r.md'}"), "the verdict comes before the files"
    assert (tmp_path / "r.md").read_text().startswith("# pq2verify bench"), "the other outputs are still written"
    lines = (tmp_path / "r.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["kind"] == "header" and len(lines) >= 4, "the JSON lines are kept"


def test_a_jsonl_that_fails_midway_is_exit_3_after_the_verdict(tmp_path, capsys, monkeypatch):
    """The rows' JSON lines are written as they come; one that cannot be written is reported
    after the verdict (exit 3), and the run still finishes."""
    from pq2verify.bench import runner
    monkeypatch.setattr(runner, "open", lambda *a, **k: open(os.devnull, "r"), raising=False)
    argv = [*QUICK, "--jsonl", str(tmp_path / "r.jsonl")]
    rc, out, err = _main(capsys, argv)
    assert rc == 3 and "OK: " in out and "--jsonl" in err and "could not write" in err, (rc, err)
