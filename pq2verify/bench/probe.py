"""The streaming-read bandwidth probe measured in the same run as the kernels."""

import functools
import math

import torch

from .plan import Config, GB
from .contestants import Call, Contestant


@functools.cache
def _read_kernel():
    # Defined on first use: TRITON_INTERPRET is read when the function is decorated.
    import triton
    import triton.language as tl

    @triton.jit
    def read_sum(src, part, n, ITERS: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        for i in range(ITERS):  # grid-stride: each step, all programs read one contiguous span
            offs = (i * nprog + pid).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(src + offs, mask=offs < n, other=0)
        tl.store(part + pid, tl.sum(acc, axis=0))
    return read_sum


def read_probe(buf: torch.Tensor, block: int = 4096, iters: int = 8):
    """A read-only pass over int32 `buf` (each byte read once, one int32 per program written).
    Returns (thunk, partial sums)."""
    n = buf.numel()
    grid = max(1, math.ceil(n / (block * iters)))
    part = torch.zeros(grid, dtype=torch.int32, device=buf.device)
    kern = _read_kernel()

    def thunk():
        kern[(grid,)](buf, part, n, ITERS=iters, BLOCK=block, num_warps=8)
    return thunk, part


def bandwidth_probes(cfg: Config) -> list:
    """Streaming read (Triton kernel and torch.sum, bytes read = buffer size) and a copy (bytes
    read + written). The buffer is far larger than L2, so every pass streams from HBM."""
    nbytes = int(cfg.bw_gb * GB) // 64 * 64

    @functools.cache
    def buf():
        return torch.randint(-2 ** 31, 2 ** 31 - 1, (nbytes // 4,), dtype=torch.int32, device="cuda")

    def read():
        return [read_probe(buf())[0]]

    def total():
        src = buf()
        return [lambda: torch.sum(src, dtype=torch.int64)]

    def copy():
        src, dst = buf(), torch.empty_like(buf())
        return [lambda: dst.copy_(src)]
    return [Contestant("read_triton", [Call("probe:read", 0, 0, 0, nbytes)], read, 1),
            Contestant("read_sum", [Call("probe:sum", 0, 0, 0, nbytes)], total, 1),
            Contestant("copy", [Call("probe:copy", 0, 0, 0, 2 * nbytes)], copy, 1)]
