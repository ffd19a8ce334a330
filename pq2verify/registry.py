"""The one declarative table of kernel paths. Tests, checks, golden captures and benchmarks
are all generated from it; adding a path is one kernel file plus one entry here."""
import importlib
from dataclasses import dataclass, field

import torch

# Unit roundoff of each output dtype: the output rounding alone bounds the elementwise relative
# error by u, so ||y - ref|| <= u * ||ref|| plus the FP32 fold error (~1e-6).
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
FP32_FOLD = 1e-5

# Q8 group-128 activation error budget against the dense FP64 reference (SPEC §7: mean 0.0054,
# up to 0.0087 on real projections; earlier work gated at 0.03). Our generated inputs include
# heavy tails and outlier channels, which sit near the top of that range.
Q8_BUDGET = 0.03


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

    def kernel(self):
        return importlib.import_module(self.module).run


_OUT = "output rounding to the activation dtype (u = 2^-8 bf16, 2^-11 fp16) plus the FP32 fold"

PATHS: tuple[Path, ...] = (
    Path("native", "kernels.native", "legacy", 1, None, arithmetic="floating", reference="dense",
         has_dots=False, tol_reason=_OUT,
         description="floating: packed weights decoded in the kernel, FP32 accumulation, no Q8"),
    Path("int_gemv", "kernels.int_gemv", "legacy", 1, 16, tol_reason=_OUT,
         description="Q8 plain; DP4A on codes expanded to signed bytes by byte-permute lookup"),
    Path("mmq", "kernels.mmq", "legacy", 17, None, tol_reason=_OUT,
         description="prefill: INT8 tensor-core dot per 128-group on weights expanded to int8"),
    Path("single", "kernels.single", "tuned", 1, 1, tol_reason=_OUT,
         dots_equal_to="int_gemv", counterpart="int_gemv",
         description="M=1: plane-order DP4A on raw codes minus the group sum; own FP32 sum order"),
    Path("small_mma", "kernels.small_mma", "tuned", 2, 16, tol_reason=_OUT,
         dots_equal_to="int_gemv", counterpart="int_gemv",
         description="four masked code planes into INT8 MMA; split-K with fixed-order reduction"),
    Path("mmq_planes", "kernels.mmq_planes", "tuned", 17, None, tol_reason=_OUT,
         bit_identical_to="mmq", dots_equal_to="mmq", counterpart="mmq",
         description="prefill: four masked-plane K=32 int8 dots per group, mmq's fold order",
         deselected="H200 2026-11-30: 0.87-0.88x of mmq at M=2048 on all six Bonsai shapes "
                    "(7 paired rounds, results/h200/bench.md)"),
    Path("cublas", "pq2verify.dense", "legacy", 1, None, weight="dense", layouts=("dense",),
         arithmetic="floating", reference="dense", has_dots=False, tol_reason=_OUT,
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
