"""The suite's table of kernel paths: the runtime's dispatch facts (kernels/table.py) joined
with the verification claims made about each path (tolerances and their reasons, exactness
claims, the fold allowance). Tests, checks, golden captures and benchmarks are all generated
from it; adding a path is one kernel file, its table entry and its claims here."""
import sys
from dataclasses import dataclass, fields

from kernels import config, table

# The bounds behind these claims, each with its reason, live in pq2verify.numerics (one home;
# docs/NUMERICS.md); the names stay readable here.
from .numerics import (FOLD_REASON, FOLD_UNIT, FP32_FOLD, Q8_BUDGET, UNIT_ROUNDOFF,  # noqa: E402,F401
                       q8_allowance)
from . import numerics  # noqa: E402


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
        """Relative-RMS bound against the 'quantized' or 'dense' FP64 reference (numerics.tolerance)."""
        return numerics.tolerance(self, dtype, against)

    def fold_allowance(self, terms: int, abs_sum):
        """F of the per-element bound for sums of `terms` terms (numerics.fold_allowance)."""
        return numerics.fold_allowance(self, terms, abs_sum)

    def element_bound(self, k: int, abs_sum, ref, dtype):
        """(bound, F, half) of the per-element bound on K = k (numerics.element_bound)."""
        return numerics.element_bound(self, k, abs_sum, ref, dtype)

    def elem_bound_reason(self) -> str:
        return numerics.elem_bound_reason(self)


_OUT = "output rounding to the activation dtype (u = 2^-8 bf16, 2^-11 fp16) plus the FP32 fold"

# The suite's claims per path; its dispatch facts are kernels/table.py's entry of the same name.
CLAIMS: dict[str, dict] = {
    "native": dict(reference="dense", tol_reason=_OUT),
    "int_gemv": dict(tol_reason=_OUT),
    "mmq": dict(tol_reason=_OUT),
    "gemv": dict(tol_reason=_OUT, dots_equal_to="int_gemv"),
    "single": dict(tol_reason=_OUT, dots_equal_to="int_gemv"),
    "gemv_pair": dict(tol_reason=_OUT, dots_equal_to="int_gemv"),
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
