"""What is timed: kernel calls on weights rotated through copies far larger than L2."""

import functools
from dataclasses import dataclass

import torch

from .. import registry
from ..weights import PQ2Weight
from .plan import Config, GB, Shape, copies_needed, dense_nbytes, pq2_nbytes


@dataclass(frozen=True)
class Call:
    path: str
    n: int
    k: int
    m: int
    nbytes: int                    # weight bytes this call must read

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


@dataclass
class Contestant:
    label: str
    calls: list                    # one replay of the graph, as Call records
    build: object                  # () -> list of thunks (CUDA only; a dry run never calls it)
    per: int                       # time units per replay: calls for a shape row, 1 for a step

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


def rotation(w, count: int) -> list:
    """`count` byte-identical copies at distinct addresses; the first is w itself (the gated one)."""
    return [w] + [clone_weight(w) for _ in range(count - 1)]


def path_contestant(label: str, path: str, shape: Shape, m: int, cfg: Config, x, copies, count: int):
    """R calls of a registry path, one per weight copy, into one preallocated output."""
    nb = dense_nbytes(shape.n, shape.k, cfg.dtype) if shape.dense else pq2_nbytes(shape.n, shape.k)

    def build():
        run = registry.get(path).kernel()
        y = torch.empty(m, shape.n, dtype=x.dtype, device=x.device)
        return [functools.partial(run, x, w, out=y) for w in copies()]
    return Contestant(label, [Call(path, shape.n, shape.k, m, nb)] * count, build, count)


def weight_copies(inp, shape: Shape, cfg: Config):
    """(copies(), count): the gated weight and its clones, made on first use and shared by every
    side that reads them, totalling at least cfg.rotate_gb."""
    nb = dense_nbytes(shape.n, shape.k, cfg.dtype) if shape.dense else pq2_nbytes(shape.n, shape.k)
    count = copies_needed(nb, cfg.rotate_gb * GB)
    return functools.cache(lambda: rotation(inp.w, count)), count


def contestant_for(label: str, path: str, shape: Shape, m: int, cfg: Config, inp, binp=None, copies=None):
    """The timed calls of one side: `path` over rotating copies of inp.w, or cuBLAS on the
    decoded matrix binp.w when path is 'cublas' and binp is given."""
    if binp is not None:
        return bf16_contestant(label, shape, m, cfg, inp.x, lambda: binp.w, cfg.rotate_gb * GB)
    copies, count = copies or weight_copies(inp, shape, cfg)
    return path_contestant(label, path, shape, m, cfg, inp.x, copies, count)


def bf16_contestant(label: str, shape: Shape, m: int, cfg: Config, x, wd, rotate_bytes: float):
    """cuBLAS on the decoded dense weights: torch.mm(x, W.T, out=y) over rotating copies."""
    nb = dense_nbytes(shape.n, shape.k, cfg.dtype)
    count = copies_needed(nb, rotate_bytes)

    def build():
        y = torch.empty(m, shape.n, dtype=x.dtype, device=x.device)
        return [functools.partial(torch.mm, x, w.t(), out=y) for w in rotation(wd(), count)]
    return Contestant(label, [Call("cublas", shape.n, shape.k, m, nb)] * count, build, count)
