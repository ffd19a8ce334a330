"""A case is resolved once and its data built in one place (pq2verify.casedata): a check run
looks each case's path up once, and the check and golden build the same inputs and FP64
references for the same case."""
from collections import Counter

import numpy as np
import pytest
import torch

from pq2verify import cases, checks, golden, registry
from pq2verify.bits import bits

# a path with an exactness claim (gemv: dots == int_gemv) and its counterpart
PATHS = ("int_gemv", "gemv")


def test_a_check_run_looks_each_case_up_once(monkeypatch, cpu_only):
    """Per case: one lookup of its own path, and one of the path its claim names where that
    path serves the case's M (the claim is checked); no stage looks either up again."""
    cs = [c for c in cases.check_cases("small", paths=list(PATHS), dtypes=["bf16"], layouts=["prepared"])
          if c.shape == "b" and c.m in (1, 2)]
    assert cs, "no case selected"
    real, seen = registry.get, Counter()

    def counting(name):
        seen[name] += 1
        return real(name)
    monkeypatch.setattr(registry, "get", counting)
    for c in cs:       # as check_cli._one runs a case: its inputs, then the checks on them
        inp = checks.Inputs(c, "cpu")
        checks.evaluate(c, "cpu", reruns=1, inp=inp)
    want = Counter(c.path for c in cs)
    for c in cs:
        other = real(c.path).bit_identical_to or real(c.path).dots_equal_to
        if other is not None and real(other).serves(c.m):
            want[other] += 1
    assert seen == want, (f"registry lookups per path {dict(seen)}, expected {dict(want)} for {len(cs)} cases; "
                          "reproduce: .venv/bin/python -m pytest -q tests/test_casedata.py -k once")


@pytest.mark.parametrize("path,layout", [("int_gemv", "prepared"), ("int_gemv", "raw"), ("native", "raw"),
                                         ("cublas", "dense")])
def test_check_and_golden_build_the_same_data(path, layout, cpu_only):
    """A golden case's x, weight and FP64 references, as the check builds them (seeded) and as
    golden capture builds them (generated on the CPU, the references from the bytes): the same
    bytes through the one builder."""
    # unit stride: a strided x is drawn through its wider buffer by the check, and strided by the run in golden
    c = max((c for c in golden.cases("interpreter", paths=[path]) if c.layout == layout and not c.strided),
            key=lambda c: (c.m, c.id))
    rc = checks.resolve(c)
    seeded = checks.Inputs(rc, "cpu")
    _, meta = golden.weight_meta(rc)
    x, w = golden.make_x(rc), golden.weight_for(rc, golden.make_weight(meta), "cpu")
    given = checks.CaseData.given(rc, x, w)
    assert type(seeded) is type(given) is checks.CaseData
    assert torch.equal(bits(seeded.x), bits(x)), f"{c.id}: x differs"
    if rc.dense:
        assert torch.equal(bits(seeded.w), bits(w)), f"{c.id}: the dense weight differs"
    else:
        assert (seeded.w.layout, seeded.w.n, seeded.w.k) == (w.layout, w.n, w.k)
        assert torch.equal(seeded.w.data, w.data), f"{c.id}: the weight bytes differ"
    assert torch.equal(seeded.rows, torch.arange(c.n)), "a golden shape is small: every row is referenced"
    for which in ("quantized", "dense") + (() if rc.dense else ("dots",)):
        a = seeded.group_dots() if which == "dots" else seeded.reference(which)
        b = given.group_dots() if which == "dots" else given.reference(which)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b) and a.tobytes() == b.tobytes(), (
            f"{c.id}: the {which} reference differs; reproduce: .venv/bin/python -m pytest -q "
            f"tests/test_casedata.py -k same_data")
