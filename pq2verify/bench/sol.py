"""Speed of light with the decode step's call structure: one pure streaming-read kernel per
call of the step, in model order, each reading exactly its own weight copy's bytes; with plain
launches, and with programmatic dependent launch (PDL) at each prefetch depth of DEPTHS.

A PDL variant lets its successor launch first (gdc_launch_dependents), reads its first `depth`
chunks, and only then waits for the previous grid (gdc_wait), as a GEMV may with constant
weights: in a layer, the activations are read after the wait. Depth 0 waits first; a depth of
ITERS or more reads every chunk before the wait (the wait then only orders the part write). The
plain variant is the same code with the PDL calls compiled away. The speed of light of a step is
the best of this sweep (a bound only if it is the best the structure allows). Under Triton's
interpreter PDL is always off (it has no griddepcontrol) and launch_pdl is not passed."""

import functools
import math

import torch

from .contestants import Call, Contestant, weight_bytes

# The streaming-read probe's tiles (probe.py): 16 KB chunks, 8 warps, up to 8 chunks a program,
# fewer where a buffer would give under two programs per SM (in_proj_ba, out).
BLOCK = 4096        # words a program loads per chunk
WARPS = 8
ITERS = 8           # at most this many chunks a program
PRE = 1             # chunks a program reads before gdc_wait, when read_call is not told
PER_SM = 2
DEPTHS = (0, 1, 2, 4, ITERS)      # the PDL sweep; ITERS: all of a program's chunks before the wait
SOL_LABELS = ("sol",) + tuple(f"sol_pdl{d}" if d < ITERS else "sol_pdl_all" for d in DEPTHS)


@functools.cache
def _kernel():
    # Defined on first use: TRITON_INTERPRET is read when the function is decorated.
    import triton
    import triton.language as tl

    @triton.jit
    def stream_read(src, part, n, ITERS: tl.constexpr, PRE: tl.constexpr, BLOCK: tl.constexpr,
                    PDL: tl.constexpr):
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
        # XOR keeps every load live and never overflows (the interpreter checks int32 sums)
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        # unrolled, so the wait sits between chunk PRE - 1 and chunk PRE at compile time and the
        # loads before it can all be issued before it; chunk i of this program is i * nprog + pid
        for i in tl.static_range(ITERS):
            if PDL:
                if i == PRE:
                    tl.extra.cuda.gdc_wait()
            o = (i * nprog + pid).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            acc ^= tl.load(src + o, mask=o < n, other=0).to(tl.int32)
        if PDL:
            if PRE >= ITERS:
                tl.extra.cuda.gdc_wait()
        tl.store(part + pid, tl.xor_sum(acc, axis=0))
    return stream_read


def launch_options(pdl: bool, interpret: bool) -> tuple:
    """(the kernel's PDL constexpr, extra launch arguments): PDL is compiled in and requested
    only on a GPU."""
    if interpret or not pdl:
        return False, {}
    return True, {"launch_pdl": True}


def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def read_call(buf: torch.Tensor, pdl: bool, depth: int | None = None):
    """(thunk, part) of one streaming read of flat `buf` (int32 words or bytes): the XOR of
    part's entries is the XOR of every element read. depth: chunks read before gdc_wait
    (default PRE; at least the program's chunk count: all of them)."""
    from kernels.common import INTERPRET
    n = buf.numel()
    chunks = max(1, math.ceil(n / BLOCK))
    iters = max(1, min(ITERS, chunks // (PER_SM * _sms(buf.device))))
    grid = math.ceil(chunks / iters)
    pre = min(PRE if depth is None else depth, iters)
    part = torch.zeros(grid, dtype=torch.int32, device=buf.device)
    flag, extra = launch_options(pdl, INTERPRET)
    kern = _kernel()

    def thunk():
        kern[(grid,)](buf, part, n, ITERS=iters, PRE=pre, BLOCK=BLOCK, PDL=flag, num_warps=WARPS, **extra)
    thunk.part = part           # what it wrote, for tests
    return thunk, part


def sol_contestants(weights, calls: list) -> list:
    """The speed-of-light contestants, labelled SOL_LABELS: 'sol' (plain launches), then PDL at
    each depth of DEPTHS ('sol_pdl0' waits first, ..., 'sol_pdl_all'): one read per weight of
    weights() (the step's copies, in call order); calls: the step's Call records."""
    out = [Contestant("sol", [Call("probe:sol", c.n, c.k, 0, c.nbytes) for c in calls],
                      lambda: [read_call(weight_bytes(w), False)[0] for w in weights()], 1, depth=None)]
    for d, lab in zip(DEPTHS, SOL_LABELS[1:]):
        out.append(Contestant(lab, [Call("probe:" + lab, c.n, c.k, 0, c.nbytes) for c in calls],
                              lambda d=d: [read_call(weight_bytes(w), True, d)[0] for w in weights()], 1,
                              depth="all" if d >= ITERS else d))
    return out
