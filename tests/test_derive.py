"""`check --derive-exact`: which tuned paths are bit-identical to their counterparts is measured,
written with provenance, and decides the `exact` set; a broken bit-identity claim fails."""
import importlib
import json

import pytest
import torch
from rich.console import Console

from pq2verify import checks, derive, dispatch

pytestmark = pytest.mark.exact


@pytest.fixture
def few_cases(monkeypatch, tmp_path):
    """Two cases per tuned path, and a throwaway verified/ folder (the committed one stays)."""
    real = checks.cases
    monkeypatch.setattr(checks, "cases", lambda shapes, paths=None, **kw: real(shapes, paths=paths, **kw)[:2])
    monkeypatch.setattr(dispatch, "VERIFIED_DIR", tmp_path)
    dispatch.clear_cache()
    yield tmp_path
    dispatch.clear_cache()


def _derive(device):
    con = Console(record=True, width=200)
    rc = derive.derive_exact("small", device, con)
    return rc, " ".join(con.export_text().split())


def test_derive_records_with_provenance_and_sets_exact(device, few_cases):
    rc, text = _derive(device)
    assert rc == 0, text
    key = dispatch.backend_key(torch.device(device))
    f = few_cases / f"exact-{key}.json"
    d = json.loads(f.read_text())
    for k in ("date", "commit", "backend", "torch", "triton"):
        assert d["provenance"].get(k), k
    assert set(d["paths"]) == {"single", "small_mma", "mmq_planes", "small_gemm"}
    assert d["paths"]["mmq_planes"]["held"] and d["paths"]["mmq_planes"]["claimed"]
    held = {n for n, r in d["paths"].items() if r["held"]}
    assert dispatch.verified_exact(key) == held
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
    assert "mmq_planes" not in dispatch.verified_exact(key)
