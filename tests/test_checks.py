"""The check engine itself: each check fails on a deliberately broken kernel, with a message
that carries the one-line reproduction, and the CLI exits non-zero."""
import json
import importlib

import pytest
import torch

from pq2verify import checks, cli

CASE = checks.cases("small", paths=["int_gemv"], ms=[3], dtypes=["bf16"], layouts=["prepared"])[0]


@pytest.fixture
def broken(monkeypatch):
    """Replace int_gemv's run with `make(real_run)`."""
    mod = importlib.import_module("kernels.int_gemv")
    real = mod.run

    def install(make):
        monkeypatch.setattr(mod, "run", make(real))
    return install


def test_case_id_round_trips():
    for c in checks.cases("small")[:40]:
        assert checks.Case.parse(c.id) == c


def test_bad_case_spec_is_a_clear_error():
    with pytest.raises(ValueError, match="expected path:shape=NxK"):
        checks.Case.parse("int_gemv:nonsense")
    with pytest.raises(ValueError, match="unknown path 'gemv'"):
        checks.Case.parse(CASE.id.replace("int_gemv", "gemv"))


def test_correct_kernel_passes(device):
    r = checks.evaluate(CASE, device)
    assert r.ok, r.message()
    assert r.dots_exact and r.deterministic and r.written


def test_wrong_values_fail_rms_with_a_reproduction(broken, device):
    def make(real):
        def run(x, w, *, out=None, dots=None, check=True):
            y = real(x, w, out=out, dots=dots, check=check)
            return y.mul_(1.01)
        return run
    broken(make)
    r = checks.evaluate(CASE, device, checks=("rms",))
    assert not r.ok
    assert "relative RMS vs quantized FP64 reference" in r.message()
    assert f"reproduce: pq2verify check --case {CASE.id}" in r.message()
    assert f"seed: {CASE.seed}" in r.message()


def test_unwritten_row_fails(broken, device):
    def make(real):
        def run(x, w, *, out=None, dots=None, check=True):
            y = real(x, w, out=None, dots=dots, check=check)
            out[1:].copy_(y[1:])          # row 0 never written: still NaN
            return out
        return run
    broken(make)
    r = checks.evaluate(CASE, device, checks=("rms",))
    assert "output not written: NaN left in 1 of 3 rows" in r.message()


def test_wrong_group_dot_fails_exact(broken, device):
    def make(real):
        def run(x, w, *, out=None, dots=None, check=True):
            y = real(x, w, out=out, dots=dots, check=check)
            if dots is not None:
                dots[0, 0, 0] += 1
            return y
        return run
    broken(make)
    r = checks.evaluate(CASE, device, checks=("exact",))
    assert "integer group dots differ from the exact reference (first at m=0, n=0, group 0" in r.message()


def test_nondeterministic_kernel_fails(broken, device):
    calls = []

    def make(real):
        def run(x, w, *, out=None, dots=None, check=True):
            y = real(x, w, out=out, dots=dots, check=check)
            calls.append(1)
            if len(calls) == 4:           # one rerun in five flips one value
                y.view(torch.int16)[0, 0] ^= 1
            return y
        return run
    broken(make)
    r = checks.evaluate(CASE, device, checks=("determinism",))
    assert r.deterministic is False and "not deterministic" in r.message()


def test_broken_claim_fails(device, monkeypatch):
    c = checks.cases("small", paths=["mmq_planes"], ms=[17], dtypes=["bf16"], layouts=["prepared"])[0]
    mod = importlib.import_module("kernels.mmq")
    real = mod.run

    def run(x, w, *, out=None, dots=None, check=True):
        y = real(x, w, out=out, dots=dots, check=check)
        y.view(torch.int16)[0, 0] ^= 1          # one ulp off in one element
        return y
    monkeypatch.setattr(mod, "run", run)
    r = checks.evaluate(c, device, checks=("exact",))
    assert r.claim == "bytes == mmq" and r.claim_held is False
    assert "exactness claim 'bytes == mmq' does not hold" in r.message()


def test_cli_exit_codes_and_reproduction_line(broken, capsys):
    assert cli.main(["check", "--case", CASE.id, "--reruns", "1"]) == 0
    assert "PASS: 1 of 1 cases passed" in capsys.readouterr().out

    def make(real):
        def run(x, w, *, out=None, dots=None, check=True):
            return real(x, w, out=out, dots=dots, check=check).mul_(1.05)
        return run
    broken(make)
    assert cli.main(["check", "--case", CASE.id, "--reruns", "1"]) == 1
    text = capsys.readouterr().out
    assert f"reproduce: pq2verify check --case {CASE.id}" in text and "FAIL: 0 of 1 cases passed" in text


def test_render_saved_results(tmp_path, capsys):
    js = tmp_path / "check.json"
    assert cli.main(["check", "--case", CASE.id, "--reruns", "1", "--json", str(js)]) == 0
    md = tmp_path / "check.md"
    assert cli.main(["check", "--render", str(js), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "**1 of 1 cases passed.**" in text and "| int_gemv |" in text
    assert "| int_gemv | 1 | 1 |" in text                  # the per-path summary row
    # the same case in two runs (a rerun after a cut-off): shown once, from the later run
    d = json.loads(js.read_text())
    d["cases"][0]["ok"], d["cases"][0]["failures"] = False, ["made up for this test"]
    js2 = tmp_path / "earlier.json"
    js2.write_text(json.dumps(d))
    assert cli.main(["check", "--render", str(js2), str(js), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "**1 of 1 cases passed.**" in text and "1 case(s) ran in more than one" in text
    assert cli.main(["check", "--render", str(js), str(js2), "--markdown", str(md)]) == 1
