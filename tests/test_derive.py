"""`check --derive-exact`: which tuned paths are bit-identical to their counterparts is measured,
written with provenance, and decides the `exact` set; a broken bit-identity claim fails."""
import importlib
import json
import re

import pytest
import torch
from rich.console import Console

from kernels import dispatch, sets as kernelsets
from pq2verify import cases, derive, registry

pytestmark = pytest.mark.exact


@pytest.fixture
def few_cases(monkeypatch, tmp_path):
    """Two cases per tuned path, and a throwaway verified/ folder (the committed one stays)."""
    real = cases.check_cases
    monkeypatch.setattr(cases, "check_cases", lambda shapes, paths=None, **kw: real(shapes, paths=paths, **kw)[:2])
    monkeypatch.setattr(kernelsets, "VERIFIED_DIR", tmp_path)
    dispatch.clear_cache()
    yield tmp_path
    dispatch.clear_cache()


def _derive(device, **kw):
    con = Console(record=True, width=200)
    rc = derive.derive_exact("small", device, con, **{"record": True, **kw})
    return rc, " ".join(con.export_text().split())


def test_derive_records_with_provenance_and_sets_exact(device, few_cases):
    rc, text = _derive(device)
    assert rc == 0, text
    key = dispatch.backend_key(torch.device(device))
    f = few_cases / f"exact-{key}.json"
    d = json.loads(f.read_text())
    for k in ("date", "commit", "backend", "torch", "triton"):
        assert d["provenance"].get(k), k
    assert set(d["paths"]) == {p.name for p in registry.PATHS if p.counterpart}
    assert d["paths"]["mmq_planes"]["held"] and d["paths"]["mmq_planes"]["claimed"]
    held = {n for n, r in d["paths"].items() if r["held"]}
    assert kernelsets.verified_exact(key) == held
    exact = [p.name for p in dispatch.candidates("exact", "pq2", key)]
    tuned_used = [n for n in exact if n in held]
    assert exact[len(tuned_used):] == ["int_gemv", "mmq", "native"]      # legacy after the verified
    assert "mmq_planes proven too, but deselected" in text


def test_a_broken_bit_identity_claim_fails_derive(device, few_cases, monkeypatch):
    mod = importlib.import_module("kernels.mmq_planes")
    real = mod.run

    def run(x, w, *, out=None, dots=None, check=True):
        y = real(x, w, out=out, dots=dots, check=check)
        y.view(torch.int16)[-1, -1] ^= 1          # one ulp off in one element
        return y
    monkeypatch.setattr(mod, "run", run)
    rc, text = _derive(device)
    assert rc == 1
    assert re.search(r"FAIL mmq_planes claims bit-identity to mmq but it does not hold: \S+ check --case mmq_planes:", text), text
    key = dispatch.backend_key(torch.device(device))
    assert "mmq_planes" not in kernelsets.verified_exact(key)


def test_derive_honours_paths_and_records_only_when_asked(device, few_cases, capsys, tmp_path):
    """`check --derive-exact --paths single` tests single alone and leaves the record alone."""
    from pq2verify import cli
    out = tmp_path / "verdict.json"
    rc = cli.main(["--device", device, "check", "--derive-exact", "--paths", "single", "--json", str(out)])
    text = " ".join(capsys.readouterr().out.split())
    assert rc == 0, text
    # how many of the two are bit-identical is the backend's answer (all on the interpreter)
    assert re.search(r"single vs int_gemv: [012]/2 cases", text) and "small_mma vs" not in text
    assert "not recorded" in text and "--record writes it" in text
    assert not list(few_cases.glob("exact-*.json")), "derive without --record wrote the record"
    assert set(json.loads(out.read_text())["paths"]) == {"single"}


def test_derive_record_with_paths_replaces_only_those_entries(device, few_cases):
    key = dispatch.backend_key(torch.device(device))
    f = few_cases / f"exact-{key}.json"
    old_prov = {"date": "2026-01-01T00:00:00", "commit": "0ld"}
    old = {n: {"counterpart": "x", "cases": 9, "identical": 9, "held": True, "first_difference": None,
               "claimed": False} for n in ("single", "small_mma", "mmq_planes", "small_gemm")}
    old["single"]["held"] = False
    f.write_text(json.dumps({"provenance": old_prov, "shapes": "bonsai27b", "paths": old}))
    rc, text = _derive(device, paths=["single"])
    assert rc == 0, text
    d = json.loads(f.read_text())
    assert list(d["paths"]) == ["single", "small_mma", "mmq_planes", "small_gemm"]
    assert d["paths"]["single"]["cases"] == 2 and d["paths"]["single"]["counterpart"] == "int_gemv"
    assert "provenance" not in d["paths"]["single"] and d["provenance"]["commit"] != "0ld"
    for n in ("small_mma", "mmq_planes", "small_gemm"):   # kept, with the provenance they came with
        assert d["paths"][n] == {"provenance": old_prov, "shapes": "bonsai27b", **old[n]}
    # the kept entries are of the old format (no rule): never trusted, whatever 'held' says
    assert kernelsets.verified_exact(key) == set() and d["paths"]["single"]["rule"] == "refuted"


# --- the proof rule (issue 23, class 2): exactness is proven, not sampled -----------------------

from kernels.dispatch import pq2_matmul  # noqa: E402
from pq2verify import adversarial  # noqa: E402
from pq2verify.bits import bits  # noqa: E402

DT = {"bf16": torch.bfloat16, "fp16": torch.float16}
CANCEL = [(k, m, dt) for k in (384, 640) for m in (1, 2) for dt in ("bf16", "fp16")]


def _sequential(k: int, m: int, dtype: str) -> torch.Tensor:
    """The construction's outputs folded as int_gemv declares (groups ascending from 0.0 in
    FP32, one rounding to the dtype), from the terms it was built with: c * sign * ws, times
    2^row (numpy float32, independent of the kernels)."""
    import numpy as np
    spec = adversarial.rows(k // 128)
    y = np.zeros((m, len(spec)), dtype=np.float32)
    for r, (fam, sign, pos) in enumerate(spec):
        terms = dict(zip(pos, adversarial.FAMILIES[fam]))
        for i in range(m):
            acc = np.float32(0.0)
            for g in range(k // 128):
                c, s, ws = terms.get(g, (0, 1, 1.0))
                acc = np.float32(acc + np.float32(c * s * sign * ws * 2.0 ** i))
            y[i, r] = acc
    return torch.from_numpy(y).to(DT[dtype])


def test_cancelling_groups_tell_int_gemv_from_the_tuned_paths_and_exact_is_legacy(device):
    """M = 1 and 2, K = 384 and 640, bf16 and fp16, every order of the cancelling groups: some
    tuned path differs from int_gemv, yet kernels='exact' gives legacy's bytes on every one (the
    old record routed M = 1 to single and M = 2 to small_mma, whose folds differ). The
    construction is checked first: int_gemv gives exactly the sequential fold of the designed
    terms, where the cancel rows give 0 or the tiny term by order alone and the tie rows land on
    a bf16/fp16 tie (rounded to even) or past it."""
    differ = []
    for k, m, dt in CANCEL:
        w, x = adversarial.weight(k, device), adversarial.activations(m, k, DT[dt], device)
        y = registry.get("int_gemv").kernel()(x, w)
        ref, want = bits(y), _sequential(k, m, dt)
        assert torch.equal(ref.cpu(), bits(want)), \
            f"reproduce: python -m pq2verify.adversarial --paths int_gemv,mmq --k {k} --m {m} --dtype {dt}"
        vals = {float(v) for v in want[0]}
        tie = {"bf16": {2.0 ** 14, 2.0 ** 14 + 128}, "fp16": {4096.0, 4100.0}}[dt]
        assert {0.0, 2.0 ** -14} | tie <= vals, (k, m, dt, sorted(vals))
        for name in ("single", "gemv", "small_mma"):
            if registry.get(name).serves(m) and not torch.equal(bits(registry.get(name).kernel()(x, w)), ref):
                differ.append((name, k, m, dt))
        dispatch.clear_cache()
        legacy = bits(pq2_matmul(x, w, kernels="legacy"))
        exact = bits(pq2_matmul(x, w, kernels="exact"))
        assert torch.equal(exact, legacy), (
            f"kernels='exact' differs from legacy on the cancelling groups (K={k} M={m} {dt}): reproduce: "
            f"{adversarial.command('single' if m == 1 else 'small_mma', 'int_gemv', k, m, dt, torch.device(device).type)}")
    assert differ, "no tuned path differed from int_gemv on the cancelling groups"


@pytest.mark.parametrize("name", ["single", "small_mma"])
def test_derivation_refutes_single_and_small_mma(device, few_cases, name):
    p = registry.get(name)
    key = dispatch.backend_key(torch.device(device))
    r = derive.derive_path(p, registry.get("int_gemv"), "small", device, key, Console(width=200))
    assert r["rule"] == "refuted" and r["basis"].startswith("refuted: ") and not r["held"], r["basis"]
    if r["refutation"] is not None:           # found by construction (sampled cases can refute first)
        cmd = r["refutation"]["command"].split()
        assert cmd[:3] == ["python", "-m", "pq2verify.adversarial"] and cmd[cmd.index("--paths") + 1] == f"{name},int_gemv"
        from pq2verify import adversarial as adv
        assert adv.main(cmd[3:]) == 1, r["refutation"]["command"]


def test_equal_dots_and_equal_fold_order_is_proven(device, few_cases):
    key = dispatch.backend_key(torch.device(device))
    r = derive.derive_path(registry.get("mmq_planes"), registry.get("mmq"), "small", device, key, Console(width=200))
    assert r["rule"] == "proven" and r["held"], r["basis"]
    assert r["basis"].startswith("proven: equal dots (2/2 cases; declared dots_equal_to mmq) and fold order "
                                 '{"groups_per_split": "G", "lanes": 1, "splits": 1}'), r["basis"]
    assert r["folds"]["differ"] == 0 and r["folds"]["points"] > 100 and r["refutation"] is None
    assert r["sources"] == kernelsets.sources_digest("mmq_planes", "mmq")


def _fold_as(monkeypatch, name, fn):
    monkeypatch.setattr(importlib.import_module(registry.get(name).module), "fold", fn)
    kernelsets.clear_cache()


def test_differing_fold_order_is_not_proven(device, few_cases, monkeypatch):
    """mmq_planes declaring one split per group: a different fold (equal in value to mmq's, so
    no construction tells them apart): unproven, not held, though every case is identical."""
    _fold_as(monkeypatch, "mmq_planes", lambda n, k, m, interpret=None, config=None:
             dict(groups_per_split=1, lanes=1, splits=k // 128))
    key = dispatch.backend_key(torch.device(device))
    r = derive.derive_path(registry.get("mmq_planes"), registry.get("mmq"), "small", device, key, Console(width=200))
    kernelsets.clear_cache()
    assert r["identical"] == r["cases"] == 2 and r["dots"]["equal"] == 2
    assert r["rule"] == "unproven" and not r["held"], r["basis"]
    assert "declared fold orders differ" in r["basis"] and "no constructed input told them apart" in r["basis"]


def test_differing_dots_are_refuted(device, few_cases, monkeypatch):
    mod = importlib.import_module("kernels.mmq_planes")
    real = mod.run

    def run(x, w, *, out=None, dots=None, check=True):
        y = real(x, w, out=out, dots=dots, check=check)
        if dots is not None:
            dots[0, 0, 0] += 1
        return y
    monkeypatch.setattr(mod, "run", run)
    key = dispatch.backend_key(torch.device(device))
    r = derive.derive_path(registry.get("mmq_planes"), registry.get("mmq"), "small", device, key, Console(width=200))
    assert r["rule"] == "refuted" and r["basis"].startswith("refuted: integer group dots differ on ./pq2 check --case")


def _entry(name, **kw):
    p = registry.get(name)
    return {"format": kernelsets.FORMAT, "counterpart": p.counterpart, "rule": "proven", "basis": "proven: test",
            "held": True, "sources": kernelsets.sources_digest(name, p.counterpart), **kw}


def test_only_proven_current_entries_are_trusted(few_cases):
    """Old-format entries (no rule), other rules, another counterpart, another format and a
    digest of other kernel sources are never held, whatever their 'held' says."""
    old = {"counterpart": "int_gemv", "cases": 8, "identical": 8, "held": True, "first_difference": None,
           "claimed": False}
    paths = {"single": old, "small_mma": _entry("small_mma", rule="refuted"),
             "gemv": _entry("gemv", rule="unproven"), "mmq_planes": _entry("mmq_planes", counterpart="int_gemv"),
             "small_gemm": _entry("small_gemm", format=1), "mmq_wgmma": _entry("mmq_wgmma")}
    f = few_cases / "exact-interpreter.json"
    f.write_text(json.dumps({"paths": paths}))
    assert kernelsets.verified_exact("interpreter") == {"mmq_wgmma"}
    assert kernelsets.verified_exact("emulate") == {"mmq_wgmma"}           # the emulation reads it too
    paths["mmq_wgmma"] = _entry("mmq_wgmma", sources="0123456789abcdef")   # derived from other sources
    f.write_text(json.dumps({"paths": paths}) + " ")
    assert kernelsets.verified_exact("interpreter") == set()
    f.write_text(json.dumps({"paths": {"single": old, "small_mma": dict(old)}}))
    assert [p.name for p in kernelsets.members("exact", "interpreter", weight="pq2")] == ["int_gemv", "mmq", "native"]


def test_exact_routes_a_proven_path_only_where_its_fold_matches(few_cases, monkeypatch):
    """A proven entry for single still serves an M = 1 call only where single's declared fold
    for that (n, k, m) on this backend is int_gemv's (dispatch checks per call, cached)."""
    (few_cases / "exact-interpreter.json").write_text(json.dumps({"paths": {"single": _entry("single")}}))
    w = __import__("pq2verify.inputs", fromlist=["x"]).ternary_weight(8, 384, seed=1)
    x = torch.zeros(1, 384, dtype=torch.bfloat16)
    assert dispatch.resolve(1, w, x, "exact").name == "int_gemv"        # single's lanes differ
    for interpret in (True, False):
        assert not kernelsets.same_fold("single", "int_gemv", 8, 384, 1, interpret)
    _fold_as(monkeypatch, "single", lambda n, k, m, interpret=None, config=None:
             dict(groups_per_split=k // 128, lanes=1, splits=1) if k == 384 else dict(groups_per_split=1, lanes=2, splits=k // 128))
    dispatch.clear_cache()
    assert dispatch.resolve(1, w, x, "exact").name == "single"
    w2 = __import__("pq2verify.inputs", fromlist=["x"]).ternary_weight(8, 640, seed=1)
    assert dispatch.resolve(1, w2, torch.zeros(1, 640, dtype=torch.bfloat16), "exact").name == "int_gemv"
    kernelsets.clear_cache()


def test_committed_interpreter_record_routes_nothing_unproven():
    """The committed interpreter record (read by the emulation too): every entry has a rule and
    its basis; single and small_mma are refuted; exact on the interpreter serves M = 1 and 2
    with int_gemv."""
    d = json.loads((kernelsets.VERIFIED_DIR / "exact-interpreter.json").read_text())
    for name, r in d["paths"].items():
        assert r["rule"] in ("proven", "refuted", "unproven") and r["basis"].startswith(r["rule"]), name
        assert r["held"] == (r["rule"] == "proven"), name
    for name in ("single", "small_mma", "gemv"):
        assert d["paths"][name]["rule"] == "refuted", d["paths"][name]["basis"]
    assert kernelsets.verified_exact("interpreter") <= {"mmq_planes", "mmq_wgmma"}
    for n, k in ((200, 640), (64, 384), (8, 128)):
        for m in (1, 2, 16):
            got = kernelsets.members("exact", "interpreter", weight="pq2", shape=(n, k, m))
            assert [p.name for p in got if p.serves(m)][0] == "int_gemv", (n, k, m)


def test_committed_sm90_record_claims_nothing_unproven():
    d = json.loads((kernelsets.VERIFIED_DIR / "exact-sm90.json").read_text())
    for name, r in d["paths"].items():
        assert r.get("format") == kernelsets.FORMAT and r["rule"] in ("proven", "refuted", "unproven"), name
        assert r["basis"].startswith(r["rule"]) and r["held"] == (r["rule"] == "proven"), name
    assert not {"single", "small_mma", "gemv", "small_gemm"} & kernelsets.verified_exact("sm90")


def test_emulate_reads_the_interpreter_record_with_the_gpu_folds(few_cases, monkeypatch):
    """The emulation computes each path's fold with the GPU's configs (emulation.kernel_plan), so
    on 'emulate' the interpreter record's proven entry serves a call only where the GPU-config
    folds match; on the cancelling groups its exact set gives legacy's bytes."""
    from kernels import backend
    (few_cases / "exact-interpreter.json").write_text(json.dumps({"paths": {"single": _entry("single")}}))
    _fold_as(monkeypatch, "single", lambda n, k, m, interpret=None, config=None:
             dict(groups_per_split=k // 128, lanes=1 if interpret else 2, splits=1))
    shape = (8, 384, 1)
    assert [p.name for p in kernelsets.members("exact", "interpreter", weight="pq2", shape=shape)][0] == "single"
    assert [p.name for p in kernelsets.members("exact", "emulate", weight="pq2", shape=shape)][0] == "int_gemv"
    monkeypatch.undo()
    kernelsets.clear_cache()
    monkeypatch.setattr(kernelsets, "VERIFIED_DIR", kernelsets._ROOT / "pq2verify" / "verified")
    with backend.using_cpu_backend("emulate"):
        for k, m, dt in CANCEL + [(640, 17, "bf16")]:
            w, x = adversarial.weight(k), adversarial.activations(m, k, DT[dt])
            dispatch.clear_cache()
            with dispatch.trace() as t:
                exact = bits(pq2_matmul(x, w, kernels="exact"))
            assert torch.equal(exact, bits(pq2_matmul(x, w, kernels="legacy"))), \
                f"emulate: exact differs from legacy: {adversarial.command('single', 'int_gemv', k, m, dt)}"
            assert set(t) <= {"int_gemv", "mmq", "mmq_wgmma"}, dict(t)
    dispatch.clear_cache()


@pytest.mark.gpu
def test_gpu_derivation_proves_mmq_wgmma_and_refutes_the_decode_paths(device, few_cases):
    """On the GPU: mmq_wgmma (Gluon on sm_90) is proven from its fold and its dots; the decode
    paths whose GPU-config folds differ from int_gemv's are refuted by a construction.
    Run: ./pq2 test --device cuda -k test_gpu_derivation tests/test_derive.py"""
    key = dispatch.backend_key(torch.device(device))
    con = Console(width=200)
    r = derive.derive_path(registry.get("mmq_wgmma"), registry.get("mmq"), "bonsai27b", device, key, con)
    assert r["rule"] == "proven" and r["dots"]["cases"] > 0, r["basis"]
    for name in ("gemv", "single", "small_mma"):
        r = derive.derive_path(registry.get(name), registry.get("int_gemv"), "bonsai27b", device, key, con)
        assert r["rule"] == "refuted" and r["refutation"] is not None, (name, r["basis"])
