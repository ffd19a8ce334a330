"""The run plan: configuration, presets, shapes, the (shape, M) items and their byte counts."""

import math
from dataclasses import dataclass, replace

from kernels import sets as kernelsets
from kernels.format import BLOCK, BLOCK_BYTES
from .. import checks


GB = 1e9
# One decode step of Ternary Bonsai 2 27B (SPEC §6): PQ2 projections and their calls per step,
# and the unquantized BF16 in_proj_ba beside each DeltaNet in_proj (48 calls, 47 MB).
STEP_COUNTS = {"gate_up": 64, "down": 64, "in_proj": 48, "qkv": 16, "out": 64, "lm_head": 1}
STEP_DENSE = {"in_proj_ba": 48}
STEP_LAYERS = 64
DEFAULT_MS = (1, 2, 4, 8, 16, 128, 2048)
STEP_MS = (1, 2, 4, 8, 16)
# prefill sizes reported beside the M = 2048 target (issue 28): outside the defaults, but the
# static checks compile their configs too (pq2verify.sm90.shapes)
REPORT_MS = (512, 8192)
# the fixed-cost fit times each shape at N/d rows for d in FIT_DIVS (1: the full row itself)
FIT_DIVS = (4, 2, 1)
INTERP_MS = (1, 2, 17)
# --quick fits a run in about 4 minutes of an H200 (gates, compiles and timing included): the
# targets' M only, 7 rounds, and no new item started after 180 s.
# Rounds go on past `pairs`, two at a time, until every compared ratio's interval is at most
# ci_width wide (relative to its median) or max_pairs rounds are timed.
PRESETS = {"quick": dict(ms=(1, 16, 2048), step_ms=(1, 16), pairs=7, warmup=2, budget_s=180.0, reruns=1,
                         max_pairs=11),
           "full": dict(ms=None, step_ms=STEP_MS, pairs=9, warmup=3, budget_s=None, reruns=2, max_pairs=25)}
M_PRIORITY = (1, 2048, 16, 4, 8, 2)   # the targets' M first, so a budget cut keeps them
MIN_PAIRS = 7
# H200 targets of the issue (fractions of the floor, step times, speedups). The fractions and
# speedups carry to another GPU; the step-time limits (ms) are the H200's alone.
TARGET_GPU = "H200"
TARGET_STEP_M = (1, 2, 4, 8, 16)
TARGET_STEP_M1_FLOOR = 0.85
TARGET_STEP_M1_MS = 1.75
TARGET_STEP_M16_MS = 2.1
TARGET_STEP_M1_VS_BF16 = 8.0
TARGET_STEP_SMALL_FLOOR = 0.70
TARGET_PREFILL_VS_BF16 = 1.25
PREFILL_M = 2048
LAUNCH_MIN_M = 16      # M above this is prefill (eager in serving): its launch cost is measured
# The H200's dense int8 tensor-core peak (Top/s at its 1980 MHz boost): prefill rows give their
# fraction of it (on another GPU the column still reads against the H200's).
INT8_PEAK_TOPS = 1979.0


@dataclass
class Config:
    a: str = "legacy"
    b: str = "tuned"
    shapes: str = "auto"           # a set of checks.SHAPES or comma-separated shape names
    ms: tuple | None = None        # None: DEFAULT_MS, or INTERP_MS on the interpreter
    step_ms: tuple = STEP_MS
    dtype: str = "bf16"
    layout: str = "prepared"
    pairs: int = 9                 # timed rounds after warm-up (each round: every contestant once)
    warmup: int = 3
    rotate_gb: float = 1.0         # weight copies per shape total at least this (L2 is 60 MB)
    min_sample_ms: float = 1.0     # one timed sample replays its graph until about this long
    bw_gb: float = 2.0             # bandwidth probe buffer
    reruns: int = 2                # gate determinism reruns
    budget_s: float | None = None  # start no new item after this many seconds
    bf16_step: str = "auto"        # auto | graph | sum
    ci_width: float | None = 0.02  # rounds extend until intervals are this narrow (None: never extend)
    max_pairs: int | None = 25     # ... or this many rounds are timed
    spin_us: float = 5.0           # the step's power proxy: a spin of this many µs after each call (0: none)

    def check(self) -> None:
        for opt, name in (("--a ", self.a), ("--b ", self.b)):
            kernelsets.check_name(name, opt)
        if self.dtype not in checks.DTYPES:
            raise ValueError(f"--dtype {self.dtype!r}: expected one of {', '.join(checks.DTYPES)}")
        if self.layout not in ("raw", "prepared"):
            raise ValueError(f"--layout {self.layout!r}: expected raw or prepared")
        if self.pairs < MIN_PAIRS:
            raise ValueError(f"--pairs {self.pairs}: at least {MIN_PAIRS} alternating rounds (SPEC §8)")
        if self.bf16_step not in ("auto", "graph", "sum"):
            raise ValueError(f"--bf16-step {self.bf16_step!r}: expected auto, graph or sum")
        for opt, v in (("--budget-s", self.budget_s), ("--rotate-gb", self.rotate_gb), ("--bw-gb", self.bw_gb),
                       ("--min-sample-ms", self.min_sample_ms), ("--ci-width", self.ci_width)):
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"{opt} {v!r}: expected a positive number")
        if not (math.isfinite(self.spin_us) and self.spin_us >= 0):
            raise ValueError(f"--spin-us {self.spin_us!r}: expected a number >= 0 (0: no power proxy)")
        if self.max_pairs is not None and self.max_pairs < self.pairs:
            raise ValueError(f"--max-pairs {self.max_pairs}: at least --pairs ({self.pairs})")

    def signature(self, env_kind: str, device_name: str = "") -> dict:
        """What a resumed run must share with the file it continues."""
        return {"env": env_kind, "device": device_name, "a": self.a, "b": self.b, "dtype": self.dtype,
                "layout": self.layout,
                "rotate_gb": self.rotate_gb, "pairs": self.pairs}


@dataclass(frozen=True)
class Shape:
    name: str
    n: int
    k: int
    dense: bool = False


@dataclass(frozen=True)
class Item:
    kind: str                      # bandwidth | aa | shape | step | launch
    m: int = 0
    shape: Shape | None = None
    tag: str = ""                  # aa: '' (the first A/A row) or 'last' (the run's closing bracket)

    @property
    def key(self) -> str:
        if self.kind in ("shape", "launch"):
            return f"{self.kind}:{self.shape.name}:m{self.m}"
        if self.kind == "aa":
            return "aa" + (f":{self.tag}" if self.tag else "")
        return f"step:m{self.m}" if self.kind == "step" else self.kind


def all_shapes() -> dict:
    out = {}
    for set_name, kinds in checks.SHAPES.items():
        for kind, lst in kinds.items():
            for name, n, k in lst:
                out.setdefault(name, Shape(name, n, k, kind == "dense"))
    return out


def select_shapes(spec: str, default_set: str) -> list:
    """'auto', a shape set name (small, bonsai27b) or comma-separated shape names."""
    spec = default_set if spec in (None, "", "auto") else spec
    known = all_shapes()
    if spec in checks.SHAPES:
        names = [s[0] for kind in ("pq2", "dense") for s in checks.SHAPES[spec][kind]]
    else:
        names = [v.strip() for v in spec.split(",") if v.strip()]
    bad = [v for v in names if v not in known]
    if bad or not names:
        raise ValueError(f"--shapes {spec!r}: unknown {bad or 'empty'}; expected a set "
                         f"({', '.join(checks.SHAPES)}) or names from {', '.join(known)}")
    return [known[v] for v in names]


def step_shapes() -> dict:
    """The step's shapes by name: the PQ2 projections, then the dense in_proj_ba."""
    known = all_shapes()
    return {name: known[name] for name in (*STEP_COUNTS, *STEP_DENSE)}


def step_chain() -> list:
    """The calls of one decode step in model order as (shape name, source), where source is the
    index of the call whose output this call reads (-1: the step's input). 64 layers, every
    fourth full attention (qkv) and the others DeltaNet (in_proj, then in_proj_ba on the same
    layer input); each layer then its output projection (reading in_proj or qkv) and the MLP
    (gate_up, down); lm_head reads the last down. 257 PQ2 calls and 48 dense ones."""
    calls, src = [], -1
    for layer in range(STEP_LAYERS):
        first = "qkv" if layer % 4 == 3 else "in_proj"
        calls.append((first, src))
        head = len(calls) - 1
        if first == "in_proj":
            calls.append(("in_proj_ba", src))
        for nm in ("out", "gate_up", "down"):
            calls.append((nm, head))
            head = len(calls) - 1
        src = head
    return calls + [("lm_head", src)]


def step_order() -> list:
    """The 257 PQ2 projections of one decode step in model order (step_chain without the dense
    calls)."""
    return [nm for nm, _ in step_chain() if nm in STEP_COUNTS]


def check_chain(chain: list, shapes: dict) -> None:
    """Every call's K fits in its source's output row (the next input is the first M*K elements
    of the source's [M, N] output, viewed as [M, K]): raise ValueError naming the pair."""
    for i, (nm, src) in enumerate(chain):
        if not -1 <= src < i:
            raise ValueError(f"step call {i} ({nm}) reads call {src}, which does not run before it")
        if src >= 0 and shapes[chain[src][0]].n < shapes[nm].k:
            s = shapes[chain[src][0]]
            raise ValueError(f"step call {i} ({nm}, K={shapes[nm].k}) cannot read call {src} "
                             f"({s.name}, N={s.n}): its output row is shorter than K")


def call_nbytes(shape: Shape, dtype: str) -> int:
    """Weight bytes one call of `shape` reads: packed PQ2, or the dense matrix."""
    return dense_nbytes(shape.n, shape.k, dtype) if shape.dense else pq2_nbytes(shape.n, shape.k)


def order_ms(ms) -> list:
    return sorted(set(ms), key=lambda m: (M_PRIORITY.index(m) if m in M_PRIORITY else len(M_PRIORITY), m))


def aa_shape(shapes: list) -> Shape:
    """The A/A row's shape: the first PQ2 shape of the run (a dense one only if there is none)."""
    return next((s for s in shapes if not s.dense), shapes[0])


def make_plan(cfg: Config, shapes: list, with_step: bool) -> list:
    """Bandwidth, the A/A row (the control against itself: the run's noise floor) at the first
    M, then the targets' M first; then the launch cost of each shape at each prefill M (M >
    LAUNCH_MIN_M, eager calls; with the step, on a GPU); the A/A row again at the end closes the
    run's drift bracket."""
    items = [Item("bandwidth")]
    step_ms = set(cfg.step_ms) if with_step else set()
    ms = order_ms(set(cfg.ms) | step_ms)
    aa = [Item("aa", ms[0], aa_shape(shapes))] if ms else []
    items += aa
    for m in ms:
        if m in cfg.ms:
            items += [Item("shape", m, s) for s in shapes]
        if m in step_ms:
            items.append(Item("step", m))
    if with_step:
        items += [Item("launch", m, s) for m in ms if m in cfg.ms and m > LAUNCH_MIN_M for s in shapes]
    return items + [replace(i, tag="last") for i in aa]


def pq2_nbytes(n: int, k: int) -> int:
    return n * (k // BLOCK) * BLOCK_BYTES


def dense_nbytes(n: int, k: int, dtype: str) -> int:
    return n * k * checks.DTYPES[dtype].itemsize


def copies_needed(nbytes: int, rotate_bytes: float) -> int:
    return max(1, math.ceil(rotate_bytes / nbytes))
