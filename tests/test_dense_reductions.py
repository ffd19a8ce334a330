"""The cublas path (and the emulation of it) asks torch.matmul for FP32 reductions: torch's
default lets cuBLAS reduce split-K partials in bf16/fp16, outside the FP32-accumulation bound."""
import pytest
import torch

from kernels import cublas, emulation

MM = torch.backends.cuda.matmul


def _switches():
    return MM.allow_bf16_reduced_precision_reduction, MM.allow_fp16_reduced_precision_reduction


def _set(bf16, fp16):
    MM.allow_bf16_reduced_precision_reduction, MM.allow_fp16_reduced_precision_reduction = bf16, fp16


@pytest.fixture(autouse=True)
def keep_switches():
    """torch's switches as they were (the module's attributes are not monkeypatch's to undo)."""
    keep = _switches()
    yield
    _set(*keep)


@pytest.fixture
def seen(monkeypatch):
    """torch.matmul recording the two reduction switches at each call."""
    log = []
    real = torch.matmul

    def matmul(a, b):
        log.append((MM.allow_bf16_reduced_precision_reduction, MM.allow_fp16_reduced_precision_reduction))
        return real(a, b)
    monkeypatch.setattr(torch, "matmul", matmul)
    return log


def _xw(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(5)
    return torch.randn(3, 256, generator=g).to(dtype), torch.randn(4, 256, generator=g).to(dtype)


@pytest.mark.parametrize("before", [(True, True), (False, True), (True, False)])
def test_the_product_runs_with_fp32_reductions_and_restores_the_switches(seen, before):
    _set(*before)
    x, w = _xw()
    y = cublas.product(x, w)
    assert seen == [(False, False)]
    assert _switches() == before
    assert torch.equal(y, x @ w.t())


def test_the_switches_come_back_when_the_product_raises():
    _set(True, True)
    x, w = _xw()
    with pytest.raises(RuntimeError):
        cublas.product(x, w[:, :128])       # K mismatch: torch refuses
    assert _switches() == (True, True)


def test_the_path_and_its_emulation_both_reduce_in_fp32(seen):
    x, w = _xw(torch.float16)
    cublas.run(x, w, check=False)
    emulation.dense("cublas", x, w)
    assert seen == [(False, False), (False, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["cublas:t=3x640:m3262:bf16:dense:normal:seed68607",
                                  "cublas:t=3x640:m3283:bf16:dense:normal:strided:seed68607"])
def test_a_narrow_long_gemm_keeps_its_fp32_bound_on_the_gpu(case):
    """The GPU fuzzer's case (and its shrunk form) that cuBLAS's bf16 split-K reduction took
    outside the per-element bound: with FP32 reductions it passes every check."""
    from pq2verify import cases, checks
    r = checks.evaluate(cases.Case.parse(case), "cuda")
    assert r.ok, r.message()
