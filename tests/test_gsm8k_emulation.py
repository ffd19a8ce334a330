"""The emulation's default integer-dot GEMM (torch._int_mm), which the CPU GSM8K A/B runs on:
exact group dots, and the self-test that keeps an inexact int8 GEMM from being used."""
import numpy as np
import pytest
import torch

from kernels import emulation as E
from kernels.format import PQ2Weight

from reference import projection as ref, generate as gen


def _weight(n=96, k=640, seed=1):
    return PQ2Weight.from_raw(torch.from_numpy(gen.ternary_weight(n, k, seed)))


@pytest.fixture
def fresh_gemm(monkeypatch):
    """The GEMM choice made again in this test (and the process's own choice put back after)."""
    monkeypatch.delenv("PQ2_EMULATE_GEMM", raising=False)
    monkeypatch.setattr(E, "_GEMM", None)


@pytest.mark.parametrize("kind", ["heavy", "outliers", "ties"])
def test_int_mm_group_dots_are_exact(kind, monkeypatch):
    monkeypatch.setattr(E, "_GEMM", "int_mm")
    w = _weight()
    for m in (1, 5, 70):                               # GEMV, small M, a prefill row block
        x = gen.activations(m, 640, 6, kind=kind)
        q, _ = E.quantize_q8(x)
        d = E.group_dots(q, w).permute(1, 2, 0).numpy()            # [M, N, G]
        assert np.array_equal(d.astype(np.int64), ref.group_dots(x, w.data, layout=w.layout, n=w.n, k=w.k)), \
            f"kind={kind} M={m} seed=6"


def test_self_test_picks_int_mm_when_exact(fresh_gemm):
    assert E.gemm_kind() == "int_mm"


def test_self_test_refuses_an_int8_gemm_wrong_on_extreme_sums(fresh_gemm, monkeypatch):
    """An int8 GEMM that clips the largest sums (127 * 128 = 16256 reaches past 127 * 127) is
    not used: the self-test's all-127 rows against all-(+1) / all-(-1) weights catch it."""
    real = torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda a, b, out=None: out.copy_(real(a, b).clamp(-127 * 127, 127 * 127)))
    assert E.gemm_kind() == "fp32"


def test_fp32_forced_by_the_environment(fresh_gemm, monkeypatch):
    monkeypatch.setenv("PQ2_EMULATE_GEMM", "fp32")
    assert E.gemm_kind() == "fp32"
