"""The suite's table of kernel paths: the runtime's dispatch facts (kernels/table.py) joined
with the verification claims made about each path (tolerances and their reasons, exactness
claims, the fold allowance). Tests, checks, golden captures and benchmarks are all generated
from it; adding a path is one kernel file, its table entry and its claims here."""
import sys
from dataclasses import dataclass, fields

import numpy as np
import torch

from kernels import config, table

# Unit roundoff of each output dtype: the output rounding alone bounds the elementwise relative
# error by u, so ||y - ref|| <= u * ||ref|| plus the FP32 fold error (~1e-6).
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
FP32_FOLD = 1e-5

# Q8 group-128 activation error budget against the dense FP64 reference (SPEC §7: mean 0.0054,
# up to 0.0087 on real projections; earlier work gated at 0.03). Our generated inputs include
# heavy tails and outlier channels, which sit near the top of that range.
Q8_BUDGET = 0.03


def q8_allowance(quantized, dense, tol_q: float) -> tuple[float, float]:
    """(e_q, bound): the exact Q8 arithmetic's own relative RMS against the dense FP64 reference,
    and the least dense bound an output within tol_q of the quantized reference meets by the
    triangle inequality, e_q + tol_q * |Q| / |D|. Where generated or real inputs alone exceed
    Q8_BUDGET (outlier channels reach 0.031-0.037), the dense check of an integer path uses this
    bound, so it judges the kernel and not the input (every integer path, legacy included, would
    fail the budget there)."""
    from reference import metrics
    e_q = metrics.relative_rms(quantized, dense)
    nd = float(np.linalg.norm(dense))
    return e_q, (e_q + tol_q * float(np.linalg.norm(quantized)) / nd if nd else 0.0)

# Per-element bound (checks.evaluate, "rms" check): with Y the path's FP64 reference and S the
# same sum over absolute terms, each output y must satisfy |y - Y| <= F + spacing(|Y| + F) / 2:
# the FP32 accumulation may land anywhere within F of Y, and the one rounding to the output dtype
# adds at most half the spacing there. F = FOLD_UNIT * (terms + 2) * S, plus (terms + 2) * 2^-126
# for FP32 underflow or flush-to-zero. Why each arithmetic's F is an upper bound:
FOLD_UNIT = {"integer": 2.0 ** -24, "floating": 2.0 ** -23}
FOLD_REASON = {
    "integer": "terms = G groups. The int32 group dot is exact and exact in FP32 (|dot| <= 127*128 "
               "< 2^24); dot*xs*ws takes two FP32 roundings (u = 2^-24 each) and G such terms summed "
               "in any order, split-K included, add at most (G-1)u*S; the +2 (not +1) covers second-"
               "order terms and the FP64 reference's own rounding (G*2^-53*S)",
    "floating": "terms = K. A bf16/fp16 activation times a bf16/fp16 (or fp16 scale times -1/0/+1) "
                "weight has at most 22 significant bits, so each product is exact in FP32; K of "
                "them summed in any order add at most (K-1)u*S. Tensor-core accumulation may "
                "truncate instead of rounding to nearest, so u is taken as 2^-23, not 2^-24",
}


@dataclass(frozen=True)
class Path(table.Entry):
    """A path as the suite sees it: the runtime's dispatch facts (kernels.table.Entry, read from
    kernels/table.py) plus the suite's claims about it (CLAIMS below)."""
    # references: the function it must compute within `tol` (a dtype -> float, see tolerance())
    reference: str = "quantized"     # "quantized" (Q8 codes, FP64) | "dense" (FP64 of the weights)
    tol_reason: str = ""
    # exactness claims, checked by the suite and by `check --derive-exact`
    bit_identical_to: str | None = None   # output bytes equal to this path's for all inputs
    dots_equal_to: str | None = None      # same integer group dots as this path
    deterministic: bool = True
    # Non-empty: the path keeps a workspace per (library handle, stream), so two graphs captured
    # on ONE stream share it and race when replayed concurrently; the reason says so, with data.
    # The concurrency check then captures each graph on its own stream (and shows the hazard).
    capture_stream_workspace: str = ""
    # row i of an M-row call does not depend on the other rows' values (checked bit for bit)
    batch_invariant: bool = True
    # scales the per-element fold allowance F; anything but 1.0 needs elem_reason (with data)
    elem_factor: float = 1.0
    elem_reason: str = ""

    def tolerance(self, dtype, against: str) -> float:
        """Relative-RMS bound against the 'quantized' or 'dense' FP64 reference."""
        out = UNIT_ROUNDOFF[dtype] + FP32_FOLD
        if against == "dense" and self.arithmetic == "integer":
            return Q8_BUDGET
        return out

    def fold_allowance(self, terms: int, abs_sum):
        """F of the per-element bound (see FOLD_UNIT) for sums of `terms` terms whose absolute
        values sum to abs_sum (float64 array)."""
        return self.elem_factor * (FOLD_UNIT[self.arithmetic] * (terms + 2) * abs_sum + (terms + 2) * 2.0 ** -126)

    def element_bound(self, k: int, abs_sum, ref, dtype):
        """(bound, F, half): each output y of this path on K = k must satisfy |y - ref| <= bound
        = F + half, half = spacing(|ref| + F) / 2 in `dtype` (the one rounding adds at most half
        a spacing)."""
        from reference import metrics
        f = self.fold_allowance(k // 128 if self.arithmetic == "integer" else k, abs_sum)
        half = metrics.spacing(np.abs(ref) + f, dtype) / 2
        return f + half, f, half

    def elem_bound_reason(self) -> str:
        why = FOLD_REASON[self.arithmetic]
        return why if self.elem_factor == 1.0 else f"{why}; scaled by {self.elem_factor}: {self.elem_reason}"


_OUT = "output rounding to the activation dtype (u = 2^-8 bf16, 2^-11 fp16) plus the FP32 fold"

# The suite's claims per path; its dispatch facts are kernels/table.py's entry of the same name.
CLAIMS: dict[str, dict] = {
    "native": dict(reference="dense", tol_reason=_OUT),
    "int_gemv": dict(tol_reason=_OUT),
    "mmq": dict(tol_reason=_OUT),
    "gemv": dict(tol_reason=_OUT, dots_equal_to="int_gemv"),
    "single": dict(tol_reason=_OUT, dots_equal_to="int_gemv"),
    "small_mma": dict(tol_reason=_OUT, dots_equal_to="int_gemv"),
    "mmq_planes": dict(tol_reason=_OUT, bit_identical_to="mmq", dots_equal_to="mmq"),
    "mmq_wgmma": dict(tol_reason=_OUT, bit_identical_to="mmq", dots_equal_to="mmq"),
    "cublas": dict(reference="dense", tol_reason=_OUT, capture_stream_workspace=(
        "cuBLAS's workspace is per (handle, stream): two graphs of torch.matmul captured on "
        "one stream replayed concurrently differed from eager in 384/384 elements (H200 "
        "2026-11-30, M=4 96x5120, forced overlap)")),
    "small_gemm": dict(reference="dense", tol_reason=_OUT),
}


def with_claims(entry: table.Entry, claims: dict) -> Path:
    """The suite's Path of a runtime table entry and the claims made about it."""
    return Path(**{f.name: getattr(entry, f.name) for f in fields(table.Entry)}, **claims)


PATHS: tuple[Path, ...] = tuple(with_claims(e, CLAIMS[e.name]) for e in table.ENTRIES)

BY_NAME = {p.name: p for p in PATHS}
KERNEL_SETS = table.KERNEL_SETS


def get(name: str) -> Path:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown path {name!r}; known paths: {', '.join(BY_NAME)}") from None


def paths(*, kset: str | None = None, weight: str | None = None) -> list[Path]:
    return [p for p in PATHS if (kset is None or p.kset == kset) and (weight is None or p.weight == weight)]


def _grid(weight):
    from . import tiles
    return tiles.grid(weight)


# The suite's table is the one the runtime reads (dispatch, kernel sets, the bad-input
# contract: patched PATHS or BY_NAME reach them), and its case shapes the grid the kernel
# files' configs(interpret) sweep.
table.attach(sys.modules[__name__])
config.set_grid(_grid)
