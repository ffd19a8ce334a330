"""The one declarative table of kernel paths. Tests, checks, golden captures and benchmarks
are all generated from it; adding a path is one kernel file plus one entry here."""
import importlib
from dataclasses import dataclass, field

import numpy as np
import torch

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
class Path:
    name: str
    module: str                      # kernels.<file>; its run(x, w, *, out=None, dots=None)
    kset: str                        # "legacy" | "tuned"
    m_min: int
    m_max: int | None                # None: no upper bound
    weight: str = "pq2"              # "pq2" | "dense" (unquantized bf16/fp16 matrix)
    layouts: tuple = ("raw", "prepared")
    dtypes: tuple = (torch.bfloat16, torch.float16)
    k_multiple: int = 128
    min_cc: tuple | None = None      # minimum CUDA compute capability, None: any
    arithmetic: str = "integer"      # "integer" | "floating"
    # references: the function it must compute within `tol` (a dtype -> float, see tolerance())
    reference: str = "quantized"     # "quantized" (Q8 codes, FP64) | "dense" (FP64 of the weights)
    tol_reason: str = ""
    # exactness claims, checked by the suite and by `check --derive-exact`
    bit_identical_to: str | None = None   # output bytes equal to this path's for all inputs
    dots_equal_to: str | None = None      # same integer group dots as this path
    counterpart: str | None = None        # legacy path it replaces (pairs for bench and derive)
    deterministic: bool = True
    # Non-empty: the path keeps a workspace per (library handle, stream), so two graphs captured
    # on ONE stream share it and race when replayed concurrently; the reason says so, with data.
    # The concurrency check then captures each graph on its own stream (and shows the hazard).
    capture_stream_workspace: str = ""
    # Non-empty: the path's arithmetic is a vendor library call (e.g. cuBLAS through torch.matmul).
    # tools/sanitize.py then runs the same library call alone as a control, so a finding inside
    # the library is told apart from one in our code.
    library: str = ""
    # row i of an M-row call does not depend on the other rows' values (checked bit for bit)
    batch_invariant: bool = True
    # scales the per-element fold allowance F; anything but 1.0 needs elem_reason (with data)
    elem_factor: float = 1.0
    elem_reason: str = ""
    description: str = ""
    has_dots: bool = field(default=True)
    # A tuned path measured slower than its counterpart is kept (checked, benchmarked, reachable
    # with PQ2_PATH_<NAME>=on) but out of the tuned selection; `deselected` says why, with data.
    deselected: str = ""

    @property
    def env(self) -> str:
        return f"PQ2_PATH_{self.name.upper()}"

    def serves(self, m: int) -> bool:
        return m >= self.m_min and (self.m_max is None or m <= self.m_max)

    def m_range(self) -> str:
        return f"{self.m_min}+" if self.m_max is None else (
            str(self.m_min) if self.m_min == self.m_max else f"{self.m_min}-{self.m_max}")

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

    def kernel(self):
        return importlib.import_module(self.module).run

    def fold(self, n: int, k: int, m: int, *, interpret: bool = False, config: dict | None = None) -> dict | None:
        """The FP32 order of the config this path's kernel picks for (n, k, m), or of `config`
        forced (fields missing from it keep the picked values), from the kernel file's own `fold`
        (the GPU's config unless interpret): {groups_per_split, lanes, splits} for PQ2 paths,
        {k_per_split, splits} for a split dense GEMM, None for a library's order. The emulation
        reads it, so a new path needs no edit there. A bad forced config is a ValueError."""
        mod = importlib.import_module(self.module)
        if not hasattr(mod, "fold"):
            raise TypeError(f"{self.module} exports no fold(n, k, m, interpret, config): the emulation needs "
                            f"path {self.name}'s FP32 order (docs/ADDING_A_PATH.md)")
        return mod.fold(n, k, m, interpret=interpret, **({} if config is None else {"config": config}))


_OUT = "output rounding to the activation dtype (u = 2^-8 bf16, 2^-11 fp16) plus the FP32 fold"

PATHS: tuple[Path, ...] = (
    Path("native", "kernels.native", "legacy", 1, None, arithmetic="floating", reference="dense",
         has_dots=False, tol_reason=_OUT,
         description="floating: packed weights decoded in the kernel, FP32 accumulation, no Q8"),
    Path("int_gemv", "kernels.int_gemv", "legacy", 1, 16, tol_reason=_OUT,
         description="Q8 plain; DP4A on codes expanded to signed bytes by byte-permute lookup"),
    Path("mmq", "kernels.mmq", "legacy", 17, None, tol_reason=_OUT,
         description="prefill: INT8 tensor-core dot per 128-group on weights expanded to int8"),
    Path("gemv", "kernels.gemv", "tuned", 1, 1, tol_reason=_OUT,
         dots_equal_to="int_gemv", counterpart="int_gemv",
         description="M=1: masked-plane DP4A, split-K summed in the kernel by the tile's last program, "
                     "quantize and GEMV PDL-chained on CUDA"),
    Path("single", "kernels.single", "tuned", 1, 1, tol_reason=_OUT,
         dots_equal_to="int_gemv", counterpart="int_gemv",
         description="M=1: plane-order DP4A on raw codes minus the group sum; own FP32 sum order"),
    Path("small_mma", "kernels.small_mma", "tuned", 2, 16, tol_reason=_OUT,
         dots_equal_to="int_gemv", counterpart="int_gemv",
         description="four masked code planes into INT8 MMA; split-K with fixed-order reduction"),
    Path("mmq_planes", "kernels.mmq_planes", "tuned", 17, None, tol_reason=_OUT,
         bit_identical_to="mmq", dots_equal_to="mmq", counterpart="mmq",
         description="prefill: four masked-plane K=32 int8 dots per group, mmq's fold order",
         deselected="H200 2026-12-01, packed planes and SWAP on the large shapes: 1.07-1.32x of mmq "
                    "at M=512 and 1.01-1.11x at M=2048 on all six Bonsai shapes, bits equal to mmq "
                    "(results/h200/s7/prefill-chooser.log); not yet measured at M=17-256, where mmq "
                    "uses smaller tiles, so not selected (2026-11-30: 0.87x before the packed planes)"),
    Path("mmq_wgmma", "kernels.mmq_wgmma", "tuned", 17, None, layouts=("prepared",), tol_reason=_OUT,
         bit_identical_to="mmq", dots_equal_to="mmq", counterpart="mmq",
         description="prefill on sm_90 (Gluon): TMA ring, warpgroup MMA with the code planes in registers "
                     "(swapped operands), mmq's fold order; elsewhere its plain-Triton twin"),
    Path("cublas", "kernels.cublas", "legacy", 1, None, weight="dense", layouts=("dense",),
         arithmetic="floating", reference="dense", has_dots=False, tol_reason=_OUT,
         library="cuBLAS (torch.matmul)",
         capture_stream_workspace=(
             "cuBLAS's workspace is per (handle, stream): two graphs of torch.matmul captured on "
             "one stream replayed concurrently differed from eager in 384/384 elements (H200 "
             "2026-11-30, M=4 96x5120, forced overlap)"),
         description="torch.matmul (cuBLAS on CUDA) on the unquantized BF16 matrix"),
    Path("small_gemm", "kernels.small_gemm", "tuned", 1, 16, weight="dense", layouts=("dense",),
         arithmetic="floating", reference="dense", has_dots=False, counterpart="cublas",
         tol_reason=_OUT, description="BF16 GEMM for small M on 96x5120-like layers, fixed-order split-K"),
)

BY_NAME = {p.name: p for p in PATHS}
KERNEL_SETS = ("legacy", "exact", "tuned")


def get(name: str) -> Path:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown path {name!r}; known paths: {', '.join(BY_NAME)}") from None


def paths(*, kset: str | None = None, weight: str | None = None) -> list[Path]:
    return [p for p in PATHS if (kset is None or p.kset == kset) and (weight is None or p.weight == weight)]
