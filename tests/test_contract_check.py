"""The `check` command's contract, table by table: no silent green, no traceback, no lost result.
Partial results are never green: a `check --json` says whether its run completed, which shard
of which selection it is and how its reference self-checks went, and `--render` of files that
are not one whole, self-checked run exits non-zero saying why.

Each case runs in-process (`cli.main`); the engine is replaced by a stub where the test is about
the command, not the numerics (`fake_engine`), so every case takes well under a second.
Reproduce one: .venv/bin/python -m pytest -p no:randomly -q tests/test_contract_check.py -k NAME"""
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kernels import backend
from pq2verify import cases, check_cli, checks, cli, derive, outputs, selfcheck

DEVICE = backend.device()
ROOT = Path(__file__).resolve().parents[1]
TINY = "native:t=8x128:m1:bf16:raw:normal:seed1"     # one interpreter case, well under a second
# four cases: native on shapes a and b of the small set, raw and prepared
FOUR = ["--shapes", "small", "--paths", "native", "--m", "1", "--dtype", "bf16"]
OTHER = [*FOUR[:-3], "2", "--dtype", "bf16"]       # the same at M = 2: another selection


@pytest.fixture(autouse=True)
def _cli(run_cli):
    global _in_process
    _in_process = run_cli


def _main(capsys, *argv):
    """(exit code, stdout, stderr) of an in-process `pq2verify --device DEVICE ARGV`."""
    return _in_process(["--device", DEVICE, *argv])


@pytest.fixture
def no_work(monkeypatch):
    """Every entry into real work raises: a refusal must come before any of it."""
    def refuse(*a, **k):
        raise AssertionError("work started before the bad input was refused")
    for mod, name in ((checks, "evaluate"), (checks, "call"), (checks, "Inputs"), (selfcheck, "run_all"),
                      (derive, "derive_exact")):
        monkeypatch.setattr(mod, name, refuse)


@pytest.fixture
def fake_engine(monkeypatch):
    """The check engine replaced by a stub that passes every case at once (the command's
    bookkeeping is under test, not the numerics). Returns the ids it was asked to run; set
    `.stop_at = i` to interrupt the run at case i (Ctrl-C), `.fail = {id}` to fail cases."""
    class Ran(list):
        stop_at = None
        fail = set()
    ran = Ran()

    def evaluate(c, device="cpu", *, reruns=5, inp=None, **kw):
        if ran.stop_at is not None and len(ran) == ran.stop_at:
            raise KeyboardInterrupt
        ran.append(c.id)
        r = checks.Result(c)
        if c.id in ran.fail:
            r.fail("made up for this test")
        return r
    monkeypatch.setattr(checks, "Inputs", lambda c, device: None)      # no tensors: nothing is computed
    monkeypatch.setattr(checks, "evaluate", evaluate)
    return ran


def _four_ids() -> list[str]:
    return [c.id for c in cases.check_cases("small", paths=["native"], ms=[1], dtypes=["bf16"],
                                            key=backend.golden_key())]


# --- lost results: outputs on one file, or on an input ------------------------------------
@pytest.mark.parametrize("argv,says", [
    (["--json", "F", "--html", "F"], "--html F: the same file as --json"),
    (["--json", "F", "--markdown", "./F"], "--markdown ./F: the same file as --json"),
    (["--markdown", "F", "--html", "F"], "--html F: the same file as --markdown"),
    (["--render", "R.json", "--html", "R.json"], "--html R.json: is the input --render R.json"),
    (["--render", "A.json", "R.json", "--markdown", "R.json"], "--markdown R.json: is the input --render R.json"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_outputs_that_collide_are_refused_before_work(argv, says, tmp_path, monkeypatch, capsys, no_work):
    monkeypatch.chdir(tmp_path)
    keep = json.dumps({"provenance": {}, "cases": []})
    for f in ("R.json", "A.json"):
        (tmp_path / f).write_text(keep)
    rc, _, err = _main(capsys, "check", *argv)
    assert rc == 2 and says in err, err
    assert (tmp_path / "R.json").read_text() == keep and not (tmp_path / "F").exists()


# --- write failures: refused where the probe can tell, else exit 3 after the verdict -------
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("argv", [
    ["--case", TINY, "--json", "/dev/full"],
    ["--case", TINY, "--markdown", "/dev/full"],
    ["--case", TINY, "--html", "/dev/full"],
    ["--derive-exact", "--json", "/dev/full"],
], ids=lambda v: " ".join(v[-3:]))
def test_a_full_disk_is_refused_before_the_work(argv, capsys, no_work):
    rc, _, err = _main(capsys, "check", *argv)
    assert rc == 2 and f"{argv[-2]} /dev/full: cannot write" in err, err


@pytest.mark.parametrize("broken", ["--json", "--markdown", "--html"])
def test_a_write_that_fails_after_the_work_keeps_the_verdict_and_exits_3(broken, tmp_path, monkeypatch, capsys,
                                                                         fake_engine):
    files = {o: tmp_path / f"r.{o[2:]}" for o in ("--json", "--markdown", "--html")}
    real = outputs.write_text

    def write_text(path, text, option):
        if option == broken and json.loads(text if option == "--json" else '{"complete": true}').get("complete"):
            raise outputs.WriteError(f"{option} {path}: could not write: No space left on device")
        return real(path, text, option)
    monkeypatch.setattr(outputs, "write_text", write_text)
    rc, out, err = _main(capsys, "check", *FOUR, *[a for o, f in files.items() for a in (o, str(f))])
    assert rc == outputs.EXIT_WRITE == 3, err
    assert "PASS: 4 of 4 cases passed" in out and f"{broken} {files[broken]}: could not write" in err
    for o, f in files.items():            # the others are written whole; the failed one keeps its last state
        if o != broken:
            assert f.stat().st_size > 0, o
    if broken == "--json":                # written as results arrived: every case is in it, not yet complete
        d = json.loads(files["--json"].read_text())
        assert len(d["cases"]) == 4 and d["complete"] is False


def test_json_is_written_as_results_arrive_and_an_interrupt_keeps_it(tmp_path, capsys, fake_engine):
    j = tmp_path / "r.json"
    fake_engine.stop_at = 2
    rc, out, err = _main(capsys, "check", *FOUR, "--json", str(j))
    assert rc == outputs.EXIT_INTERRUPTED == 130, err
    assert "INTERRUPTED" in out and "interrupted after 2 of 4 cases" in out
    d = json.loads(j.read_text())
    assert d["complete"] is False and [r["case"] for r in d["cases"]] == _four_ids()[:2]
    assert d["interrupted"] == "interrupted after 2 of 4 cases"
    rc, _, err = _main(capsys, "check", "--render", str(j))
    assert rc == 1 and f"{j}: incomplete: the run stopped after 2 of its 4 cases" in err, err


# --- empty and duplicate values ------------------------------------------------------------
@pytest.mark.parametrize("argv,says", [
    (["--paths", ""], "argument --paths: expected comma-separated names, got ''"),
    (["--paths", ","], "argument --paths: expected comma-separated names, got ','"),
    (["--dtype", ""], "argument --dtype: expected comma-separated names, got ''"),
    (["--layout", ""], "argument --layout: expected comma-separated names, got ''"),
    (["--kernels", ""], "argument --kernels: expected a value, got an empty string"),
    (["--case", ""], "argument --case: expected a value, got an empty string"),
    (["--json", ""], "--json: empty path"),
    (["--markdown", " "], "--markdown: empty path"),
    (["--derive-exact", "--paths", ""], "argument --paths: expected comma-separated names, got ''"),
    (["--dtype", "bf16,bf16"], "argument --dtype: bf16 given twice in 'bf16,bf16'"),
    (["--paths", "gemv,gemv"], "argument --paths: gemv given twice in 'gemv,gemv'"),
    (["--m", "1,1"], "argument --m: 1 given twice in '1,1'"),
    (["--case", TINY, "--case", TINY], f"--case {TINY}: given twice"),
], ids=lambda v: " ".join(map(repr, v)) if isinstance(v, list) else "")
def test_empty_and_duplicate_values_are_usage_errors(argv, says, capsys, no_work):
    rc, _, err = _main(capsys, "check", *argv)
    assert rc == 2 and says in err, err


@pytest.mark.parametrize("kw,says", [
    (dict(paths=[]), "--paths: empty"), (dict(dtypes=[]), "--dtype: empty"), (dict(layouts=[]), "--layout: empty"),
    (dict(ms=[]), "--m: empty"), (dict(paths=["gemv", "gemv"]), "--paths: gemv given twice"),
    (dict(dtypes=["bf16", "bf16"]), "--dtype: bf16 given twice"), (dict(ms=[1, 1]), "--m: 1 given twice"),
])
def test_the_case_api_never_widens_an_empty_list_or_counts_a_value_twice(kw, says):
    with pytest.raises(ValueError, match=says):
        cases.check_cases("small", **kw)


# --- options a mode cannot honour -------------------------------------------------------------
RENDER_EXTRA = [["--paths", "native"], ["--m", "1"], ["--kernels", "tuned"], ["--kernels", "bogus"],
                ["--case", TINY], ["--derive-exact"], ["--shard", "1/2"], ["--dtype", "bf16"], ["--layout", "raw"],
                ["--reruns", "3"], ["--json", "out.json"], ["--skip-selfcheck"], ["--shapes", "small"],
                ["--allow-slow"], ["--dtype", "fp32"]]


@pytest.mark.parametrize("extra", RENDER_EXTRA, ids=" ".join)
def test_render_refuses_what_it_cannot_honour(extra, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"provenance": {}, "cases": []}))
    rc, out, err = _main(capsys, "check", "--render", str(f), *extra)
    assert rc == 2 and f"--render renders saved results and runs nothing; it does not take {extra[0]}" in err, err
    assert out == "" and not (tmp_path / "out.json").exists()


# (--m, --dtype, --kernels, --case, --markdown: in tests/test_cli_contract.py,
# test_derive_refuses_filters_it_cannot_honour)
@pytest.mark.parametrize("extra", [["--html", "d.html"], ["--shard", "1/2"], ["--reruns", "2"], ["--skip-selfcheck"]],
                         ids=" ".join)
def test_derive_refuses_what_it_cannot_honour(extra, tmp_path, monkeypatch, capsys, no_work):
    monkeypatch.chdir(tmp_path)
    rc, _, err = _main(capsys, "check", "--derive-exact", *extra)
    assert rc == 2 and "--derive-exact tests every case of each tuned path" in err and extra[0] in err, err
    assert os.listdir(tmp_path) == []


# --- render of a file it cannot read: a usage error naming the file, never a traceback ------------
def _row(case_id: str, **over) -> dict:
    r = checks.Result(cases.Case.parse(case_id)).to_json()
    r.update(over)
    return r


# (a missing and a non-JSON file: tests/test_cli_contract.py::test_render_of_a_missing_or_foreign_file)
@pytest.mark.parametrize("content,says", [
    ('{"cases": [], "provenance": []}', "'cases' must be a list, 'provenance' an object"),
    ({"drop": "ok"}, f"case 1 ({TINY}): no 'ok'"),
    ({"ok": "false"}, f"case 1 ({TINY}): 'ok' is \"false\", expected true/false"),
    ({"ok": 0}, "'ok' is 0, expected true/false"),
    ({"failures": "none"}, "'failures' is \"none\", expected a list"),
    ({"ok": False, "failures": [1]}, "'failures' must hold strings, got [1]"),
    ({"m": "1"}, "'m' is \"1\", expected an integer"),
    ({"rel_rms_dense": "small"}, "'rel_rms_dense' is \"small\", expected"),
    ({"ok": True, "failures": ["x"]}, "'ok' is true but it lists 1 failure(s)"),
    ({"ok": False, "failures": []}, "'ok' is false but it lists 0 failure(s)"),
    ('{"cases": [1], "provenance": {}}', "case 1: not an object"),
    ('{"cases": [], "provenance": {}, "complete": "yes"}', "'complete' is \"yes\", expected true/false"),
    ('{"cases": [], "provenance": {}, "selection": {"total": 1, "cases": 2, "fingerprint": "f", "shard": null}}',
     "'selection' is"),
    ('{"cases": [], "provenance": {}, "selection": {"total": 4, "cases": 2, "fingerprint": "f", "shard": [3, 2]}}',
     "expected total, fingerprint, cases and shard [I, N] or null"),
], ids=lambda v: (v if isinstance(v, str) else json.dumps(v, default=repr))[:40])
def test_render_of_a_file_it_cannot_read_names_it(content, says, tmp_path, capsys):
    f = tmp_path / "r.json"
    if isinstance(content, dict):
        row = _row(TINY)
        for k, v in content.items():
            if k == "drop":
                del row[v]
            else:
                row[k] = v
        f.write_text(json.dumps({"provenance": {}, "cases": [row]}))
    else:
        f.write_text(content)
    rc, _, err = _main(capsys, "check", "--render", str(f))
    assert rc == 2 and f"--render {f}" in err and says in err and "Traceback" not in err, err


# --- partial results are never green (issue 23, class 5) --------------------------------------
def _run(capsys, tmp_path, name, *argv):
    j = tmp_path / f"{name}.json"
    rc, out, err = _main(capsys, "check", *FOUR, *argv, "--json", str(j))
    return rc, j, out


def test_json_records_completion_shard_selection_and_selfchecks(tmp_path, capsys, fake_engine):
    rc, j, _ = _run(capsys, tmp_path, "s2", "--shard", "2/3")
    d = json.loads(j.read_text())
    ids = _four_ids()
    assert rc == 0 and d["complete"] is True and [r["case"] for r in d["cases"]] == ids[1::3]
    assert d["selection"]["total"] == 4 and d["selection"]["shard"] == [2, 3] and d["selection"]["cases"] == 1
    assert d["selfcheck"]["status"] == "passed" and len(d["selfcheck"]["checks"]) == len(selfcheck.run_all())
    rc, j2, _ = _run(capsys, tmp_path, "all")
    d2 = json.loads(j2.read_text())
    assert d2["selection"]["fingerprint"] == d["selection"]["fingerprint"] and d2["selection"]["shard"] is None
    other = tmp_path / "m2.json"      # another selection: another fingerprint
    _main(capsys, "check", *OTHER, "--json", str(other))
    assert json.loads(other.read_text())["selection"]["fingerprint"] != d["selection"]["fingerprint"]


@pytest.mark.parametrize("shards,says", [
    (["1/3", "2/3", "3/3"], None),
    (["3/3", "1/3", "2/3"], None),
    (["1/3", "3/3"], "missing shard 2/3"),
    (["1/3"], "missing shards 2/3, 3/3"),
    (["1/3", "1/3", "2/3", "3/3"], "shard 1/3 given 2 times"),
    (["all", "all"], "the same unsharded run given 2 times"),
    (["1/2", "2/3"], "files split the selection differently"),
    (["1/2", "other"], "files of different selections"),
    (["1/2", "2/2@sm90"], "files of different selections"),       # one selection, two kinds of backend
])
def test_render_is_green_only_for_every_shard_of_one_selection_once(shards, says, tmp_path, capsys, fake_engine):
    files = []
    for i, s in enumerate(shards):
        if s == "other":
            j = tmp_path / f"{i}.json"
            _main(capsys, "check", *OTHER, "--shard", "2/2",
                  "--json", str(j))
        elif s.endswith("@sm90"):
            other_key = "sm86" if backend.golden_key() == "sm90" else "sm90"   # not the running one
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(backend, "golden_key", lambda: other_key)
                _, j, _ = _run(capsys, tmp_path, str(i), "--shard", s.split("@")[0])
        else:
            _, j, _ = _run(capsys, tmp_path, str(i), *(["--shard", s] if s != "all" else []))
        files.append(str(j))
    md, page = tmp_path / "t.md", tmp_path / "t.html"
    rc, _, err = _main(capsys, "check", "--render", *files, "--markdown", str(md), "--html", str(page))
    if says is None:
        assert rc == 0 and "**4 of 4 cases passed.**" in md.read_text() and err == "", err
        assert 'class="verdict-pass"' in page.read_text()
    else:
        assert rc == 1 and says in err and says in md.read_text() and "Not a complete result" in md.read_text(), err
        assert 'class="verdict-pass"' not in page.read_text() and says in page.read_text()


def test_shards_beyond_the_selection_are_empty_not_missing(tmp_path, capsys, fake_engine):
    """Shard I of N holds no case when I exceeds the selection (it cannot run: 'no case left'):
    the shards that can run make the whole table."""
    files = []
    for i in (1, 2):
        j = tmp_path / f"{i}.json"
        rc, _, err = _main(capsys, "check", "--case", TINY, "--case", TINY.replace("seed1", "seed2"),
                           "--shard", f"{i}/3", "--json", str(j))
        assert rc == 0, err
        files.append(str(j))
    sel = json.loads(Path(files[1]).read_text())["selection"]
    assert (sel["total"], sel["shard"], sel["cases"]) == (2, [2, 3], 1)
    rc, _, err = _main(capsys, "check", "--case", TINY, "--shard", "3/3")
    assert rc == 2 and "no case left in this shard" in err
    rc, _, err = _main(capsys, "check", "--render", *files)
    assert rc == 0 and err == "", err


@pytest.mark.parametrize("how,says", [
    ("skip", "reference self-checks skipped (--skip-selfcheck)"),
    ("fail", "reference self-checks failed: decode == decode by hand"),
    ("raise", "reference self-checks failed: run the self-checks"),
])
def test_a_skipped_or_failed_selfcheck_is_never_green_when_rendered(how, says, tmp_path, capsys, monkeypatch,
                                                                    fake_engine):
    real = selfcheck.run_all
    if how == "fail":
        monkeypatch.setattr(selfcheck, "run_all",
                            lambda: [(n, n != "decode == decode by hand", d) for n, _, d in real()])
    if how == "raise":
        monkeypatch.setattr(selfcheck, "run_all", lambda: 1 / 0)
    rc, j, out = _run(capsys, tmp_path, "r", *(["--skip-selfcheck"] if how == "skip" else []))
    assert rc == (0 if how == "skip" else 1), out
    rc, _, err = _main(capsys, "check", "--render", str(j))
    assert rc == 1 and f"{j}: {says}" in err, err


def test_a_file_without_a_completion_record_is_not_green(tmp_path, capsys):
    f = tmp_path / "old.json"
    f.write_text(json.dumps({"provenance": {"backend": "x"}, "selfcheck": [], "cases": [_row(TINY)]}))
    rc, out, err = _main(capsys, "check", "--render", str(f))
    assert rc == 1 and f"{f}: does not record whether its run completed" in err, err
    assert "**1 of 1 cases passed.**" in out        # the table is still shown


def test_a_file_that_says_complete_but_lost_cases_is_not_green(tmp_path, capsys, fake_engine):
    _, j, _ = _run(capsys, tmp_path, "r")
    d = json.loads(j.read_text())
    d["cases"].pop()
    j.write_text(json.dumps(d))
    rc, _, err = _main(capsys, "check", "--render", str(j))
    assert rc == 1 and "says complete but holds 3 of its 4 cases" in err, err


def test_rows_that_are_not_the_selection_they_name_are_not_green(tmp_path, capsys, fake_engine):
    _, j, _ = _run(capsys, tmp_path, "r")
    d = json.loads(j.read_text())
    d["cases"][1], d["cases"][2] = d["cases"][2], d["cases"][1]       # the same ids, out of their order
    j.write_text(json.dumps(d))
    rc, _, err = _main(capsys, "check", "--render", str(j))
    assert rc == 1 and "the cases do not add up to the selection they name" in err, err


# --- impossible --m: a resource limit named before the work, not a kernel FAIL ----------------------
def test_an_m_no_memory_can_hold_is_refused_before_the_work(capsys, no_work):
    rc, _, err = _main(capsys, "check", "--paths", "native", "--m", str(10 ** 9), "--dtype", "bf16", "--layout", "raw")
    assert rc == 2 and f"--m {10 ** 9}: case native:" in err and "GiB at once" in err, err
    # the M it says fits: at least 1, and below what the FP64 copy of x alone would fill
    m_max = int(err.split("fits M <= ")[1].split()[0])
    assert m_max >= 1, err
    if DEVICE == "cpu":       # shape a (K = 640): x alone in FP64 is 640 * 8 bytes a row
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        assert m_max <= mem // (640 * 8), err


@pytest.mark.parametrize("where,says", [("inputs", "its inputs could not be built: RuntimeError"),
                                        ("checks", "out of memory during the checks: OutOfMemoryError")])
def test_memory_that_runs_out_is_not_a_kernel_failure(where, says, tmp_path, capsys, monkeypatch):
    import torch

    def alloc(*a, **k):
        if where == "inputs":
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory")
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 7.45 TiB")
    if where == "inputs":
        monkeypatch.setattr(checks, "Inputs", alloc)
        monkeypatch.setattr(checks, "evaluate", lambda *a, **k: pytest.fail("the kernel ran without inputs"))
    else:
        monkeypatch.setattr(checks, "evaluate", alloc)
    j = tmp_path / "r.json"
    rc, out, err = _main(capsys, "check", "--case", TINY, "--json", str(j))
    text = " ".join(out.split())
    assert rc == 1 and "NOT RUN" in text and "not a kernel failure" in text and "FAIL native" not in text, text
    assert says in text
    row = json.loads(j.read_text())["cases"][0]
    assert row["ok"] is False and row["not_run"].startswith(says.split(":")[0])
    rc, _, err = _main(capsys, "check", "--render", str(j))
    assert rc == 1 and "1 case(s) not run" in err, err


# --- case ids: unknown shape labels, and every listed id runs as check --case -------------------------
@pytest.mark.parametrize("spec,says", [
    ("gemv:zz=200x640:m1:bf16:raw:normal:seed1", "shape label 'zz' is not a shape of the suite"),
    ("native:gate=34816x5120:m1:bf16:raw:normal:seed1", "shape label 'gate' is not a shape of the suite"),
    ("native:ga=64x255:m1:bf16:raw:normal:seed1", "shape 'ga' is 64x256 or 2048x2048, not 64x255"),
    ("native:t=8x128:m1:bf16:raw:normal:seed-1", "seed -1: expected 0 <= seed < 2**63"),
    (f"native:t=8x128:m1:bf16:raw:normal:seed{2 ** 64}", f"seed {2 ** 64}: expected 0 <= seed < 2**63"),
])
def test_a_case_id_that_cannot_run_as_written_is_refused(spec, says, capsys, no_work):
    with pytest.raises(ValueError) as e:
        cases.Case.parse(spec)
    assert says in str(e.value)
    rc, _, err = _main(capsys, "check", "--case", spec)
    assert rc == 2 and says in err, err


@pytest.mark.parametrize("profile", cases.PROFILES)
@pytest.mark.parametrize("key", ["interpreter", "sm90"])
def test_every_listed_case_id_runs_as_check_case(profile, key, capsys, monkeypatch, fake_engine):
    """The promise (--help, README): the ids of --list-cases PROFILE each run as `check --case ID`
    (there is no bench or selftest --case); and every one of them does."""
    rc, out, _ = _main(capsys, "--help")
    assert "every one runs as `check --case ID`" in " ".join(out.split())
    monkeypatch.setattr(backend, "golden_key", lambda: key)
    rc, out, err = _main(capsys, "--list-cases", profile)
    ids = out.split()
    assert rc == 0 and ids and ids == [c.id for c in cases.profile(profile, key)], err
    argv = [a for i in ids for a in ("--case", i)]
    rc, out, err = _main(capsys, "check", *argv)
    assert rc == 0 and fake_engine == ids, err


def test_list_cases_says_how_its_ids_run_and_refuses_what_it_ignores(capsys, no_work):
    rc, out, _ = _main(capsys, "--help")
    assert "`check --case ID`" in " ".join(out.split())
    for argv, says in ((["--list-cases", ""], "unknown profile ''"),
                       (["--list-cases", "check", "check"], "--list-cases prints and exits; it does not combine "
                                                            "with the command 'check'"),
                       (["--list-paths", "--list-cases", "check"], "does not combine with --list-cases")):
        rc, _, err = _main(capsys, *argv)
        assert rc == 2 and says in err, (argv, err)


# --- --shapes bonsai27b on the interpreter: refused unless asked for --------------------------------
@pytest.mark.skipif(DEVICE == "cuda", reason="on a GPU bonsai27b is the default")
@pytest.mark.parametrize("argv", [["--shapes", "bonsai27b"], ["--shapes", "bonsai27b", "--paths", "native", "--m", "1"],
                                  ["--derive-exact", "--shapes", "bonsai27b"]], ids=" ".join)
def test_bonsai_shapes_on_the_interpreter_need_allow_slow(argv, capsys, no_work):
    rc, _, err = _main(capsys, "check", *argv)
    assert rc == 2 and "--shapes bonsai27b on the interpreter" in err and "hours" in err and "--allow-slow" in err, err


@pytest.mark.skipif(DEVICE == "cuda", reason="on a GPU bonsai27b is the default")
def test_allow_slow_runs_them(capsys, fake_engine):
    rc, out, err = _main(capsys, "check", "--shapes", "bonsai27b", "--allow-slow", "--paths", "native", "--m", "1",
                         "--dtype", "bf16", "--layout", "raw", "--skip-selfcheck")
    assert rc == 0 and len(fake_engine) == len(cases.SHAPES["bonsai27b"]["pq2"]) and "gate_up" in fake_engine[0], err


# --- reproduce lines work from the checkout ---------------------------------------------------------
def test_reproduce_lines_are_commands_that_run_from_the_checkout(tmp_path, capsys, monkeypatch, fake_engine):
    c = cases.Case.parse(TINY)
    argv = shlex.split(c.repro())
    assert argv[:4] == ["./pq2", "check", "--case", TINY]
    assert os.access(ROOT / argv[0], os.X_OK)
    fake_engine.fail = {TINY}
    rc, out, _ = _main(capsys, "check", "--case", TINY)
    assert rc == 1 and f"reproduce: ./pq2 check --case {TINY}" in out
    # and it runs: the real command, from the checkout, without the venv on PATH
    if not (ROOT / os.environ.get("PQ2_VENV", ".venv") / ".pq2-installed").exists():
        pytest.skip("./pq2 has set up no venv in this checkout (it installs from the package index, which "
                    "this machine may not reach), so the printed command cannot run as a user runs it")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"
    p = subprocess.run([*argv, "--reruns", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "PASS: 1 of 1 cases passed" in p.stdout, p.stdout + p.stderr


# --- help -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,says", [
    (["--help"], ["verification suite", "check", "golden", "bench", "selftest", "exit codes:", "./pq2 check"]),
    (["check", "--help"], ["reference's own self-checks", "--derive-exact", "--render", "exit codes:",
                           "examples:", "./pq2 check --shard 1/2", "not one complete run"]),
], ids=lambda v: " ".join(v) if v[-1] == "--help" else "")
def test_help_describes_the_command_its_exit_codes_and_an_example(argv, says, capsys):
    rc, out, _ = _main(capsys, *argv)
    assert rc == 0
    flat = " ".join(out.split())
    for s in says:
        assert s in flat, s
    for code, meaning in outputs.EXIT_CODES.items():
        assert f"  {code:<4}{meaning}" in out, code
    assert "Each subcommand lives in its own module" not in out
