"""`check --derive-exact`: which tuned paths are bit-identical to their counterparts is measured,
written with provenance, and decides the `exact` set; a broken bit-identity claim fails."""
import importlib
import json
import re

import pytest
import torch
from rich.console import Console

from pq2verify import cases, derive, dispatch, kernelsets, registry

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
    assert "mmq_planes verified too, but deselected" in text


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
    assert "FAIL mmq_planes claims bit-identity to mmq but it does not hold: pq2verify check --case" in text
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
    assert kernelsets.verified_exact(key) == {n for n, r in d["paths"].items() if r["held"]}
