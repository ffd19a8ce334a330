"""A case resolved once, and the one builder of its data.

`resolve` looks a case's path up in the registry once, where the case enters a run; every
later stage (the checks, golden capture and verify) reads the entry, its claims and its
tolerances from the resolved object instead of looking the name up again.

`CaseData` is a case's data: x and the weight on the device, the sampled rows, the FP64
references, the absolute sums of the per-element bound and the cross-ISA bound. The check
builds it from the seeds (`CaseData(case, device)`), golden capture and verify from the
CPU-generated or stored tensors (`CaseData.given`); the references come from one function
(`fp64`) either way.
"""
import functools
from dataclasses import dataclass, replace

import numpy as np
import torch

from . import numerics, registry
from .cases import DTYPES, Case, weight_seed
from .inputs import activations, dense_weight, ternary_weight

REF_ROWS = 256            # reference rows sampled on large shapes (all rows when N is smaller)


@dataclass(frozen=True)
class Resolved:
    """A case with its registry entry (the path's dispatch facts and claims)."""
    case: Case
    path: registry.Path

    @property
    def id(self) -> str:
        return self.case.id

    @property
    def dense(self) -> bool:
        return self.path.weight == "dense"

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.case.dtype]

    @functools.cached_property
    def counterpart(self) -> "registry.Path | None":
        """The path the exactness claim names (bytes or dots equal to), if any: looked up once,
        when first asked (a run without the exactness check never needs it)."""
        other = self.path.bit_identical_to or self.path.dots_equal_to
        return None if other is None else registry.get(other)

    def tolerance(self, against: str) -> float:
        """Relative-RMS bound against the 'quantized' or 'dense' FP64 reference."""
        return numerics.tolerance(self.path, self.dtype, against)


def resolve(c: "Case | Resolved") -> Resolved:
    """The case with its path entry: the one registry lookup of the case's path."""
    if isinstance(c, Resolved):
        return c
    return Resolved(c, registry.get(c.path))


# --- seeded data (the check) ------------------------------------------------------------------
def _weight(n: int, k: int, layout: str, device: str, dtype: str, dense: bool):
    return _weight_cached(n, k, layout, str(device), dtype if dense else "-", dense)


@functools.lru_cache(maxsize=3)
def _weight_cached(n: int, k: int, layout: str, device: str, dtype: str, dense: bool):
    # Seeded by the shape alone: every path, M and layout of a shape reads the same values,
    # so the FP64 references are shared and a GPU run generates each large weight once.
    seed = weight_seed(n, k)
    if dense:
        return dense_weight(n, k, seed, device, DTYPES[dtype])
    if layout == "raw":
        return _weight(n, k, "prepared", device, dtype, False).to_raw()
    return ternary_weight(n, k, seed, device, "prepared")


def _rows(n: int) -> torch.Tensor:
    if n <= REF_ROWS:
        return torch.arange(n)
    g = torch.Generator().manual_seed(n)
    return torch.cat([torch.tensor([0, n - 1]), torch.randperm(n - 2, generator=g)[: REF_ROWS - 2] + 1])


def _x(c: Case, device) -> torch.Tensor:
    return activations(c.m, c.k, c.seed, c.kind, DTYPES[c.dtype], device,
                       row_stride=2 * c.k if c.strided else None)


def fp64(which: str, x: torch.Tensor, w, rows: torch.Tensor | None = None) -> np.ndarray:
    """The FP64 reference of x against w ('quantized', 'dense' or 'dots'), on the rows given
    (all rows without them): a dense weight is a tensor, a PQ2 one its bytes, decoded by the
    reference itself."""
    from reference import projection
    if isinstance(w, torch.Tensor):
        return projection.dense(x, (w if rows is None else w[rows.to(w.device)]).cpu())
    w = w.to("cpu")
    fn = {"quantized": projection.quantized, "dots": projection.group_dots, "dense": projection.floating}[which]
    return fn(x, w.data, layout=w.layout, n=w.n, k=w.k, rows=None if rows is None else rows.numpy())


@functools.lru_cache(maxsize=4)
def _reference(c: Case, dense: bool, which: str, device: str):
    """FP64 reference on the CPU. `c` has path and layout blanked: references depend on values
    only, so every path and layout of the same inputs shares one. The weight comes from the
    device it was generated on (CPU and CUDA generators draw different numbers)."""
    return fp64(which, _x(c, "cpu"), _weight(c.n, c.k, "prepared", device, c.dtype, dense), _rows(c.n))


# --- stored data (golden) ---------------------------------------------------------------------
def golden_x(c: Case) -> torch.Tensor:
    """A golden case's activations, generated on the CPU (unit stride: the run strides them)."""
    return activations(c.m, c.k, c.seed, c.kind, DTYPES[c.dtype], "cpu")


def weight_meta(rc: Resolved) -> tuple[str, dict]:
    c = rc.case
    seed = weight_seed(c.n, c.k)
    if rc.dense:
        return f"wd:{c.n}x{c.k}:{c.dtype}:seed{seed}", {"kind": "dense", "n": c.n, "k": c.k, "dtype": c.dtype, "seed": seed}
    return f"w:{c.n}x{c.k}:seed{seed}", {"kind": "pq2", "n": c.n, "k": c.k, "seed": seed}


def make_weight(meta: dict) -> torch.Tensor:
    """The weight's bytes, generated on the CPU (CPU generators are reproducible across
    machines; the GPU's draws other numbers): prepared PQ2 bytes, or the dense matrix."""
    if meta["kind"] == "dense":
        return dense_weight(meta["n"], meta["k"], meta["seed"], "cpu", DTYPES[meta["dtype"]])
    return ternary_weight(meta["n"], meta["k"], meta["seed"], "cpu", "prepared").data


def weight_for(rc: Resolved, data: torch.Tensor, device):
    """The case's weight on the device, in the case's layout."""
    from kernels.format import PQ2Weight
    c = rc.case
    if rc.dense:
        return data.to(device)
    w = PQ2Weight(data.to(device), c.n, c.k, "prepared", checked=True)
    return w.to_raw() if c.layout == "raw" else w


# --- the builder ------------------------------------------------------------------------------
class CaseData:
    """x and weight of one case on the device, plus its FP64 references, absolute sums and
    bounds. Seeded (`CaseData(case, device)`): references are cached across cases that share
    them (same shape, M, dtype and input kind, whatever the path or layout) on sampled rows.
    Given (`CaseData.given`): the tensors a capture stores, references on all rows."""

    def __init__(self, c: "Case | Resolved", device):
        self.rc = resolve(c)
        c = self.case = self.rc.case
        self.device = str(device)
        self.dense = self.rc.dense
        self.x = _x(c, device)
        self.w = _weight(c.n, c.k, "prepared" if self.dense else c.layout, str(device), c.dtype, self.dense)
        self.rows = _rows(c.n)
        self._blank = replace(c, path="-", layout="-")
        self._given = False

    @classmethod
    def given(cls, c: "Case | Resolved", x: torch.Tensor, w, device=None) -> "CaseData":
        """The data of stored tensors: x on the CPU, w as the run reads it."""
        self = cls.__new__(cls)
        self.rc = resolve(c)
        self.case, self.dense = self.rc.case, self.rc.dense
        self.device = str(device if device is not None else x.device)
        self.x, self.w, self.rows = x, w, None
        self._given, self._refs = True, {}
        return self

    def reference(self, which: str):
        """'quantized' or 'dense' FP64 reference, float64 [M, len(rows)] (all rows if given)."""
        which = "dense" if self.dense else which
        if self._given:
            if which not in self._refs:
                self._refs[which] = fp64(which, self.x, self.w)
            return self._refs[which]
        return _reference(self._blank, self.dense, which, self.device)

    def group_dots(self):
        if self._given:
            if "dots" not in self._refs:
                self._refs["dots"] = fp64("dots", self.x, self.w)
            return self._refs["dots"]
        return _reference(self._blank, self.dense, "dots", self.device)

    def abs_sum(self, p: "registry.Path | None" = None) -> np.ndarray:
        """S of the per-element bound: the path's FP64 reference summed over absolute terms,
        float64 [M, len(rows)]; cached per reference."""
        from reference import pq2, projection, q8
        p = p or self.rc.path
        cache = self.__dict__.setdefault("_abs_sums", {})
        which = "dense" if self.dense else p.reference
        if which not in cache:
            rows = self.rows
            if self.dense:
                s = projection.dense(self.x.abs().cpu(), self.w[rows.to(self.w.device)].abs().cpu())
            elif which == "dense":
                s = projection.dense(self.x.abs().cpu(), np.abs(pq2.decode(self.w.data, layout=self.w.layout, n=self.w.n,
                                                                           k=self.w.k, rows=rows.numpy())))
            else:   # sum_g |dot_g| * xs_g * |ws_g|, from the exact group dots
                dots = self.group_dots()
                xs = q8.quantize_q8(self.x).scales.astype(np.float64)
                ws = np.abs(pq2.read(self.w.data, layout=self.w.layout, n=self.w.n, k=self.w.k,
                                     rows=rows.numpy())[1].astype(np.float64))
                s = np.zeros(dots.shape[:2])
                for g in range(dots.shape[2]):
                    s += np.abs(dots[:, :, g]) * xs[:, g, None] * ws[None, :, g]
            cache[which] = s
        return cache[which]

    def cross_isa_bound(self, y: torch.Tensor, want: torch.Tensor) -> np.ndarray:
        """float64 [M, N]: how far two FP32 folds of this case on the CPU can lie apart
        (numerics.cross_isa_bound)."""
        return numerics.cross_isa_bound(self.rc.path, self.case.k, self.x, self.w, y, want)
