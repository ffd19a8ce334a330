"""The path table: what dispatch knows of each kernel path (its file, kernel set, M range,
weight kind, layouts, dtypes, K multiple, compute capability, arithmetic, integer dots, the
legacy path it replaces). What a path is claimed to compute, and within what bound, is the
verification suite's (pq2verify/registry.py), kept apart from these facts.

A host may attach a richer table (entries that subclass Entry and carry its own data, one per
entry of ENTRIES or more): every lookup here then reads the host's PATHS and BY_NAME at call
time, so dispatch, the kernel sets and the bad-input contract see exactly the host's paths."""
import importlib
import sys
from dataclasses import dataclass

import torch

KERNEL_SETS = ("legacy", "exact", "tuned")


@dataclass(frozen=True)
class Entry:
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
    counterpart: str | None = None   # legacy path it replaces (the exact set's proof, bench pairs)
    # Non-empty: the path's arithmetic is a vendor library call (e.g. cuBLAS through torch.matmul).
    library: str = ""
    description: str = ""
    has_dots: bool = True            # integer group dots (dots=) available
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


ENTRIES: tuple[Entry, ...] = (
    Entry("native", "kernels.native", "legacy", 1, None, arithmetic="floating", has_dots=False,
          description="floating: packed weights decoded in the kernel, FP32 accumulation, no Q8"),
    Entry("int_gemv", "kernels.int_gemv", "legacy", 1, 16,
          description="Q8 plain; DP4A on codes expanded to signed bytes by byte-permute lookup"),
    Entry("mmq", "kernels.mmq", "legacy", 17, None,
          description="prefill: INT8 tensor-core dot per 128-group on weights expanded to int8"),
    Entry("gemv", "kernels.gemv", "tuned", 1, 1, counterpart="int_gemv",
          description="M=1: masked-plane DP4A, split-K summed in the kernel by the tile's last program, "
                      "quantize and GEMV PDL-chained on CUDA"),
    Entry("single", "kernels.single", "tuned", 1, 1, counterpart="int_gemv",
          description="M=1: plane-order DP4A on raw codes minus the group sum; own FP32 sum order"),
    Entry("gemv_pair", "kernels.gemv_pair", "tuned", 2, 2, counterpart="int_gemv",
          description="M=2: gemv's masked-plane DP4A, each weight word loaded once for both tokens; "
                      "gemv's FP32 order per token"),
    Entry("small_mma", "kernels.small_mma", "tuned", 2, 16, counterpart="int_gemv",
          description="four masked code planes into INT8 MMA; split-K with fixed-order reduction"),
    Entry("mmq_planes", "kernels.mmq_planes", "tuned", 17, None, counterpart="mmq",
          description="prefill: four masked-plane K=32 int8 dots per group, mmq's fold order",
          deselected="H200 2026-12-01, packed planes and SWAP on the large shapes: 1.07-1.32x of mmq "
                     "at M=512 and 1.01-1.11x at M=2048 on all six Bonsai shapes, bits equal to mmq "
                     "(results/2026-12-01-prefill-mmq-planes/prefill-chooser.log); not yet measured at M=17-256, where mmq "
                     "uses smaller tiles, so not selected (2026-11-30: 0.87x before the packed planes)"),
    Entry("mmq_wgmma", "kernels.mmq_wgmma", "tuned", 17, None, layouts=("prepared",), counterpart="mmq",
          description="prefill on sm_90 (Gluon): TMA ring, warpgroup MMA with the code planes in registers "
                      "(swapped operands), mmq's fold order; elsewhere its plain-Triton twin"),
    Entry("cublas", "kernels.cublas", "legacy", 1, None, weight="dense", layouts=("dense",),
          arithmetic="floating", has_dots=False, library="cuBLAS (torch.matmul)",
          description="torch.matmul (cuBLAS on CUDA) on the unquantized BF16 matrix"),
    Entry("small_gemm", "kernels.small_gemm", "tuned", 1, 16, weight="dense", layouts=("dense",),
          arithmetic="floating", has_dots=False, counterpart="cublas",
          description="BF16 GEMM for small M on 96x5120-like layers, fixed-order split-K"),
)

# The runtime's own table; a host's replaces it for every lookup below (attach).
PATHS = ENTRIES
BY_NAME = {p.name: p for p in PATHS}
_source = None


def attach(source) -> None:
    """Read the table from `source` (an object or module with PATHS, a sequence of entries, and
    BY_NAME, name -> entry) at every lookup from now on; None: the runtime's own again."""
    global _source
    _source = source


def _src():
    return _source if _source is not None else sys.modules[__name__]


def all_paths() -> tuple:
    return tuple(_src().PATHS)


def by_name() -> dict:
    return _src().BY_NAME


def get(name: str) -> Entry:
    try:
        return _src().BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown path {name!r}; known paths: {', '.join(_src().BY_NAME)}") from None


def paths(*, kset: str | None = None, weight: str | None = None) -> list[Entry]:
    return [p for p in _src().PATHS if (kset is None or p.kset == kset) and (weight is None or p.weight == weight)]


def of_module(module: str) -> Entry:
    """The entry whose kernel file is `module` (a kernel wrapper's own __name__), as BY_NAME
    holds it now."""
    src = _src()
    for p in src.PATHS:
        if p.module == module:
            return src.BY_NAME.get(p.name, p)
    for p in src.BY_NAME.values():
        if p.module == module:
            return p
    raise ValueError(f"no path has kernel file {module!r}; known paths: {', '.join(src.BY_NAME)}")
