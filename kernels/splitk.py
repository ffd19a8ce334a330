"""Split-K helpers shared by the paths that sum per-split FP32 partials (single, small_mma,
small_gemm, gemv): where the partials live, how groups are cut into splits, and the fixed-order
reduction kernel (single, small_gemm; gemv and small_mma sum their partials in the kernel, the
last program of a tile in the same order).

Partials are allocated per call from torch's caching allocator, never cached in the module.
The allocator is stream-ordered and every CUDA graph owns a private pool, so two graphs
replayed on two streams (as a server does with overlapping batches), or eager calls on two
streams, never share partials. A module-level buffer shared by every call of one size raced
exactly there (issue 12). Reuse of a freed block by the same stream is ordered, so it is safe.
"""
from contextlib import contextmanager

import torch
import triton
import triton.language as tl

from . import common, prepare

_poisoned: list | None = None     # inside poisoned(): the sizes handed out


def partials(device, numel: int) -> torch.Tensor:
    """FP32 scratch for one call's split partials [SPLIT, M, N]. Under `poisoned()` it comes
    filled with NaN, so a reduction that reads a partial no program wrote shows NaN."""
    if _poisoned is not None:
        _poisoned.append(numel)
        return torch.full((numel,), float("nan"), dtype=torch.float32, device=device)
    return torch.empty(numel, dtype=torch.float32, device=device)


@contextmanager
def poisoned():
    """Partials pre-filled with NaN inside the block; yields the list of sizes handed out (a
    test proves with it that the call really split). A graph captured inside the block
    replays the fill before the kernels that write the partials."""
    global _poisoned
    old, _poisoned = _poisoned, []
    try:
        yield _poisoned
    finally:
        _poisoned = old


def split_groups(groups: int, want: int, multiple: int = 1):
    """(groups per split, number of splits) for about `want` splits, groups per split a
    multiple of `multiple`, no empty split."""
    want = max(1, min(want, groups))
    per = triton.cdiv(triton.cdiv(groups, want), multiple) * multiple
    return per, triton.cdiv(groups, per)


@triton.jit
def sum_if_last(part_ptr, count_ptr, tile, offs, mask, split_stride, out_ptr, out_offs,
                SPLIT: tl.constexpr, INTERP: tl.constexpr):
    """Split-K reduced inside the kernel (gemv, small_mma), called by every program of a tile
    after storing its partial at part_ptr + split * split_stride + offs: the tile's last program
    to arrive (count_ptr[tile], zeroed by the call's quantize kernel) sums the SPLIT partials in
    the fixed order ((p0 + p1) + p2) + ..., stores the cast sum at out_ptr + out_offs and puts the
    counter back to 0. Whichever program arrives last, the order and so the bits are the same."""
    tl.debug_barrier()   # the whole program's partial stores before the release below
    arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
    if arrived == SPLIT - 1:
        tl.debug_barrier()
        acc = tl.load(part_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg")
        for s in tl.static_range(1, SPLIT):
            acc = acc + tl.load(part_ptr + s * split_stride + offs, mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(out_ptr + out_offs, prepare.to_out(acc, out_ptr.dtype.element_ty, INTERP), mask=mask)
        tl.store(count_ptr + tile, 0)   # left as found


@triton.jit
def _reduce_kernel(part_ptr, out_ptr, M, N, out_sm, out_sn,
                   SPLIT: tl.constexpr, BLOCK: tl.constexpr, INTERP: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = idx < M * N
    acc = tl.load(part_ptr + idx, mask=ok, other=0.0)
    # fixed ascending order over the splits: ((p0 + p1) + p2) + ...
    for s in tl.static_range(1, SPLIT):
        acc = acc + tl.load(part_ptr + s * M * N + idx, mask=ok, other=0.0)
    m = idx // N
    n = idx - m * N
    tl.store(out_ptr + m * out_sm + n * out_sn, prepare.to_out(acc, out_ptr.dtype.element_ty, INTERP),
             mask=ok)


def reduce_splits(part, out, split: int, m: int, n: int) -> None:
    """out[m, n] = sum over s ascending of part[s, m, n] (fp32), cast to out's dtype."""
    block = 1024 if m * n >= 1024 else 256
    _reduce_kernel[(triton.cdiv(m * n, block),)](
        part, out, m, n, out.stride(0), out.stride(1), SPLIT=split, BLOCK=block,
        INTERP=common.INTERPRET, num_warps=4)
