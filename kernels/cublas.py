"""cublas: the legacy dense path, torch.matmul (cuBLAS on CUDA) on an unquantized matrix; the
baseline the dense tuned path (small_gemm) replaces."""
import contextlib

import torch

from kernels import config as protocol, validate


def config(n: int, k: int, m: int, interpret: bool | None = None) -> dict:
    """{}: the library picks its own kernels; nothing here can be forced."""
    return {}


def configs(interpret: bool) -> list[dict]:
    """The one config: none."""
    return [{}]


def fold(n: int, k: int, m: int, interpret: bool | None = None, config: dict | None = None):
    """None: the library's own order (the emulation calls torch.matmul too)."""
    protocol.force("cublas", {}, config, {})
    return None


def run(x, w, *, out=None, dots=None, check=True, config=None):
    protocol.force("cublas", {}, config, {})
    if check:  # the M range, dtypes, layout and buffers; pq2_matmul validated already
        validate.kernel_args(__name__, x, w, out, dots)
    y = product(x, w)
    if out is not None:
        out.copy_(y)
        return out
    return y


def product(x, w):
    """x @ w.T by torch.matmul with FP32 reductions: torch lets cuBLAS reduce split-K partials
    in bf16/fp16 by default, which the FP32-accumulation bound does not cover (a narrow N, long
    M case fails it on sm_90). The switch is read at each call, so it holds in a graph too."""
    with _fp32_reductions():
        return torch.matmul(x, w.t())


@contextlib.contextmanager
def _fp32_reductions():
    mm = torch.backends.cuda.matmul
    keep = mm.allow_bf16_reduced_precision_reduction, mm.allow_fp16_reduced_precision_reduction
    mm.allow_bf16_reduced_precision_reduction = mm.allow_fp16_reduced_precision_reduction = False
    try:
        yield
    finally:
        mm.allow_bf16_reduced_precision_reduction, mm.allow_fp16_reduced_precision_reduction = keep
