"""Speed of light with the decode step's call structure: one pure streaming-read kernel per
call of the step, in model order, each reading exactly its own weight copy's bytes; once with
plain launches and once with programmatic dependent launch (PDL).

The PDL variant lets its successor launch first (gdc_launch_dependents), issues its first PRE
chunks of loads, and only then waits for the previous grid (gdc_wait), as a GEMV may with
constant weights: in a layer, the activations are read after the wait. The plain variant is
the same code with the PDL calls compiled away. Under Triton's interpreter PDL is always off
(it has no griddepcontrol) and launch_pdl is not passed."""

import functools
import math

import torch

from .contestants import Call, Contestant, weight_bytes

# The streaming-read probe's tiles (probe.py): 16 KB chunks, 8 warps, up to 8 chunks a program,
# fewer where a buffer would give under two programs per SM (in_proj_ba, out).
BLOCK = 4096        # words a program loads per chunk
WARPS = 8
ITERS = 8           # at most this many chunks a program
PRE = 1             # chunks a program issues before gdc_wait
PER_SM = 2


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
        # chunk i of this program is i * nprog + pid: each step, all programs read one span
        c0 = tl.arange(0, PRE)[:, None] * nprog + pid
        offs = c0.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)[None, :]
        first = tl.load(src + offs, mask=offs < n, other=0)
        if PDL:
            tl.extra.cuda.gdc_wait()
        # XOR keeps every load live and never overflows (the interpreter checks int32 sums)
        acc = tl.xor_sum(first.to(tl.int32), axis=0)
        for i in range(PRE, ITERS):
            o = (i * nprog + pid).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            acc ^= tl.load(src + o, mask=o < n, other=0).to(tl.int32)
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


def read_call(buf: torch.Tensor, pdl: bool):
    """(thunk, part) of one streaming read of flat `buf` (int32 words or bytes): the XOR of
    part's entries is the XOR of every element read."""
    from kernels.common import INTERPRET
    n = buf.numel()
    chunks = max(1, math.ceil(n / BLOCK))
    iters = max(1, min(ITERS, chunks // (PER_SM * _sms(buf.device))))
    grid = math.ceil(chunks / iters)
    pre = 1 << (min(PRE, iters).bit_length() - 1)        # tl.arange needs a power of two
    part = torch.zeros(grid, dtype=torch.int32, device=buf.device)
    flag, extra = launch_options(pdl, INTERPRET)
    kern = _kernel()

    def thunk():
        kern[(grid,)](buf, part, n, ITERS=iters, PRE=pre, BLOCK=BLOCK, PDL=flag, num_warps=WARPS, **extra)
    thunk.part = part           # what it wrote, for tests
    return thunk, part


def sol_contestants(weights, calls: list) -> list:
    """The two speed-of-light contestants ('sol' plain, 'sol_pdl'): one read per weight of
    weights() (the step's copies, in call order); calls: the step's Call records."""
    reads = [Call("probe:sol", c.n, c.k, 0, c.nbytes) for c in calls]

    def build(pdl):
        return [read_call(weight_bytes(w), pdl)[0] for w in weights()]
    return [Contestant("sol", reads, lambda: build(False), 1),
            Contestant("sol_pdl", [Call("probe:sol_pdl", c.n, c.k, 0, c.nbytes) for c in calls],
                       lambda: build(True), 1)]
