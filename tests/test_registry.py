"""The registry's own contract: every entry names a kernel with the common signature, a
reason for its tolerance, and claims that point at real paths it can be compared with."""
import inspect

import pytest
import torch

from pq2verify import registry


@pytest.mark.parametrize("p", registry.PATHS, ids=lambda p: p.name)
def test_entry_is_complete(p):
    params = inspect.signature(p.kernel()).parameters
    assert {"x", "w", "out", "dots", "check"} <= set(params), f"{p.module}.run signature"
    assert p.kset in ("legacy", "tuned") and p.tol_reason and p.description
    assert p.m_min >= 1 and (p.m_max is None or p.m_max >= p.m_min)
    for other in (p.bit_identical_to, p.dots_equal_to, p.counterpart):
        if other is not None:
            q = registry.get(other)
            assert q.weight == p.weight and q.name != p.name
    if p.counterpart:
        assert registry.get(p.counterpart).kset == "legacy"
    if p.dots_equal_to:
        assert p.has_dots and registry.get(p.dots_equal_to).has_dots
    for dt in p.dtypes:
        assert 0 < p.tolerance(dt, "quantized") <= p.tolerance(dt, "dense") <= registry.Q8_BUDGET


def test_every_m_has_a_legacy_path():
    for weight in ("pq2", "dense"):
        for m in (1, 2, 16, 17, 4096):
            assert any(p.serves(m) for p in registry.paths(kset="legacy", weight=weight))


def test_tolerance_is_the_output_rounding_bound():
    p = registry.get("int_gemv")
    assert p.tolerance(torch.bfloat16, "quantized") == pytest.approx(2 ** -8 + 1e-5)
    assert p.tolerance(torch.float16, "quantized") == pytest.approx(2 ** -11 + 1e-5)
    assert p.tolerance(torch.bfloat16, "dense") == registry.Q8_BUDGET
    assert registry.get("native").tolerance(torch.bfloat16, "dense") == pytest.approx(2 ** -8 + 1e-5)
