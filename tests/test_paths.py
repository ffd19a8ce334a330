"""Numerics checks generated from the registry: each (path, shape, M, dtype, layout) case gets
an rms, an exact and a determinism test. Small shapes under the interpreter on the CPU; the
Bonsai-27B shapes of SPEC §6 on a GPU."""
import os

import pytest

from pq2verify import backend, checks

DEVICE = backend.select(os.environ.get("PQ2_DEVICE", "auto")) if backend._chosen is None else backend.device()
SHAPES = "bonsai27b" if DEVICE == "cuda" else "small"
CASES = checks.cases(SHAPES)
# Determinism reruns cost 5 launches each: on the interpreter one case per (path, M) is enough
# to cover every split-K geometry; the GPU reruns every case.
DET_CASES = CASES if DEVICE == "cuda" else list({(c.path, c.m): c for c in CASES}.values())
CHECKS = {"rms": pytest.mark.rms, "exact": pytest.mark.exact, "determinism": pytest.mark.determinism}


def _params():
    det = set(DET_CASES)
    for c in sorted(CASES, key=lambda c: (c.n, c.k, c.m, c.dtype, c.kind, c.strided, c.path, c.layout)):
        for check, mark in CHECKS.items():
            if check == "determinism" and c not in det:
                continue
            yield pytest.param(c, check, marks=mark, id=f"{check}-{c.id}")


_last = {}


def _inputs(c, device):
    # consecutive params share one case: build its inputs once
    if _last.get("case") != c:
        _last.clear()
        _last.update(case=c, inp=checks.Inputs(c, device))
    return _last["inp"]


@pytest.mark.parametrize("case,check", list(_params()))
def test_path(case, check, device):
    r = checks.evaluate(case, device, checks=(check,), inp=_inputs(case, device))
    assert r.ok, r.message()
