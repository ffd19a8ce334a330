"""The command-line contract: a bad option, environment variable or output path is a usage
error (exit 2) naming what is wrong, raised before any work starts; good input still runs.
Each bad input here once gave a green (PASS: 0 of 0, exit 0), a traceback, or ran anyway."""
import json
import os

import pytest

from kernels import backend, dispatch
from pq2verify import bench, bench_cli, check_cli, checks, cli, derive, golden_cli, selfcheck
from pq2verify.gsm8k import cli as gsm8k_cli

DEVICE = backend.device()
TINY = "native:t=8x128:m1:bf16:raw:normal:seed1"     # one interpreter case, well under a second


def _main(capsys, *argv):
    """(exit code, stderr) of an in-process `pq2verify --device DEVICE ARGV`, argparse errors too."""
    try:
        rc = cli.main(["--device", DEVICE, *argv])
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


@pytest.fixture
def no_work(monkeypatch):
    """Every entry into real work raises: a usage error must come before any of it."""
    def refuse(*a, **k):
        raise AssertionError("work started before the bad input was refused")
    for mod, name in ((checks, "evaluate"), (checks, "call"), (selfcheck, "run_all"), (derive, "derive_exact"),
                      (bench, "run"), (gsm8k_cli, "_main"), (golden_cli, "run")):
        monkeypatch.setattr(mod, name, refuse)


# --- check: filters that are unknown or select nothing -----------------------------------
@pytest.mark.parametrize("argv,names", [
    (["--kernels", "bogus"], "--kernels 'bogus': unknown kernel set"),
    (["--m", "0"], "argument --m: expected an integer >= 1, got '0'"),
    (["--m", "-1"], "argument --m: expected an integer >= 1, got '-1'"),
    (["--m", "abc"], "argument --m: expected an integer >= 1, got 'abc'"),
    (["--m", "1,,x"], "argument --m: expected comma-separated integers >= 1, got '1,,x'"),
    (["--layout", "bogus"], "--layout: unknown 'bogus'; expected one of raw, prepared, dense"),
    (["--dtype", "fp32"], "--dtype: unknown 'fp32'; expected one of bf16, fp16"),
    (["--paths", "bogus"], "--paths: unknown 'bogus'"),
    (["--m", "2", "--paths", "single"], "no case matches --paths single --m 2 (shapes small); "
                                        "the paths: single in the tuned set, M 1"),
    (["--kernels", "legacy", "--paths", "single"], "no case matches --kernels legacy --paths single"),
    (["--paths", "cublas", "--layout", "raw"], "no case matches --paths cublas --layout raw"),
    (["--reruns", "0"], "argument --reruns: expected an integer >= 1, got '0'"),
    (["--reruns", "-2"], "argument --reruns: expected an integer >= 1, got '-2'"),
    (["--case", TINY, "--m", "1"], "--case runs exactly the cases named; it does not combine with --m 1"),
    (["--record"], "--record goes with --derive-exact"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "msg")
def test_check_bad_filter_is_a_usage_error(argv, names, capsys, no_work):
    if "small" in names and DEVICE == "cuda":
        names = names.replace("(shapes small)", "(shapes bonsai27b)")
    rc, err = _main(capsys, "check", *argv)
    assert rc == 2 and names in err, err


@pytest.mark.parametrize("spec,names", [
    ("native:a=200x640:m1:bf16:dense:normal:seed1", "layout 'dense': path native has layouts raw, prepared"),
    ("cublas:ba=96x384:m1:bf16:raw:normal:seed1", "layout 'raw': path cublas has layouts dense"),
    ("native:a=200x640:m1:fp32:raw:normal:seed1", "dtype 'fp32': path native takes bf16, fp16"),
    ("native:a=200x640:m1:bf16:raw:gauss:seed1", "input kind 'gauss'"),
    ("single:a=200x640:m2:bf16:raw:normal:seed1", "path single serves M 1; got 200x640, M=2"),
    ("native:a=200x640:m0:bf16:raw:normal:seed1", "path native serves M 1+; got 200x640, M=0"),
    ("native:a=8x128:m1:bf16:raw:normal:seed1", "shape 'a' is 200x640, not 8x128"),
    ("native:a=200x640:m1:bf16:raw:normal:strange:seed1", "expected path:shape=NxK:mM"),
    ("native:a=200x640:1:bf16:raw:normal:seed1", "expected path:shape=NxK:mM"),
    ("native:a=200x640:m1:bf16:raw:normal:1", "expected path:shape=NxK:mM"),
    ("nosuch:a=200x640:m1:bf16:raw:normal:seed1", "unknown path 'nosuch'"),
], ids=lambda v: v if ":" in v and "=" in v else "msg")
def test_case_that_is_not_what_its_id_says_is_refused(spec, names, capsys, no_work):
    with pytest.raises(ValueError) as e:
        checks.Case.parse(spec)
    assert names in str(e.value)
    rc, err = _main(capsys, "check", "--case", spec)
    assert rc == 2 and names in err, err


def test_generated_and_tool_case_ids_still_parse():
    from pq2verify import golden
    from pq2verify.bench import Config, Shape, bench_case
    ids = [c.id for c in checks.cases("small") + checks.cases("bonsai27b", paths=["mmq", "cublas"])]
    ids += [bench_case("native", Shape("t", 32, 128), 1, Config()).id, TINY,
            TINY.replace("seed1", "strided:seed1")]
    ids += [c.id for c in golden.cases("interpreter") + golden.cases("sm90")]
    for i in ids:
        assert checks.Case.parse(i).id == i


# --- check: output paths are checked before the work; --render input gives a message -----
def test_check_output_into_a_missing_or_unwritable_place(tmp_path, capsys, no_work):
    f = tmp_path / "file"
    f.write_text("x")
    # a missing folder is made (outputs.write_text makes parents); a file in the way is refused
    for opt, target, names in (("--json", f / "no" / "r.json", "is not a directory"),
                               ("--markdown", f / "r.md", "is not a directory"),
                               ("--json", tmp_path, "is a directory")):
        rc, err = _main(capsys, "check", opt, str(target))
        assert rc == 2 and f"{opt} {target}:" in err and names in err, err
    assert sorted(os.listdir(tmp_path)) == ["file"]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc: a directory no one can create files in")
def test_check_output_into_a_read_only_directory(capsys, no_work):
    rc, err = _main(capsys, "check", "--json", "/proc/pq2verify-results.json")
    assert rc == 2 and "--json /proc/pq2verify-results.json: cannot write to /proc" in err, err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a mode-555 directory; /proc test covers it")
def test_check_output_into_a_chmod_read_only_directory(tmp_path, capsys, no_work):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        rc, err = _main(capsys, "check", "--markdown", str(ro / "t.md"))
    finally:
        ro.chmod(0o755)
    assert rc == 2 and f"--markdown {ro / 't.md'}: cannot write to {ro}" in err, err


def test_writable_probe_leaves_nothing_and_changes_nothing(tmp_path):
    f = tmp_path / "keep.json"
    f.write_text("{}")
    before = (f.stat().st_mtime_ns, f.read_text())
    cli.check_writable(f, "--json")
    cli.check_writable(tmp_path / "new.json", "--json")
    cli.check_writable(tmp_path / "a" / "b" / "c.json", "--json", make_parents=True)
    cli.check_writable(tmp_path / "d", "--out", directory=True)
    cli.check_writable(tmp_path, "--out", directory=True)
    assert os.listdir(tmp_path) == ["keep.json"] and (f.stat().st_mtime_ns, f.read_text()) == before
    with pytest.raises(cli.UsageError, match=r"--dir .*/x/y: .*/x does not exist"):
        cli.check_writable(tmp_path / "x" / "y", "--dir", directory=True)
    with pytest.raises(cli.UsageError, match="is not a directory"):
        cli.check_writable(f, "--out", directory=True)


@pytest.mark.parametrize("content,names", [
    (None, "cannot read it: No such file or directory"),
    ("not json {", "not a JSON file"),
    ('{"rows": []}', "not a `check --json` file"),
    ("[1, 2]", "not a `check --json` file"),
])
def test_render_of_a_missing_or_foreign_file(content, names, tmp_path, capsys):
    f = tmp_path / "r.json"
    if content is not None:
        f.write_text(content)
    rc, err = _main(capsys, "check", "--render", str(f))
    assert rc == 2 and f"--render {f}: {names}" in err, err


def test_check_one_case_still_runs_writes_and_renders(tmp_path, capsys):
    j, md = tmp_path / "r.json", tmp_path / "r.md"
    rc = cli.main(["--device", DEVICE, "check", "--case", TINY, "--reruns", "1", "--json", str(j),
                   "--markdown", str(md)])
    out = capsys.readouterr().out
    assert rc == 0 and "PASS: 1 of 1 cases passed" in out, out
    assert json.loads(j.read_text())["cases"][0]["case"] == TINY and "| native |" in md.read_text()
    rc = cli.main(["--device", DEVICE, "check", "--render", str(j)])
    assert rc == 0 and "**1 of 1 cases passed.**" in capsys.readouterr().out


# --- environment: PQ2_KERNELS and PQ2_PATH_* are checked at the start of every command ------
ENV_BAD = [
    ("PQ2_KERNELS", "bogus", "PQ2_KERNELS='bogus': unknown kernel set"),
    ("PQ2_PATH_X", "maybe", "PQ2_PATH_X: no such path"),
    ("PQ2_PATH_SINGLE", "maybe", "PQ2_PATH_SINGLE='maybe': expected on or off"),
    ("PQ2_PATH_single", "off", "PQ2_PATH_single: switch names are upper case; use PQ2_PATH_SINGLE"),
    ("pq2_kernels", "legacy", "pq2_kernels: the variable is PQ2_KERNELS"),
    ("PQ2_KERNEL", "legacy", "PQ2_KERNEL: not a variable pq2verify reads; did you mean PQ2_KERNELS?"),
    ("PQ2_PATHS_SINGLE", "off", "PQ2_PATHS_SINGLE: not a variable pq2verify reads; did you mean PQ2_PATH_SINGLE?"),
    ("PQ2_PATH_INT_GEMV", "", "PQ2_PATH_INT_GEMV='': expected on or off (an empty value is not 'unset'"),
]
COMMANDS = [["check", "--case", TINY], ["golden", "verify"], ["gsm8k", "--limit", "1"], ["bench", "--dry-run"]]


@pytest.mark.parametrize("var,value,names", ENV_BAD, ids=[v[0] + "=" + v[1] for v in ENV_BAD])
@pytest.mark.parametrize("argv", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_bad_environment_is_refused_by_every_command(var, value, names, argv, monkeypatch, capsys, no_work):
    monkeypatch.setenv(var, value)
    rc, err = _main(capsys, *argv)
    assert rc == 2 and f"pq2verify {argv[0]}: error: {names}" in err, err


def test_valid_environment_is_accepted(monkeypatch):
    monkeypatch.setenv("PQ2_KERNELS", "legacy")
    monkeypatch.setenv("PQ2_PATH_SINGLE", " On ")
    dispatch.validate_env()
    assert dispatch.switches() == {"single": True}


# --- bench -----------------------------------------------------------------------------------
@pytest.mark.skipif(DEVICE == "cuda", reason="this machine has a GPU: bench measures here")
def test_bench_without_a_gpu_is_an_error_not_ok(capsys, no_work):
    rc, err = _main(capsys, "bench", "--quick")
    assert rc == 2 and "bench times kernels on a CUDA GPU, and this run is on the CPU" in err, err
    assert "--dry-run" in err


@pytest.mark.parametrize("argv,names", [
    (["--m", "0"], "argument --m: expected an integer >= 1, got '0'"),
    (["--step-m", "x"], "argument --step-m: expected an integer >= 1, got 'x'"),
    (["--reruns", "0"], "argument --reruns: expected an integer >= 1"),
    (["--warmup", "-1"], "argument --warmup: expected an integer >= 0"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "msg")
def test_bench_bad_numbers(argv, names, capsys, no_work):
    rc, err = _main(capsys, "bench", "--dry-run", *argv)
    assert rc == 2 and names in err, err


def test_bench_outputs_are_checked_before_the_run(tmp_path, capsys, no_work):
    f = tmp_path / "file"
    f.write_text("x")
    for opt in ("--json", "--report", "--jsonl"):
        rc, err = _main(capsys, "bench", "--dry-run", opt, str(f / "out"))
        assert rc == 2 and f"{opt} {f / 'out'}: {f} is not a directory" in err, err


def test_bench_dry_run_still_runs_and_says_it_measured_nothing(tmp_path, capsys):
    rc = cli.main(["--device", DEVICE, "bench", "--dry-run", "--quick", "--shapes", "out", "--m", "1",
                   "--step-m", "none", "--jsonl", str(tmp_path / "new" / "b.jsonl")])
    out = capsys.readouterr().out
    assert rc == 0 and "(dry run: fake gates and timings, not a measurement)" in out, out


# --- gsm8k: numbers and the output folder -------------------------------------------------
@pytest.mark.parametrize("opt,value,least", [
    ("--limit", "0", 1), ("--limit", "-1", 1), ("--max-new-tokens", "0", 1), ("--max-new-tokens", "-5", 1),
    ("--batch-size", "0", 1), ("--jobs", "0", 1), ("--shots", "-1", 0), ("--max-diff", "-1", 0),
    ("--top-k", "0", 1), ("--digits", "0", 1), ("--threads", "0", 1),
])
def test_gsm8k_bad_numbers(opt, value, least, capsys, no_work):
    rc, err = _main(capsys, "gsm8k", opt, value)
    assert rc == 2 and f"argument {opt}: expected an integer >= {least}, got '{value}'" in err, err


def test_gsm8k_edge_numbers_are_accepted():
    args = cli.build_parser().parse_args(["gsm8k", "--limit", "1", "--shots", "0", "--max-diff", "0",
                                          "--batch-size", "1", "--max-new-tokens", "1", "--jobs", "1"])
    got = (args.limit, args.shots, args.max_diff, args.batch_size, args.max_new_tokens, args.jobs)
    assert got == (1, 0, 0, 1, 1, 1)


def test_gsm8k_out_is_checked_before_any_generation(tmp_path, capsys, no_work):
    f = tmp_path / "file"
    f.write_text("x")
    rc, err = _main(capsys, "gsm8k", "--out", str(f))
    assert rc == 2 and f"--out {f}: is not a directory" in err, err


# --- derive: filters it cannot honour --------------------------------------------------------
@pytest.mark.parametrize("argv,names", [
    (["--m", "1"], "it does not take --m 1"),
    (["--dtype", "bf16"], "it does not take --dtype bf16"),
    (["--kernels", "tuned"], "it does not take --kernels tuned"),
    (["--case", TINY], "it does not take --case"),
    (["--markdown", "d.md"], "it does not take --markdown"),
    (["--paths", "int_gemv"], "--paths: 'int_gemv' is not a tuned path with a legacy counterpart"),
    (["--paths", "nosuch"], "--paths: unknown 'nosuch'"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "msg")
def test_derive_refuses_filters_it_cannot_honour(argv, names, capsys, monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("derive started")
    monkeypatch.setattr(checks, "call", refuse)
    rc, err = _main(capsys, "check", "--derive-exact", *argv)
    assert rc == 2 and names in err, err


def test_check_cli_modules_share_the_validators():
    # one set of validators: bench and gsm8k use cli's, not copies
    assert bench_cli.positive_int is cli.positive_int and gsm8k_cli.positive_int is cli.positive_int
    assert check_cli.check_writable is cli.check_writable
