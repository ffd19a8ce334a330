"""cublas: the legacy dense path, torch.matmul (cuBLAS on CUDA) on an unquantized matrix; the
baseline the dense tuned path (small_gemm) replaces."""
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
    y = torch.matmul(x, w.t())
    if out is not None:
        out.copy_(y)
        return out
    return y
