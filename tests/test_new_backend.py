"""A backend with no records of its own (an RTX 3090 or A4000, sm_86): no exactness record, so
the exact set is the legacy set, and no golden capture, so golden verify has nothing to verify.
Every command says so on stderr before it starts, every report carries it, and golden verify
fails with the first steps. The backend key is faked as 'sm86' (on the CPU or a GPU), and the
record and capture folders point at a temporary folder, so a real sm86 record added to the
checkout later changes nothing here.

Reproduce: .venv/bin/python -m pytest -p no:randomly -q tests/test_new_backend.py
"""
import argparse
import json
import shutil

import pytest

from kernels import backend, dispatch, sets as kernelsets
from pq2verify.report import html as html_report
from pq2verify import backend_status, cli, golden, inputs, registry

REPRO = ".venv/bin/python -m pytest -p no:randomly -q tests/test_new_backend.py"
FAKE = "sm86"
REAL_RECORD = kernelsets.VERIFIED_DIR / "exact-interpreter.json"
CASE = "native:a=200x640:m1:bf16:raw:heavy:seed50142"
# the documented first steps, written out here rather than read from the function under test
STEPS = ["./pq2 --device cuda check --derive-exact --record",
         "./pq2 --device cuda golden capture",
         "./pq2 --device cuda golden capture --model",
         "git add pq2verify/verified/exact-sm86.json golden/sm86 && git commit -m 'sm86: exactness record and "
         "golden captures'"]


DEVICE = backend.device()      # the fake key works on either; the real interpreter's CLI on the CPU only


@pytest.fixture
def folders(tmp_path, monkeypatch):
    """Empty record and capture folders, in place of the checkout's."""
    v, g = tmp_path / "verified", tmp_path / "golden"
    v.mkdir()
    g.mkdir()
    monkeypatch.setattr(kernelsets, "VERIFIED_DIR", v)
    monkeypatch.setattr(golden.store, "GOLDEN", g)
    kernelsets.clear_cache()
    yield v, g
    kernelsets.clear_cache()


@pytest.fixture
def fake(folders, monkeypatch):
    """This process's backend reads as sm86: backend.key, golden_key and dispatch.backend_key."""
    monkeypatch.setattr(backend, "key", lambda dev=None: FAKE)
    monkeypatch.setattr(backend, "golden_key", lambda: FAKE)
    monkeypatch.setattr(dispatch, "backend_key", lambda device: FAKE)
    dispatch.clear_cache()      # resolve's cache is keyed by device, not by backend key
    yield folders
    dispatch.clear_cache()


def _run(capsys, *argv):
    rc = cli.main(["--device", DEVICE, *argv])
    c = capsys.readouterr()
    return rc, c.out, c.err


def _says_the_steps(text: str) -> bool:
    return all(s in text for s in STEPS[:3]) and "git add" in text


# --- what is missing ----------------------------------------------------------------------------
def test_the_status_names_the_record_the_captures_and_the_steps(fake):
    v, g = fake
    st = backend_status.status()
    assert st["key"] == FAKE
    assert [m["item"] for m in st["missing"]] == ["exactness record", "golden capture", "model capture"], \
        f"{st['missing']}; reproduce: {REPRO} -k status_names"
    assert [m["path"] for m in st["missing"]] == [str(v / "exact-sm86.json"), str(g / FAKE), str(g / FAKE / "model")]
    assert st["exact_equals_legacy"] and st["exact_proven"] == []
    assert st["steps"] == STEPS
    w = backend_status.warning(st)
    assert "the exact set equals legacy on sm86" in w and "golden verify has nothing to verify" in w
    assert all(f"{i}. {s}" in w for i, s in enumerate(STEPS, 1))


def test_exact_equals_legacy_on_the_fake_backend(fake):
    shutil.copy(REAL_RECORD, fake[0] / REAL_RECORD.name)     # the interpreter keeps its own record
    names = lambda kset, key: [p.name for p in kernelsets.members(kset, key)]   # noqa: E731
    assert names("exact", FAKE) == names("legacy", FAKE)
    # the key is what decides: the interpreter's own record puts tuned paths in its exact set
    assert set(names("exact", "interpreter")) - set(names("legacy", "interpreter")), \
        f"the interpreter's record proves no tuned path; reproduce: {REPRO} -k exact_equals_legacy"
    # and a call at M = 17, which the legacy set gives to mmq (the registry's M ranges)
    w = inputs.ternary_weight(64, 256, seed=1, device=DEVICE)
    x = inputs.activations(17, 256, seed=2, device=DEVICE)
    served = {}
    for kset in ("legacy", "exact"):
        with dispatch.trace() as t:
            dispatch.pq2_matmul(x, w, kernels=kset)
        served[kset] = dict(t)
    assert served == {"legacy": {"mmq": 1}, "exact": {"mmq": 1}}, f"{served}; reproduce: {REPRO} -k exact_equals"
    assert "the exact set equals legacy" in backend_status.warning(backend_status.status())


# --- every command says so, before it starts --------------------------------------------------------
def _stubbed_parser(ran):
    """The real parser with every command's work replaced by a note that it ran."""
    ap = _real_build_parser()

    def stub(p):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sp in a.choices.values():
                    sp.set_defaults(func=lambda args: ran.append(args.command) or 0)
                    stub(sp)
    stub(ap)
    return ap


_real_build_parser = cli.build_parser
COMMANDS = {"golden": ["golden", "verify"]}


def _commands():
    for a in _real_build_parser()._actions:
        if isinstance(a, argparse._SubParsersAction):
            return sorted(a.choices)
    return []


@pytest.mark.parametrize("command", _commands())
def test_every_command_warns_once_on_stderr(fake, capsys, monkeypatch, command):
    ran = []
    monkeypatch.setattr(cli, "build_parser", lambda: _stubbed_parser(ran))
    rc, out, err = _run(capsys, *COMMANDS.get(command, [command]))
    assert rc == 0 and ran == [command], (rc, ran, err)
    assert err.count("WARNING") == 1 and "WARNING" not in out, \
        f"{command}: stderr {err!r}; reproduce: {REPRO} -k 'every_command and {command}'"
    assert "no exactness record" in err and "no golden capture" in err and _says_the_steps(err)


def test_the_interpreter_has_its_records():
    kernelsets.clear_cache()
    st = backend_status.status("interpreter")
    assert st["missing"] == [], (f"{st['missing']}: re-derive or recapture (./pq2 --device cpu check --derive-exact "
                                 f"--record; ./pq2 --device cpu golden capture); reproduce: {REPRO} -k interpreter_has")


@pytest.mark.parametrize("command", _commands())
def test_no_warning_on_the_interpreter(capsys, monkeypatch, command):
    """The real interpreter backend, its record and capture the checkout's own."""
    if DEVICE != "cpu":
        pytest.skip("the interpreter's own commands run in a CPU session; test_no_warning_with_records runs here")
    ran = []
    monkeypatch.setattr(cli, "build_parser", lambda: _stubbed_parser(ran))
    rc, out, err = _run(capsys, *COMMANDS.get(command, [command]))
    assert rc == 0 and ran == [command] and "WARNING" not in err + out, err


def _records(v, g):
    shutil.copy(REAL_RECORD, v / "exact-sm86.json")     # proofs name paths and sources, not backends
    (g / FAKE / "model").mkdir(parents=True)
    (g / FAKE / golden.MANIFEST).write_text("{}")
    (g / FAKE / "model" / golden.MANIFEST).write_text("{}")
    kernelsets.clear_cache()


@pytest.mark.parametrize("command", _commands())
def test_no_warning_with_records(fake, capsys, monkeypatch, command):
    _records(*fake)
    ran = []
    monkeypatch.setattr(cli, "build_parser", lambda: _stubbed_parser(ran))
    rc, out, err = _run(capsys, *COMMANDS.get(command, [command]))
    assert rc == 0 and ran == [command] and "WARNING" not in err + out, err


def test_a_record_and_captures_present_silence_it(fake, capsys):
    """The fake key with a record (the interpreter's proofs, which name no backend) and captures."""
    _records(*fake)
    st = backend_status.status()
    assert st["missing"] == [] and not st["exact_equals_legacy"] and st["exact_proven"]
    assert backend_status.warning(st) is None and backend_status.line(st) is None


# --- a record that holds nothing proven ---------------------------------------------------------------
def _record(v, entries):
    (v / "exact-sm86.json").write_text(json.dumps({"format": kernelsets.FORMAT, "paths": entries}))
    kernelsets.clear_cache()


def _entry(name, rule, current=True):
    p = registry.get(name)
    return {"format": kernelsets.FORMAT, "counterpart": p.counterpart, "rule": rule,
            "sources": kernelsets.sources_digest(name, p.counterpart) if current else "0" * 16}


TUNED = [p.name for p in registry.paths(kset="tuned") if p.counterpart]


def test_a_record_of_stale_or_unproven_entries_holds_nothing(fake):
    v, _ = fake
    # every tuned path proven, but from other kernel sources; one unproven
    _record(v, {n: _entry(n, "proven", current=False) for n in TUNED[1:]} | {TUNED[0]: _entry(TUNED[0], "unproven")})
    st = backend_status.status()
    assert st["missing"][0]["item"] == "exactness proofs" and st["exact_equals_legacy"]
    assert "holds nothing proven" in st["missing"][0]["detail"] and "equals legacy" in st["missing"][0]["detail"]
    assert st["steps"][0] == STEPS[0]
    assert [p.name for p in kernelsets.members("exact", FAKE)] == [p.name for p in kernelsets.members("legacy", FAKE)]


def test_a_record_of_current_refutations_is_a_result_not_a_gap(fake):
    v, _ = fake
    _record(v, {n: _entry(n, "refuted") for n in TUNED})
    st = backend_status.status()
    assert [m["item"] for m in st["missing"]] == ["golden capture", "model capture"]
    assert st["exact_equals_legacy"]       # proven so: re-deriving would not change it


def test_one_current_proof_and_one_stale_names_the_stale_one(fake):
    v, _ = fake
    _record(v, {"mmq_wgmma": _entry("mmq_wgmma", "proven"), "gemv": _entry("gemv", "proven", current=False)})
    st = backend_status.status()
    m = st["missing"][0]
    assert m["item"] == "current proofs" and "gemv" in m["detail"] and not st["exact_equals_legacy"]
    assert st["exact_proven"] == ["mmq_wgmma"]


# --- the reports carry it -------------------------------------------------------------------------
def test_check_json_markdown_and_html_carry_it(fake, capsys, tmp_path):
    j, md, ht = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "r.html"
    rc, out, err = _run(capsys, "check", "--case", CASE, "--skip-selfcheck", "--reruns", "1",
                        "--json", str(j), "--markdown", str(md), "--html", str(ht))
    assert rc == 0, out + err
    assert err.count("WARNING: backend sm86") == 1 and "WARNING" not in out
    st = json.loads(j.read_text())["provenance"]["backend_status"]
    assert st["key"] == FAKE and [m["item"] for m in st["missing"]] == ["exactness record", "golden capture",
                                                                           "model capture"]
    assert st["steps"] == STEPS
    line = [x for x in md.read_text().splitlines() if "WARNING" in x]
    assert len(line) == 1 and "no exactness record" in line[0] and STEPS[0] in line[0]
    assert ht.read_text().count('<p class="warn">WARNING: backend sm86') == 1
    # a --render elsewhere shows the run's backend, not the renderer's, once for two runs of it
    j2, out2, ht2 = tmp_path / "r2.json", tmp_path / "again.md", tmp_path / "again.html"
    shutil.copy(j, j2)
    assert cli.main(["--device", DEVICE, "check", "--render", str(j), str(j2), "--markdown", str(out2),
                     "--html", str(ht2)]) == 1                          # no self-checks: not green
    assert out2.read_text().count("WARNING: backend sm86") == 1
    assert ht2.read_text().count('<p class="warn">WARNING: backend sm86') == 1
    assert "WARNING" not in capsys.readouterr().err


def test_golden_verify_fails_with_the_steps_and_its_json_says_so(fake, capsys, tmp_path):
    j, ht = tmp_path / "g.json", tmp_path / "g.html"
    rc, out, err = _run(capsys, "golden", "verify", "--json", str(j), "--html", str(ht))
    assert rc == 1, f"nothing to verify passed; reproduce: {REPRO} -k golden_verify_fails"
    assert "FAIL: no golden capture for backend 'sm86'" in out and "nothing was verified" in out
    assert _says_the_steps(out.replace("\n", " ")) or _says_the_steps(out), out
    d = json.loads(j.read_text())
    assert d["ok"] is False and d["verified"] == 0 and "no golden capture" in d["error"]
    assert "golden capture" in [m["item"] for m in d["provenance"]["backend_status"]["missing"]]
    assert '<p class="warn">WARNING: backend sm86' in ht.read_text() and "verdict-fail" in ht.read_text()


def test_golden_verify_model_fails_with_the_steps(fake, capsys):
    rc, out, err = _run(capsys, "golden", "verify", "--model")
    assert rc == 1 and "nothing was verified" in out and STEPS[2] in out, out


def test_html_meta_shows_the_status_as_one_line_and_hides_the_record():
    st = {"key": FAKE, "missing": [{"item": "golden capture", "path": "golden/sm86", "detail": "no golden capture"}],
          "steps": STEPS}
    page = html_report.meta({"commit": "abc", "backend_status": st})
    assert page.count('class="warn"') == 1 and "'missing'" not in page and "commit: abc" in page
    assert 'class="warn"' not in html_report.meta({"commit": "abc", "backend_status": {**st, "missing": []}})


def test_the_doc_gives_the_steps():
    doc = (kernelsets._ROOT / backend_status.DOC).read_text()
    for s in ("./pq2 --device cuda check --derive-exact --record", "./pq2 --device cuda golden capture",
              "./pq2 --device cuda golden capture --model", "git add pq2verify/verified/exact-<key>.json golden/<key>"):
        assert s in doc, f"{backend_status.DOC} lacks {s!r}; reproduce: {REPRO} -k doc"
    assert "NEW_BACKEND.md" in (kernelsets._ROOT / "docs" / "ADDING_A_PATH.md").read_text()


# --- the other reports: bench, selftest, GSM8K, replay -------------------------------------------
def _one_warning_line(md: str) -> str:
    lines = [x for x in md.splitlines() if "WARNING: backend sm86" in x]
    assert len(lines) == 1, md[:2000]
    assert "no exactness record" in lines[0] and STEPS[0] in lines[0] and STEPS[1] in lines[0]
    assert html_report.from_markdown(md).count('<p class="warn">WARNING: backend sm86') == 1
    return lines[0]


def test_bench_report_carries_it(fake, tmp_path, capsys):
    from pq2verify.bench import report as bench_report
    j = tmp_path / "b.json"
    rc, out, err = _run(capsys, "bench", "--dry-run", "--quick", "--shapes", "out", "--json", str(j))
    assert rc == 0 and err.count("WARNING: backend sm86") == 1, out + err
    res = json.loads(j.read_text())
    # the dry run's fake machine has a provenance of its own; a real run's is provenance.collect()
    res["header"]["provenance"]["backend_status"] = backend_status.status()
    _one_warning_line(bench_report.markdown(res, None))
    del res["header"]["provenance"]["backend_status"]
    assert "WARNING" not in bench_report.markdown(res, None)


def test_selftest_report_and_json_carry_it(fake):
    from pq2verify import selftest
    _one_warning_line(selftest.markdown([]))
    assert selftest.to_json([], DEVICE)["provenance"]["backend_status"]["key"] == FAKE


def test_gsm8k_report_carries_it(fake):
    from pq2verify.gsm8k import report
    c = report.compare({}, {})
    rep = {"a": {"label": "A legacy"}, "b": {"label": "B tuned"},
           "model": {"id": "m", "digits": 4, "ternary": False, "rel_rms": 0.1, "max_rel_rms": 0.2},
           "data": {"source": "s", "n": 0, "format": "chat", "shots": 2, "max_new_tokens": 8, "batch_size": 1},
           "backend": FAKE, "runs": [], "compare": c, "control": None, "floor": None, "teacher": None,
           "verdict": None, "backend_status": backend_status.status(FAKE)}
    _one_warning_line(report.markdown(rep))
    assert "WARNING" not in report.markdown({**rep, "backend_status": {**rep["backend_status"], "missing": []}})


def test_replay_report_and_json_carry_it(tmp_path, tmp_path_factory, capsys, monkeypatch, folders):
    """The real interpreter replay (its emulation backend), told that its backend lacks records."""
    import test_replay as tr
    st = backend_status.status(FAKE)
    d = tr._capture(tmp_path_factory, DEVICE, tr.H_INTERP)
    tr._isolate(monkeypatch, DEVICE, tr.H_INTERP)
    monkeypatch.setattr(backend_status, "status", lambda key=None: st)
    md, j = tmp_path / "r.md", tmp_path / "r.json"
    rc, out, err = _run(capsys, "replay", "--capture", str(d), "--m", "1", "--markdown", str(md), "--json", str(j))
    assert rc == 0, out + err
    assert err.count("WARNING: backend sm86") == 1
    _one_warning_line(md.read_text())
    assert json.loads(j.read_text())["provenance"]["backend_status"] == st
