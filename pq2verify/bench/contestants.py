"""What is timed: kernel calls on weights rotated through copies far larger than L2."""

import functools
from dataclasses import dataclass

import torch

from kernels.format import BLOCK_BYTES, PQ2Weight
from .. import registry
from .checkafter import Probe, Thunks
from .plan import Config, GB, Shape, call_nbytes, copies_needed, dense_nbytes


@dataclass(frozen=True)
class Call:
    path: str
    n: int
    k: int
    m: int
    nbytes: int                    # weight bytes this call must read
    us: float = 0.0                # a power-proxy spin's nominal µs (power.py); 0 for kernels

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


@dataclass
class Contestant:
    label: str
    calls: list                    # one replay of the graph, as Call records
    build: object                  # () -> list of thunks (CUDA only; a dry run never calls it)
    per: int                       # time units per replay: calls for a shape row, 1 for a step
    depth: object = None           # a speed-of-light read's PDL prefetch depth (sol.DEPTHS)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.calls) // self.per

    @property
    def flops(self) -> int:
        return sum(c.flops for c in self.calls) // self.per


def clone_weight(w):
    if isinstance(w, PQ2Weight):
        return PQ2Weight(w.data.clone(), w.n, w.k, w.layout)
    return w.clone()


def row_slice(w, rows: int):
    """A new weight holding the first `rows` output rows of w (same K, same layout)."""
    if not isinstance(w, PQ2Weight):
        return w[:rows].clone()
    if w.layout == "raw":
        return PQ2Weight(w.data.view(w.n, -1)[:rows].clone(), rows, w.k, "raw")
    flat = torch.cat([w.codes_matrix()[:rows].reshape(-1), w.scales_matrix()[:rows].reshape(-1).view(torch.uint8)])
    return PQ2Weight(flat, rows, w.k, "prepared")


def scaled_clone(w, e: int):
    """A copy of w whose values are 2^e times w's, exactly: a PQ2 weight's fp16 scales (codes
    unchanged) or a dense matrix, multiplied by 2^e. Raises if a scale would leave the normal
    range (then the product would not be exact)."""
    c = clone_weight(w)
    if not e:
        return c
    if isinstance(c, PQ2Weight):
        s = (c.scales_matrix() if c.layout == "prepared"
             else c.data.view(c.n, c.groups, BLOCK_BYTES)[:, :, :2].view(torch.float16))
        s.mul_(2.0 ** e)                          # in place: both are views of c's bytes
        a = s.abs()
        lo, hi = torch.finfo(torch.float16).tiny, torch.finfo(torch.float16).max
        if bool(((a > 0) & (a < lo)).any()) or not bool((a <= hi).all()):
            raise ValueError(f"scaling a {c.n}x{c.k} weight's fp16 scales by 2^{e} leaves the normal range")
        return c
    return c.mul_(2.0 ** e)


def weight_bytes(w) -> torch.Tensor:
    """The bytes a call reads from weight w, flat: int32 words where they divide evenly."""
    b = (w.data if isinstance(w, PQ2Weight) else w.contiguous()).reshape(-1).view(torch.uint8)
    return b.view(torch.int32) if b.numel() % 4 == 0 and b.data_ptr() % 4 == 0 else b


def rotation(w, count: int) -> list:
    """`count` byte-identical copies at distinct addresses; the first is w itself (the gated one)."""
    return [w] + [clone_weight(w) for _ in range(count - 1)]


def _data(w):
    return w.data if isinstance(w, PQ2Weight) else w


def _reference(x, w) -> torch.Tensor:
    """x times the weight's decoded matrix through torch.mm: independent of every PQ2 kernel."""
    if isinstance(w, PQ2Weight):
        from .gate import decode_dense
        w = decode_dense(w, x.dtype)
    return torch.mm(x, w.t())


def path_contestant(label: str, path: str, shape: Shape, m: int, cfg: Config, x, copies, count: int,
                    gate_print=None):
    """R calls of a registry path, one per weight copy, into one preallocated output. Its probe
    (checkafter): the output, x, every copy, and the path run eagerly on the gated weight."""
    nb = call_nbytes(shape, cfg.dtype)

    def build():
        run = registry.get(path).kernel()
        y = torch.empty(m, shape.n, dtype=x.dtype, device=x.device)
        ws = copies()
        t = Thunks(functools.partial(run, x, w, out=y) for w in ws)
        # cuBLAS may pick another kernel per call (a graph's workspace): compared within 1e-3 RMS
        tol = 1e-3 if path == "cublas" else 0.0
        t.probe = Probe(y, lambda: run(x, ws[0], out=torch.empty_like(y)), x, [x] + [_data(w) for w in ws],
                        gate_print, tol, reference=lambda: _reference(x, ws[0]))
        return t
    return Contestant(label, [Call(path, shape.n, shape.k, m, nb)] * count, build, count)


def weight_copies(inp, shape: Shape, cfg: Config):
    """(copies(), count): the gated weight and its clones, made on first use and shared by every
    side that reads them, totalling at least cfg.rotate_gb."""
    nb = call_nbytes(shape, cfg.dtype)
    count = copies_needed(nb, cfg.rotate_gb * GB)
    return functools.cache(lambda: rotation(inp.w, count)), count


def contestant_for(label: str, path: str, shape: Shape, m: int, cfg: Config, inp, binp=None, copies=None,
                   gate_print=None):
    """The timed calls of one side: `path` over rotating copies of inp.w, or cuBLAS on the
    decoded matrix binp.w when path is 'cublas' and binp is given."""
    if binp is not None:
        return bf16_contestant(label, shape, m, cfg, inp.x, lambda: binp.w, cfg.rotate_gb * GB, gate_print)
    copies, count = copies or weight_copies(inp, shape, cfg)
    return path_contestant(label, path, shape, m, cfg, inp.x, copies, count, gate_print)


def bf16_contestant(label: str, shape: Shape, m: int, cfg: Config, x, wd, rotate_bytes: float, gate_print=None):
    """cuBLAS on the decoded dense weights: torch.mm(x, W.T, out=y) over rotating copies."""
    nb = dense_nbytes(shape.n, shape.k, cfg.dtype)
    count = copies_needed(nb, rotate_bytes)

    def build():
        y = torch.empty(m, shape.n, dtype=x.dtype, device=x.device)
        ws = rotation(wd(), count)
        t = Thunks(functools.partial(torch.mm, x, w.t(), out=y) for w in ws)
        t.probe = Probe(y, lambda: torch.mm(x, ws[0].t()), x, [x] + ws, gate_print, tol=1e-3,
                        reference=lambda: torch.mm(x, ws[0].t()))
        return t
    return Contestant(label, [Call("cublas", shape.n, shape.k, m, nb)] * count, build, count)
