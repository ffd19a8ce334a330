"""Numerics checks generated from the registry: every check of the engine (checks.evaluate)
runs per path. Each (path, shape, M, dtype, layout) case gets rms (relative RMS and the
per-element bound), exact (group dots and the exactness claim) and, thinned on the
interpreter to one case per (path, M), determinism, batch invariance, NaN propagation and the
declared fold; the written and guard-band checks ride on every call. Small shapes under the
interpreter on the CPU; the Bonsai-27B shapes of SPEC §6 on a GPU."""
import os

import pytest

from kernels import backend
from pq2verify import checks, registry

DEVICE = backend.select(os.environ.get("PQ2_DEVICE", "auto")) if backend._chosen is None else backend.device()
SHAPES = "bonsai27b" if DEVICE == "cuda" else "small"
CASES = checks.cases(SHAPES)
# Reruns, the batch, NaN and fold calls cost a launch or more each: on the interpreter one case
# per (path, M) is enough to cover every split-K geometry; the GPU runs every case.
THIN = CASES if DEVICE == "cuda" else list({(c.path, c.m): c for c in CASES}.values())
CHECKS = {"rms": pytest.mark.rms, "exact": pytest.mark.exact, "determinism": pytest.mark.determinism,
          "batch": pytest.mark.batch, "nan": pytest.mark.nan, "fold": pytest.mark.fold}
# the checks that run on every case; the others on THIN
EVERY_CASE = ("rms", "exact")


def applies(check: str, c) -> bool:
    """Whether evaluate judges anything for `check` on `c` (a test that judges nothing is not
    generated, so none passes vacuously)."""
    p = registry.get(c.path)
    if check == "determinism":
        return p.deterministic
    if check == "batch":
        return p.batch_invariant and c.m >= 2
    if check == "fold":
        return p.arithmetic == "integer" and p.weight == "pq2" and DEVICE == "cpu"
    return True


# the Result field each thinned check sets: None after the call means it judged nothing
JUDGED = {"determinism": "deterministic", "batch": "batch_invariant", "nan": "nan_exact", "fold": "fold_exact"}


def _params():
    thin = set(THIN)
    for c in sorted(CASES, key=lambda c: (c.n, c.k, c.m, c.dtype, c.kind, c.strided, c.path, c.layout)):
        for check, mark in CHECKS.items():
            if (check in EVERY_CASE or c in thin) and applies(check, c):
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
    if check in JUDGED:
        assert getattr(r, JUDGED[check]) is not None, f"{check} judged nothing on {case.id}"

