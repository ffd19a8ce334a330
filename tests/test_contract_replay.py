"""The bad-input and A/B contract of `replay` and `selftest`, table-driven: an empty or
unknown value is a usage error naming the option given, before any work; outputs that collide
with each other or with the capture are refused; a write that fails after the work keeps the
verdict and exits 3; an A/B of a path with itself is refused (or fails, where the trace shows
it); a control that equals A is void; a run that would test nothing is not a pass.
The replay model is test_replay's stand-in (captured here, no downloads)."""
import json
import math
import shlex

import pytest
import torch

from kernels import backend, dispatch
from pq2verify import cases, cli, outputs, replay, selftest
from test_replay import _capture, _isolate

pytestmark = pytest.mark.replay

REPRO = "pytest -p no:randomly tests/test_contract_replay.py -k"


@pytest.fixture(autouse=True)
def _cli(run_cli):
    global _in_process
    _in_process = run_cli


def _main(capsys, *argv):
    """(exit code, stdout, stderr) of an in-process `pq2verify ARGV`, argparse errors too."""
    return _in_process(argv)


@pytest.fixture(scope="module")
def _cap(tmp_path_factory, device):
    return _capture(tmp_path_factory, device, 2048)


@pytest.fixture
def cap(_cap, monkeypatch, device):
    _isolate(monkeypatch, device)
    return _cap


@pytest.fixture
def no_run(monkeypatch):
    """Running either side raises: a refusal must come before the calls are run."""
    def refuse(*a, **k):
        raise AssertionError("the replay ran before the bad input was refused")
    monkeypatch.setattr(replay, "run_side", refuse)


@pytest.fixture
def no_load(monkeypatch, no_run):
    """Loading the capture or model raises too: an option error comes before it."""
    def refuse(*a, **k):
        raise AssertionError("the capture was loaded before the bad option was refused")
    monkeypatch.setattr(replay, "load", refuse)


def _replay(capsys, device, capture, *extra):
    return _main(capsys, "--device", device, "replay", "--capture", str(capture), *extra)


# --- replay: option values, refused before loading anything -----------------------------------
@pytest.mark.parametrize("extra, says", [
    (["--faults", ""], "--faults: expected comma-separated names, got ''"),
    (["--faults", ","], "--faults: expected comma-separated names, got ','"),
    (["--faults", "scale_ulp,"], "--faults: expected comma-separated names, got 'scale_ulp,'"),
    (["--faults", "scale_ulp,scale_ulp"], "--faults: scale_ulp given twice"),
    (["--faults", "all,none"], "--faults 'all,none': 'all' stands alone"),
    (["--faults", "nosuch"], "--faults 'nosuch': unknown fault 'nosuch'"),
    (["--faults", "none,nosuch"], "--faults 'nosuch': unknown fault 'nosuch'"),
    (["--fault", "nosuch"], "--fault 'nosuch': unknown fault 'nosuch'"),
    (["--fault", ""], "argument --fault: expected a value"),
    (["--layers", ""], "argument --layers: expected a value"),
    (["--a", ""], "argument --a: expected a value"),
    (["--b", " "], "argument --b: expected a value"),
    (["--m", ""], "argument --m: expected comma-separated integers >= 1, got ''"),
    (["--positions", ""], "argument --positions: expected comma-separated integers >= 0, got ''"),
    (["--json", ""], "--json: empty path"),
    (["--markdown", ""], "--markdown: empty path"),
    (["--json", "/dev/full"], "--json /dev/full: cannot write"),
    (["--markdown", "/dev/full"], "--markdown /dev/full: cannot write"),
    (["--json", "{tmp}/F", "--markdown", "{tmp}/F"], "the same file as --json"),
    (["--json", "{cap}/manifest.json"], "inside the input folder --capture"),
    (["--markdown", "{cap}/report.md"], "inside the input folder --capture"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_replay_bad_option_is_refused_before_any_work(extra, says, cap, tmp_path, device, capsys, no_load):
    extra = [e.format(tmp=tmp_path, cap=cap) for e in extra]
    before = sorted(p.name for p in cap.iterdir())
    rc, _, err = _replay(capsys, device, cap, *extra)
    assert rc == 2 and says in err, f"{err}\nreproduce: {REPRO} replay_bad_option"
    assert "Traceback" not in err
    if extra[0] == "--faults" and "nosuch" in extra[1]:
        assert "--fault '" not in err          # the option given, not its sibling
    assert sorted(p.name for p in cap.iterdir()) == before


def test_capture_first_output_inside_the_capture_it_writes_is_refused(cap, tmp_path, device, capsys, no_load):
    d = tmp_path / "new"
    rc, _, err = _main(capsys, "--device", device, "replay", "--capture", str(d), "--capture-first",
                       "--json", str(d / "r.json"))
    assert rc == 2 and f"--json {d / 'r.json'}: inside the folder of --capture" in err, err


def test_a_missing_capture_names_the_command_that_makes_it(cap, tmp_path, device, capsys, monkeypatch):
    """The advice is the exact command (from the checkout) that writes a model capture there;
    run as given (plus a small selection), it makes the capture and the replay passes."""
    for d in (tmp_path / "nothing", tmp_path / "golden" / "model"):
        rc, _, err = _replay(capsys, device, d)
        assert rc == 2 and f"--capture {d}: no model capture there" in err, err
        cmd = f"./pq2 --device {device} replay" + (" --cpu-backend emulate" if device == "cpu" else "")
        cmd += f" --a legacy --b tuned --capture {d} --capture-first"
        assert f"`{cmd}`" in err, err
        if d.name == "model":    # golden capture --model writes <dir>/model
            gold = f"./pq2 --device {device} golden capture --model --dir {d.parent}"
            assert f"`{gold}` (writes {d})" in err, err
            args = cli.build_parser().parse_args(shlex.split(gold)[1:])
            assert args.model and args.dir == str(d.parent) and args.golden_command == "capture"
    rc, _, err = _main(capsys, *shlex.split(cmd)[1:], "--positions", "1", "--m", "1", "--limit", "2")
    assert rc == 0 and (d / "manifest.json").exists(), err


# --- an A/B must compare two different things (issue 23, class 6) -----------------------------
@pytest.mark.parametrize("a, b", [("tuned", "tuned"), ("legacy", "legacy"), ("tuned,gemv=off", "tuned, gemv=off")])
def test_an_ab_of_one_spec_with_itself_is_refused_before_loading(a, b, cap, device, capsys, no_load):
    rc, _, err = _replay(capsys, device, cap, "--a", a, "--b", b)
    assert rc == 2 and "are the same kernel spec" in err and "choose an --a and --b" in err, \
        f"{err}\nreproduce: {REPRO} one_spec_with_itself"


@pytest.mark.parametrize("a, b, says", [
    ("legacy", "tuned,gemv=off,single=off", "M=1: attn, mlp both run int_gemv"),
    ("tuned,gemv=off", "tuned,gemv=off,mmq_wgmma=off", "M=1: attn, mlp both run single"),
    ("tuned", "tuned,mmq_wgmma=off", "M=1: attn, mlp both run gemv"),
])
def test_an_ab_of_a_path_with_itself_is_refused_before_the_run(a, b, says, cap, device, capsys, no_run):
    """Two specs that differ in text, decided from the captured shapes and Ms by dispatch's own
    choice: where they pick one path in one fold order for some (kind, M), refused."""
    rc, _, err = _replay(capsys, device, cap, "--a", a, "--b", b, "--m", "1,4")
    assert rc == 2 and "resolve to the same path and fold order" in err and says in err, \
        f"{err}\nreproduce: {REPRO} path_with_itself"
    if a == "legacy":       # they differ at M = 4 (int_gemv vs small_mma)
        assert "replay only the Ms where they differ (--m 4)" in err, err
    else:
        assert "choose an --a and --b that dispatch to different paths" in err, err


def test_the_same_specs_where_they_differ_run_and_report_what_ran(cap, tmp_path, device, capsys):
    j = tmp_path / "r.json"
    rc, out, err = _replay(capsys, device, cap, "--a", "legacy", "--b", "tuned,gemv=off,single=off", "--m", "4",
                           "--json", str(j))
    assert rc == 0, out + err
    rows = json.loads(j.read_text())["paths"]
    assert {(r["kind"], r["m"], tuple(r["a"]), tuple(r["b"]), r["same"]) for r in rows} == {
        ("attn", 4, ("int_gemv",), ("small_mma",), 0), ("mlp", 4, ("int_gemv",), ("small_mma",), 0)}
    assert "## What A and B ran (dispatch trace)" in out and "| attn | 4 | 4 | int_gemv |" in out


def test_a_run_whose_trace_shows_the_same_path_on_both_sides_fails(cap, tmp_path, device, capsys, monkeypatch):
    """dispatch chose int_gemv for A and gemv for B, but every call is forced to int_gemv (a
    switch that leaks into both runs): the trace shows it, and the run fails saying so."""
    real = dispatch.pq2_matmul
    monkeypatch.setattr(dispatch, "pq2_matmul", lambda x, w, **kw: real(x, w, path="int_gemv"))
    j = tmp_path / "r.json"
    rc, out, err = _replay(capsys, device, cap, "--m", "1", "--limit", "2", "--json", str(j))
    assert rc == 1, out + err
    fails = [f for c in json.loads(j.read_text())["runs"][0]["calls"] for f in c["failures"]]
    assert any("B ran int_gemv (dispatch trace) where dispatch chose gemv" in f for f in fails), fails
    assert any("A and B both ran int_gemv with the same fold order" in f for f in fails), fails


# --- controls must be controls (class 7) -------------------------------------------------------
def test_a_control_with_a_fold_order_of_a_is_void(tmp_path_factory, tmp_path, device, capsys, monkeypatch):
    """At K = 128 there is one group: the reversed fold is int_gemv's own order and its bits are
    A's; the control then controls nothing and the run fails, saying so."""
    d = _capture(tmp_path_factory, device, 128)
    _isolate(monkeypatch, device, 128)
    j = tmp_path / "v.json"
    rc, out, err = _replay(capsys, device, d, "--fault", "fold_reversed", "--m", "1", "--json", str(j))
    assert rc == 1, out + err
    run = json.loads(j.read_text())["runs"][0]
    assert run["control"]["outputs_differ_from_a"] == 0 and run["control"]["same_fold_as_a"] == len(run["calls"])
    assert any("the control is void: its fold order (groups G-1..0) is A's own" in f for f in run["failures"])
    assert any("none of its" in f and "differs from A's bits" in f for f in run["failures"])
    assert "the control is void" in out


def test_the_bias_threshold_is_two_sided_over_every_test_once(cap, tmp_path, device, capsys):
    """2 statistics per call and per kind, each two-sided: tests x P(|Z| > z) = alpha, with
    P(|Z| > z) = erfc(z / sqrt 2) (own derivation, not the function under test)."""
    j = tmp_path / "t.json"
    rc, out, err = _replay(capsys, device, cap, "--m", "1", "--json", str(j))
    assert rc == 0, out + err
    run = json.loads(j.read_text())["runs"][0]
    tests = 2 * (len(run["calls"]) + len(run["kinds"]))
    assert math.isclose(tests * math.erfc(run["bias_threshold"] / math.sqrt(2)), replay.BIAS_ALPHA, rel_tol=1e-6)


@pytest.mark.parametrize("up, down", [("scale_ulp", "scale_ulp_down"), ("scale_1pct", "scale_1pct_down"),
                                      ("round_up", "round_down")])
def test_every_directed_fault_is_planted_both_ways(up, down):
    from pq2verify import replay_cli
    assert up in replay.FAULTS and down in replay.FAULTS
    assert up in replay_cli.SEPARATION and down in replay_cli.SEPARATION
    assert replay.FAULTS[up][0] == replay.FAULTS[down][0] == "FAIL"


@pytest.mark.parametrize("fn, sign", [("_ulp_up", 1), ("_ulp_down", -1)])
def test_one_ulp_scale_faults_move_the_magnitude_the_way_they_say(fn, sign):
    s = torch.tensor([0.5, -0.5, 3.0e-5, -1.0, 0.0], dtype=torch.float16)
    got = getattr(replay, fn)(s.clone()).double()
    mag = (got.abs() - s.double().abs())[:4]
    assert (torch.sign(mag) == sign).all(), got
    assert torch.isfinite(got).all() and (got[4] == 0 or sign > 0)   # a zero scale never turns NaN


@pytest.mark.parametrize("rounding", ["up", "down"])
def test_directed_rounding_lands_on_the_right_side(rounding):
    """Each output is the dtype value next to the FP32 sum on the stated side (own check in
    float64), never further than one spacing from it."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 384, generator=g).bfloat16()
    from kernels import emulation
    from pq2verify import inputs
    w = inputs.ternary_weight(64, 384, 5, "cpu")
    q, _ = emulation.quantize_q8(x)
    dots = emulation.group_dots(q, w).permute(1, 2, 0).to(torch.int32)
    near = replay._refold(x, w, dots, torch.bfloat16).double()
    y = replay._refold(x, w, dots, torch.bfloat16, rounding=rounding).double()
    acc = replay._refold(x, w, dots, torch.float32).double()
    assert ((y >= acc) if rounding == "up" else (y <= acc)).all()
    assert ((y - near).abs() <= (near.abs() * 2 ** -7 + 1e-38)).all()
    assert (y != near).any()


# --- write failures after the work -------------------------------------------------------------
def test_replay_write_failure_keeps_the_verdict_and_exits_3(cap, tmp_path, device, capsys, monkeypatch):
    """A disk that fills during the run (the check before it passed): the verdict is printed,
    the other output is written, and the exit code is the write failure's, not a FAIL's."""
    monkeypatch.setattr(outputs, "_probe_device", lambda p, opt: None)
    md = tmp_path / "r.md"
    rc, out, err = _replay(capsys, device, cap, "--m", "1", "--limit", "2", "--json", "/dev/full",
                           "--markdown", str(md))
    assert rc == outputs.EXIT_WRITE == 3, out + err
    assert "**Overall: PASS**" in out and "--json /dev/full: could not write" in err
    assert "**Overall: PASS**" in md.read_text()


# --- selftest ----------------------------------------------------------------------------------
@pytest.fixture
def no_selftest(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the selftest ran before the bad input was refused")
    monkeypatch.setattr(selftest, "run", refuse)


@pytest.mark.parametrize("extra, says", [
    (["--faults", ""], "--faults: selects nothing"),
    (["--faults", ","], "--faults: selects nothing"),
    (["--faults", "ulp,"], "--faults: expected comma-separated names, got 'ulp,'"),
    (["--faults", "ulp,ulp"], "--faults: ulp given twice"),
    (["--paths", ""], "argument --paths: expected comma-separated names, got ''"),
    (["--paths", "native,"], "--paths: expected comma-separated names"),
    (["--case", ""], "--case: selects nothing"),
    (["--case", "bogus"], "--case: unknown 'bogus'"),
    (["--case", "{case}", "--paths", "native"], "--case names the paths to run; it does not combine with --paths"),
    (["--paths", "cublas", "--faults", "neighbour_scale"], "--faults neighbour_scale: nothing applicable on"),
    (["--json", ""], "--json: empty path"),
    (["--json", "/dev/full"], "--json /dev/full: cannot write"),
    (["--markdown", "/dev/full"], "--markdown /dev/full: cannot write"),
    (["--json", "{tmp}/F", "--markdown", "{tmp}/F"], "the same file as --json"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_selftest_bad_option_is_refused_before_any_work(extra, says, tmp_path, device, capsys, no_selftest):
    case = cases.profile("selftest", backend.golden_key())[0].id
    rc, _, err = _main(capsys, "--device", device, "selftest", *[e.format(tmp=tmp_path, case=case) for e in extra])
    assert rc == 2 and says in err and "Traceback" not in err, f"{err}\nreproduce: {REPRO} selftest_bad_option"


def test_selftest_where_every_fault_is_na_is_not_a_pass(device, capsys, no_selftest):
    if device != "cpu":
        pytest.skip("host_value applies on CUDA")
    rc, _, err = _main(capsys, "--device", device, "selftest", "--faults", "host_value")
    assert rc == 2 and "--faults host_value: nothing applicable on cpu" in err and "needs CUDA graphs" in err, err


def test_list_cases_selftest_ids_work_as_selftest_case(device, capsys, monkeypatch):
    """Every id --list-cases selftest prints selects exactly its path in `selftest --case`."""
    assert cli.main(["--device", device, "--list-cases", "selftest"]) == 0
    ids = capsys.readouterr().out.split()
    assert ids
    got = []

    def record(paths, faults, device, log=None):
        got.append(paths)
        raise KeyboardInterrupt       # stop there: only the selection is under test
    monkeypatch.setattr(selftest, "run", record)
    for i in ids:
        assert cli.main(["--device", device, "selftest", "--case", i]) == 130
    assert got == [[i.split(":")[0]] for i in ids]


def test_selftest_write_failure_keeps_the_verdict_and_exits_3(tmp_path, device, capsys, monkeypatch):
    monkeypatch.setattr(outputs, "_probe_device", lambda p, opt: None)
    md = tmp_path / "s.md"
    v = selftest.Verdict("ulp", "native", "caught", caught_by=["per-element"])
    monkeypatch.setattr(selftest, "run", lambda *a, **k: [v])
    rc, out, err = _main(capsys, "--device", device, "selftest", "--paths", "native", "--faults", "ulp",
                         "--json", "/dev/full", "--markdown", str(md))
    assert rc == 3, out + err
    assert "ulp" in out and "per-element" in out and "--json /dev/full: could not write" in err
    assert "per-element" in md.read_text()
