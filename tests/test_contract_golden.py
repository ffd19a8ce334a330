"""The bad-input contract of `golden capture` and `golden verify` (issue 24), table-driven: no
output on another output or an input, a failed write after the work is exit 3 with the verdict
kept, an empty value is a usage error, a run that verified nothing never passes, an option a mode
cannot honour is refused, a folder that is not there is called a folder, and every failure line
carries a reproduction that runs from the checkout. Each refusal comes before any work (no_work)."""
import json
import os
import shlex
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

from kernels import backend
from pq2verify import cli, golden, golden_cli, golden_model, outputs, provenance

pytestmark = [pytest.mark.golden]

DEVICE = backend.device()
KEY = backend.golden_key()
DEV = "cpu" if KEY == "interpreter" else "cuda"
COMMITTED = golden.default_dir(KEY)


@pytest.fixture(autouse=True)
def _runner(run_cli):
    global _in_process
    _in_process = run_cli


def _cli(capsys, *argv):
    """(exit code, stdout, stderr) of an in-process `./pq2 --device DEVICE golden ARGV`."""
    return _in_process(["--device", DEVICE, "golden", *argv])


@pytest.fixture
def no_work(monkeypatch):
    """Every entry into golden's work raises: a refusal must come before any of it."""
    def refuse(*a, **k):
        raise AssertionError("work started before the bad input was refused")
    for name in ("capture", "verify", "verify_entry"):
        monkeypatch.setattr(golden, name, refuse)
    for name in ("capture_model", "verify_model"):
        monkeypatch.setattr(golden_model, name, refuse)
    monkeypatch.setattr(golden_cli, "_importable", refuse)


@pytest.fixture
def capture(tmp_path):
    """A copy of this backend's committed capture (the folder a --dir names)."""
    if not (COMMITTED / golden.MANIFEST).exists():
        assert KEY not in golden.COMMITTED, f"the committed capture {COMMITTED} is missing"
        pytest.skip(f"no capture is committed for {KEY}")
    d = tmp_path / KEY
    shutil.copytree(COMMITTED, d, ignore=shutil.ignore_patterns("model"))
    return d


def _plant_one_ulp(d, path="mmq"):
    """One case of `path` whose last output element is moved by one ulp, every hash re-signed
    (a bad recapture): only recomputing finds it. Returns the case id."""
    cid = _one_id(d, path)
    t = load_file(str(d / f"{path}.safetensors"))
    t[cid].view(-1).view(torch.int16)[-1] += 1
    save_file(t, str(d / f"{path}.safetensors"))
    man = json.loads((d / golden.MANIFEST).read_text())
    man["files"][f"{path}.safetensors"] = golden.sha256_file(d / f"{path}.safetensors")
    next(e for e in man["cases"] if e["id"] == cid)["y_sha256"] = golden.tensor_sha256(t[cid])
    (d / golden.MANIFEST).write_text(json.dumps(man))
    return cid


def _one_id(d, path="single"):
    man = json.loads((d / golden.MANIFEST).read_text())
    return next(e["id"] for e in man["cases"] if e["path"] == path)


# --- 1. outputs on an input or on each other ------------------------------------------------------
COLLISIONS = [
    (["--json", "{cap}/manifest.json"], "--json {cap}/manifest.json: inside the input folder --dir {cap}"),
    (["--html", "{cap}/single.safetensors"], "--html {cap}/single.safetensors: inside the input folder --dir"),
    (["--json", "{cap}/new.json"], "inside the input folder --dir {cap}"),
    (["--json", "{tmp}/r", "--html", "{tmp}/r"], "--html {tmp}/r: the same file as --json"),
    (["--json", "{tmp}/r", "--html", "{tmp}/./r"], "the same file as --json"),
    (["--json", "{tmp}/other/r.json"], "--json {tmp}/other/r.json: inside the golden capture {tmp}/other"),
    (["--html", "{tmp}/other/deep/r.html"], "inside the golden capture {tmp}/other"),
    (["--json", ""], "--json: empty path"),
    (["--html", ""], "--html: empty path"),
]


@pytest.mark.parametrize("argv,says", COLLISIONS, ids=[" ".join(a) for a, _ in COLLISIONS])
def test_verify_outputs_on_an_input_or_each_other_are_refused(argv, says, capture, tmp_path, capsys, no_work):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / golden.MANIFEST).write_text("{}")        # another capture folder
    before = {f.name: f.read_bytes() for f in capture.iterdir()}
    fill = lambda s: s.format(cap=capture, tmp=tmp_path)       # noqa: E731
    rc, out, err = _cli(capsys, "verify", "--dir", str(capture), *map(fill, argv))
    assert rc == 2 and fill(says) in err, err
    assert {f.name: f.read_bytes() for f in capture.iterdir()} == before       # the capture untouched


def test_verify_json_into_the_default_capture_is_refused(capsys, no_work):
    rc, out, err = _cli(capsys, "verify", "--json", str(COMMITTED / "manifest.json"))
    assert rc == 2 and "manifest.json: inside the input folder --dir" in err, err


# --- 2. a failed write after the work: exit 3, the verdict printed first, the others written ------
WRITES = [
    (["--json", "/dev/full"], ["--json /dev/full"], []),
    (["--html", "/dev/full"], ["--html /dev/full"], []),
    (["--json", "/dev/full", "--html", "{tmp}/r.html"], ["--json /dev/full"], ["r.html"]),
    (["--html", "/dev/full", "--json", "{tmp}/r.json"], ["--html /dev/full"], ["r.json"]),
]


@pytest.mark.parametrize("argv,failed,written", WRITES, ids=[" ".join(a) for a, _, _ in WRITES])
def test_a_write_that_fails_after_the_work_is_exit_3_and_keeps_the_verdict(argv, failed, written, tmp_path, capsys,
                                                                          monkeypatch):
    # /dev/full passes a probe made before the work on some systems (a full disk always does): let
    # it through the check, so the write itself fails
    monkeypatch.setattr(outputs, "_probe_device", lambda p, opt: None)
    argv = [a.format(tmp=tmp_path) for a in argv]
    rc, out, err = _cli(capsys, "verify", "--case", _one_id(COMMITTED), *argv)
    assert rc == outputs.EXIT_WRITE == 3, out + err
    assert "PASS: 1 of 1 golden cases" in out                        # the verdict, before the write
    assert all(f"{f}: could not write: No space left on device" in err for f in failed), err
    assert "Traceback" not in out + err
    for name in written:
        text = (tmp_path / name).read_text()
        assert ('"ok": true' in text) if name.endswith(".json") else ("golden" in text)


def test_json_records_the_verdict_and_how_to_reproduce(capture, tmp_path, capsys):
    cid = _plant_one_ulp(capture)
    rc, out, err = _cli(capsys, "verify", "--dir", str(capture), "--case", cid, "--json", str(tmp_path / "r.json"))
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rc == 1 and rep["ok"] is False and rep["complete"] is True and rep["failed"] == rep["verified"] == 1
    assert rep["outcomes"][0]["reproduce"] == golden.repro(KEY, cid, capture)


# --- 3. empty values are usage errors, never 'everything' ---------------------------------------
EMPTY = [
    ("verify", ["--paths", ""], "argument --paths: expected comma-separated names, got ''"),
    ("verify", ["--paths", ","], "argument --paths: expected comma-separated names, got ','"),
    ("verify", ["--paths", "single,"], "argument --paths: expected comma-separated names, got 'single,'"),
    ("verify", ["--paths", "single,single"], "argument --paths: single given twice in 'single,single'"),
    ("verify", ["--kernels", ""], "argument --kernels: expected a value, got an empty string"),
    ("verify", ["--kernels", " "], "argument --kernels: expected a value"),
    ("verify", ["--dir", ""], "argument --dir: expected a value"),
    ("verify", ["--case", ""], "argument --case: expected a value"),
    ("capture", ["--paths", ""], "argument --paths: expected comma-separated names, got ''"),
    ("capture", ["--kernels", ""], "argument --kernels: expected a value"),
    ("capture", ["--dir", ""], "argument --dir: expected a value"),
    ("capture", ["--out", " "], "argument --dir/--out: expected a value"),
]


@pytest.mark.parametrize("mode,argv,says", EMPTY, ids=[f"{m} {' '.join(a)!r}" for m, a, _ in EMPTY])
def test_an_empty_value_is_a_usage_error(mode, argv, says, capsys, no_work):
    rc, out, err = _cli(capsys, mode, *argv)
    assert rc == 2 and says.replace("argument --dir:", "argument --dir/--out:") in err, err


# --- 4. a run that verified nothing is not a pass; options a mode cannot honour are refused -------
UNHONOURED = [
    ("verify", ["--dir", "{tmp}/typo", "--allow-missing"], "--allow-missing: refused"),
    ("verify", ["--allow-missing"], "a run that verified nothing is a failure"),
    ("verify", ["--model", "--paths", "single"], "--paths: not honoured with --model"),
    ("verify", ["--model", "--kernels", "tuned"], "--kernels: not honoured with --model"),
    ("verify", ["--model", "--case", "x"], "--case: not honoured with --model"),
    ("verify", ["--model", "--json", "{tmp}/r.json"], "--json: not honoured with --model"),
    ("verify", ["--model", "--html", "{tmp}/r.html"], "--html: not honoured with --model"),
    ("capture", ["--model", "--paths", "single"], "--paths: not honoured with --model"),
    ("capture", ["--model", "--force"], "--force: not honoured with --model"),
]


@pytest.mark.parametrize("mode,argv,says", UNHONOURED, ids=[f"{m} {' '.join(a)}" for m, a, _ in UNHONOURED])
def test_an_option_the_mode_cannot_honour_is_a_usage_error(mode, argv, says, tmp_path, capsys, no_work):
    rc, out, err = _cli(capsys, mode, *[a.format(tmp=tmp_path) for a in argv])
    assert rc == 2 and says in err, out + err


def test_a_selection_that_verifies_nothing_fails(capture, capsys, monkeypatch):
    monkeypatch.setattr(golden, "verify", lambda *a, **k: [])
    rc, out, err = _cli(capsys, "verify", "--dir", str(capture))
    assert rc == 1 and "FAIL: no golden case was verified" in out


def test_a_missing_default_capture_fails_saying_nothing_was_verified(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(golden.store, "default_dir", lambda key=None: tmp_path / (key or KEY))
    rc, out, err = _cli(capsys, "verify")
    assert rc == 1 and "nothing was verified" in out and "SKIP" not in out
    assert f"reproduce: ./pq2 --device {DEV} golden verify" in out


# --- 5. a folder that is not there is a folder, with what exists ----------------------------------
def test_verify_dir_that_does_not_exist_says_so_and_lists_the_captures(tmp_path, capsys, no_work):
    d = tmp_path / "golden" / "interprter"
    rc, out, err = _cli(capsys, "verify", "--dir", str(d))
    assert rc == 2 and f"--dir {d}: no such folder" in err, err
    assert "backend 'interprter'" not in err                          # a folder, not a backend
    listed = sorted(m.parent.relative_to(provenance.ROOT).as_posix()
                    for m in provenance.ROOT.glob(f"golden/**/{golden.MANIFEST}"))
    assert f"Captures in this checkout: {', '.join(listed)}" in err
    assert f"--device {DEV} golden capture --dir {d}" in err          # this machine's device, not another
    if DEV == "cpu":
        assert "--device cuda" not in err


@pytest.mark.parametrize("what,make,says", [
    ("an empty folder", lambda d: d.mkdir(), "holds no manifest.json, so it is not a golden capture"),
    ("a file", lambda d: d.write_text("x"), "not a folder"),
])
def test_verify_dir_that_is_not_a_capture(what, make, says, tmp_path, capsys, no_work):
    d = tmp_path / "c"
    make(d)
    rc, out, err = _cli(capsys, "verify", "--dir", str(d))
    assert rc == 2 and f"--dir {d}" in err and says in err, err


def test_verify_model_dir_missing_advises_the_model_capture(tmp_path, capsys, no_work):
    rc, out, err = _cli(capsys, "verify", "--model", "--dir", str(tmp_path / "x"))
    assert rc == 2 and f"{tmp_path / 'x' / 'model'}: no such folder" in err
    assert f"golden capture --model --dir {tmp_path / 'x'}" in err
    with pytest.raises(golden.NoCapture, match=r"golden capture --model --dir"):
        golden.load(tmp_path / "y", kind="model")     # what replay --capture can ask for


# --- 6. capture: unwritable, colliding or foreign folders ---------------------------------------
def _foreign(tmp_path):
    d = tmp_path / "other"
    d.mkdir()
    (d / golden.MANIFEST).write_text(json.dumps({"format": 2, "backend_key": "sm_nope", "cases": [], "files": {}}))
    return d


def _cluttered(tmp_path):
    d = tmp_path / "notes"
    d.mkdir()
    (d / "todo.txt").write_text("keep me")
    return d


def _a_file(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    return f


CAPTURE_DIRS = [
    (_foreign, "holds the capture of backend 'sm_nope'"),
    (lambda t: _foreign(t) / "sub", "inside the golden capture"),
    (_cluttered, "holds files and no manifest.json; a capture needs a new or empty folder"),
    (_a_file, "is not a directory"),
    (lambda t: _a_file(t) / "sub", "is not a directory"),
]


@pytest.mark.parametrize("make,says", CAPTURE_DIRS, ids=["foreign", "inside a capture", "cluttered", "a file",
                                                         "under a file"])
def test_capture_into_a_folder_it_must_not_write_is_refused(make, says, tmp_path, capsys, no_work):
    d = make(tmp_path)
    before = {f.name: f.read_bytes() for f in d.iterdir()} if d.is_dir() else None
    rc, out, err = _cli(capsys, "capture", "--paths", "single", "--dir", str(d))
    assert rc == 2 and says in err, err
    assert before is None or {f.name: f.read_bytes() for f in d.iterdir()} == before


def test_capture_into_a_new_folder_works_and_verifies(tmp_path, capsys):
    d = tmp_path / "new" / KEY
    rc, out, err = _cli(capsys, "capture", "--paths", "single", "--dir", str(d))
    assert rc == 0 and "captured:" in out, out + err
    rc, out, err = _cli(capsys, "verify", "--paths", "single", "--dir", str(d))
    assert rc == 0 and "PASS:" in out, out + err


# --- 7. reproductions that work from the checkout; --list-cases ids work as --case ---------------
def test_list_cases_ids_are_accepted_by_verify_case(capsys, monkeypatch):
    assert cli.main(["--device", DEVICE, "--list-cases", "golden"]) == 0
    ids = capsys.readouterr().out.split()
    assert ids and len(ids) == len(set(ids))
    g = golden.load(COMMITTED)
    known = golden_cli.known_ids(g, KEY, [p.name for p in golden.select_paths()])
    assert [i for i in ids if i not in known] == []
    seen = []
    monkeypatch.setattr(golden, "verify", lambda g, dev, *, paths=None, ids=None, **k: seen.append(ids) or [])
    rc, out, err = _cli(capsys, "verify", *(a for i in ids for a in ("--case", i)))
    assert rc == 1 and "no golden case was verified" in out and seen == [ids]   # accepted: none refused


def test_a_case_outside_the_selection_is_named_as_such(capsys, no_work):
    rc, out, err = _cli(capsys, "verify", "--paths", "single", "--case", _one_id(COMMITTED, "mmq"))
    assert rc == 2 and "outside the selected paths" in err and "--list-cases golden" in err


def test_every_failure_line_has_a_reproduction_that_works_from_the_checkout(capture, tmp_path, capsys):
    """One output element of one case changed and re-signed: the FAIL line's reproduction, run
    as printed from the repository root in a fresh process, reproduces the failure."""
    cid = _plant_one_ulp(capture)
    rc, out, err = _cli(capsys, "verify", "--dir", str(capture), "--paths", "mmq")
    assert rc == 1 and f"FAIL {cid}: different" in out
    lines = [ln.split("reproduce: ", 1)[1] for ln in out.splitlines() if "reproduce: " in ln]
    assert lines == [f"./pq2 --device {DEV} golden verify --dir {capture} --case '{cid}'"]
    if not (provenance.ROOT / os.environ.get("PQ2_VENV", ".venv") / ".pq2-installed").exists():
        pytest.skip("./pq2 has set up no venv in this checkout (it installs from the package index, which "
                    "this machine may not reach), so the printed command cannot run as a user runs it")
    r = subprocess.run(shlex.split(lines[0]), cwd=provenance.ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and f"FAIL {cid}: different" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    assert "FAIL: 0 of 1 golden cases" in r.stdout


def test_a_refused_capture_fails_with_its_reproduction(tmp_path, capsys, monkeypatch):
    from pq2verify import registry

    def broken(self):
        def run(x, w, *, out=None, dots=None):
            raise NotImplementedError("not here")
        return run
    monkeypatch.setattr(registry.Path, "kernel", broken)
    monkeypatch.setattr(golden_cli, "_importable", lambda names: (list(names), []))
    d = tmp_path / KEY
    rc, out, err = _cli(capsys, "capture", "--paths", "single", "--dir", str(d))
    assert rc == 1 and "REFUSED single:" in out and "raised NotImplementedError: not here" in out
    assert f"reproduce: ./pq2 --device {DEV} golden capture --paths single --dir {d}" in out
    assert "captured: 0 cases of no path" in out


# --- a damaged manifest is an integrity error naming what is wrong, never a traceback -------------
MANIFESTS = [
    ("[1]", "format None, this pq2verify reads formats"),
    ("not json", "not valid JSON"),
    ('{"format": 2}', "no 'backend_key' (str) in the manifest"),
    ('{"format": 2, "backend_key": "K"}', "no 'files' (dict) in the manifest"),
    ('{"format": 2, "backend_key": "K", "files": {}, "cases": [], "paths": {}}', "no 'weights' (dict)"),
    ('{"format": 2, "backend_key": "K", "files": {}, "paths": {}, "weights": {}, "cases": [{"id": "x"}]}',
     "case 0 (x) lacks file, x, weight, y_sha256, path"),
    ('{"format": 2, "backend_key": "K", "files": {}, "paths": {}, "weights": {}, "cases": [3]}', "case 0 (3) lacks"),
]


@pytest.mark.parametrize("text,says", MANIFESTS, ids=[t[:40] for t, _ in MANIFESTS])
def test_a_damaged_manifest_is_an_integrity_error(text, says, tmp_path, capsys):
    d = tmp_path / "c"
    d.mkdir()
    (d / golden.MANIFEST).write_text(text.replace('"K"', json.dumps(KEY)))
    rc, out, err = _cli(capsys, "verify", "--dir", str(d))
    assert rc == 1 and "ERROR (integrity)" in out and says in out, out + err
    assert "Traceback" not in out + err and f"reproduce: ./pq2 --device {DEV} golden verify --dir {d}" in out


def _model_manifest(d):
    d.mkdir(parents=True)
    (d / golden.MANIFEST).write_text(json.dumps({"format": 2, "kind": "model", "backend_key": KEY, "files": {},
                                                 "cases": [], "records": []}))


def test_a_capture_of_the_other_kind_is_refused(capture, tmp_path, capsys, no_work):
    _model_manifest(tmp_path / "m" / "model")
    rc, out, err = _cli(capsys, "verify", "--dir", str(tmp_path / "m" / "model"))
    assert rc == 2 and f"holds a model capture; verify it with --model --dir {tmp_path / 'm'}" in err, out + err
    shutil.copytree(capture, tmp_path / "c" / "model")
    rc, out, err = _cli(capsys, "verify", "--model", "--dir", str(tmp_path / "c"))
    assert rc == 2 and "holds a capture of cases, not of the model" in err, out + err
    rc, out, err = _cli(capsys, "capture", "--model", "--dir", str(_foreign(tmp_path)))
    assert rc == 2 and "its model/ must be that backend's" in err, out + err


def test_recapturing_a_path_keeps_the_manifests_case_order(tmp_path, capsys):
    # a capture of two paths, then the first again with the same bits: the case list stays, and
    # a path new to the capture comes after the kept ones
    d = tmp_path / KEY

    def ids():
        return [e["id"] for e in json.loads((d / "manifest.json").read_text())["cases"]]
    assert _cli(capsys, "capture", "--paths", "single,native", "--dir", str(d))[0] == 0
    first = ids()
    assert {i.split(":")[0] for i in first} == {"single", "native"}
    head = first[0].split(":")[0]
    assert _cli(capsys, "capture", "--paths", head, "--dir", str(d))[0] == 0
    assert ids() == first
    assert _cli(capsys, "capture", "--paths", "int_gemv", "--dir", str(d))[0] == 0
    now = ids()
    assert now[:len(first)] == first and {i.split(":")[0] for i in now[len(first):]} == {"int_gemv"}
