"""Benchmarks gated on passing numerics: the gate, the timing engine and the run plan.

A (path, shape, M, dtype) is timed only after checks.evaluate passed on the very x and weight
that the timing then reads (the rotating weight copies are byte-identical clones of it at other
addresses). Timing follows SPEC §8/§9: CUDA graphs, weights rotated through >= 1 GB of copies,
contestants in alternating order (A B C, C B A, ...) for >= 7 rounds after warm-up, the median
and range of per-round ratios, NVML clocks and power sampled while the GPU works, and the
streaming read bandwidth measured in the same run.

Three environments run the same engine: RealEnv('cuda') gates and times; RealEnv('cpu') gates
on Triton's interpreter and skips the timing with a reason; FakeEnv (dry run) fakes gates and
timings so the table, report, plot and resume are exercised without CUDA.
"""
import functools
import json
import math
import os
import random
import statistics
import threading
import time
import traceback
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from . import checks, dispatch, registry
from .weights import BLOCK, BLOCK_BYTES, PQ2Weight

GB = 1e9
# One decode step of Ternary Bonsai 2 27B (SPEC §6): PQ2 projections and their calls per step.
# in_proj_ba (BF16, 48 calls, 47 MB) is not a PQ2 projection and is left out of the step.
STEP_COUNTS = {"gate_up": 64, "down": 64, "in_proj": 48, "qkv": 16, "out": 64, "lm_head": 1}
STEP_LAYERS = 64
DEFAULT_MS = (1, 2, 4, 8, 16, 128, 2048)
STEP_MS = (1, 4, 8, 16)
INTERP_MS = (1, 2, 17)
# --quick fits a run in about 4 minutes of an H200 (gates, compiles and timing included): the
# targets' M only, 7 rounds, and no new item started after 180 s.
PRESETS = {"quick": dict(ms=(1, 16, 2048), step_ms=(1, 16), pairs=7, warmup=2, budget_s=180.0, reruns=1),
           "full": dict(ms=None, step_ms=STEP_MS, pairs=9, warmup=3, budget_s=None, reruns=2)}
M_PRIORITY = (1, 2048, 16, 4, 8, 2)   # the targets' M first, so a budget cut keeps them
MIN_PAIRS = 7
# H200 targets of the issue (fractions of the floor, speedups)
TARGET_STEP_M1_FLOOR = 0.85
TARGET_STEP_M1_VS_BF16 = 8.0
TARGET_STEP_SMALL_FLOOR = 0.70
TARGET_PREFILL_VS_BF16 = 1.25
PREFILL_M = 2048


# --- configuration and plan ---------------------------------------------------------------
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

    def check(self) -> None:
        for name in (self.a, self.b):
            if name not in registry.KERNEL_SETS:
                raise ValueError(f"kernel set {name!r}: expected one of {', '.join(registry.KERNEL_SETS)}")
        if self.dtype not in checks.DTYPES:
            raise ValueError(f"--dtype {self.dtype!r}: expected one of {', '.join(checks.DTYPES)}")
        if self.layout not in ("raw", "prepared"):
            raise ValueError(f"--layout {self.layout!r}: expected raw or prepared")
        if self.pairs < MIN_PAIRS:
            raise ValueError(f"--pairs {self.pairs}: at least {MIN_PAIRS} alternating rounds (SPEC §8)")
        if self.bf16_step not in ("auto", "graph", "sum"):
            raise ValueError(f"--bf16-step {self.bf16_step!r}: expected auto, graph or sum")

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
    kind: str                      # bandwidth | shape | step
    m: int = 0
    shape: Shape | None = None

    @property
    def key(self) -> str:
        if self.kind == "shape":
            return f"shape:{self.shape.name}:m{self.m}"
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
    known = all_shapes()
    return {name: known[name] for name in STEP_COUNTS}


def step_order() -> list:
    """The 257 PQ2 projections of one decode step in model order: 64 layers, every fourth a
    full-attention layer (qkv) and the others DeltaNet (in_proj); each layer then its output
    projection and the MLP (gate_up, down); lm_head last."""
    seq = []
    for layer in range(STEP_LAYERS):
        seq += ["qkv" if layer % 4 == 3 else "in_proj", "out", "gate_up", "down"]
    return seq + ["lm_head"]


def order_ms(ms) -> list:
    return sorted(set(ms), key=lambda m: (M_PRIORITY.index(m) if m in M_PRIORITY else len(M_PRIORITY), m))


def make_plan(cfg: Config, shapes: list, with_step: bool) -> list:
    items = [Item("bandwidth")]
    step_ms = set(cfg.step_ms) if with_step else set()
    for m in order_ms(set(cfg.ms) | step_ms):
        if m in cfg.ms:
            items += [Item("shape", m, s) for s in shapes]
        if m in step_ms:
            items.append(Item("step", m))
    return items


# --- sizes -----------------------------------------------------------------------------------
def pq2_nbytes(n: int, k: int) -> int:
    return n * (k // BLOCK) * BLOCK_BYTES


def dense_nbytes(n: int, k: int, dtype: str) -> int:
    return n * k * checks.DTYPES[dtype].itemsize


def copies_needed(nbytes: int, rotate_bytes: float) -> int:
    return max(1, math.ceil(rotate_bytes / nbytes))


# --- the gate ---------------------------------------------------------------------------------
@dataclass
class Gate:
    path: str
    ok: bool
    reason: str = ""
    detail: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "PASS" if self.ok else "BLOCKED"


_DETAIL = ("rel_rms_quantized", "tol_quantized", "rel_rms_dense", "tol_dense", "dots_exact",
           "claim", "claim_held", "deterministic", "written")


def gate(case: checks.Case, inp, device: str, *, reruns: int = 2, repro: bool = True) -> Gate:
    """The numerics checks of one case on `inp`, the very inputs that will be timed. Any
    failure, or a crash of the kernel, blocks the timing."""
    detail = {"case": case.id}
    if repro:
        detail["repro"] = case.repro()
    try:
        r = checks.evaluate(case, device, inp=inp, reruns=reruns)
    except Exception as e:  # a crash is a failed gate, with its cause
        return Gate(case.path, False, f"raised {type(e).__name__}: {e}", detail)
    detail.update({k: getattr(r, k) for k in _DETAIL})
    return Gate(case.path, r.ok, "; ".join(r.failures), detail)


def bench_case(path: str, shape: Shape, m: int, cfg: Config) -> checks.Case:
    """Normal activations, unit row stride, seeded by shape and M (not by path): both sides and
    the baseline read the same values."""
    layout = "dense" if shape.dense else cfg.layout
    seed = zlib.crc32(f"bench:{shape.n}x{shape.k}:{m}:{cfg.dtype}".encode()) % 100_000
    return checks.Case(path, shape.name, shape.n, shape.k, m, cfg.dtype, layout, "normal", False, seed)


def decode_dense(w: PQ2Weight, dtype, rows_per_chunk: int = 4096) -> torch.Tensor:
    """The PQ2 weight as a dense [N, K] matrix in `dtype` ((code - 1) * fp16 scale, exact in
    fp32, then rounded once to dtype), on the weight's device, in row chunks."""
    codes, scales = w.codes_matrix(), w.scales_matrix()
    out = torch.empty(w.n, w.k, dtype=dtype, device=w.device)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=w.device)
    for r0 in range(0, w.n, rows_per_chunk):
        r1 = min(w.n, r0 + rows_per_chunk)
        c = (codes[r0:r1].to(torch.int32)[..., None] >> shifts) & 3        # weight 4*j + s
        v = (c.reshape(r1 - r0, w.groups, BLOCK) - 1).float() * scales[r0:r1].float()[..., None]
        out[r0:r1] = v.reshape(r1 - r0, w.k).to(dtype)
    return out


class BaselineInputs:
    """x and the decoded weight as a dense matrix: what cuBLAS is timed on. Stands in for
    checks.Inputs in checks.evaluate; its FP64 reference is x @ W[rows].T of that same matrix."""
    dense = True

    def __init__(self, inp, dtype):
        self.case, self.device, self.x, self.rows = inp.case, inp.device, inp.x, inp.rows
        self.w = decode_dense(inp.w, dtype)
        self._ref = None

    def reference(self, which: str):
        if self._ref is None:
            from reference import projection
            self._ref = projection.dense(self.x.cpu(), self.w[self.rows.to(self.w.device)].cpu())
        return self._ref

    def group_dots(self):
        raise AssertionError("a dense matrix has no integer group dots")


def traced_path(kset: str, inp) -> str:
    """Which path the kernel set serves for these inputs, proven by running it once through
    pq2_matmul under dispatch.trace()."""
    with dispatch.trace() as t:
        dispatch.pq2_matmul(inp.x, inp.w, kernels=kset)
    if sum(t.values()) != 1:
        raise RuntimeError(f"kernels={kset}: expected one traced call, got {dict(t)}")
    return next(iter(t))


# --- what is timed -----------------------------------------------------------------------------
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


# --- timing: CUDA graphs, alternating rounds, NVML sampling ---------------------------------
class GraphTimer:
    """One CUDA graph of `thunks` (kernel calls); sample() times replays with CUDA events. It
    keeps the thunks, and so every tensor they read or write, alive: the graph holds those
    addresses."""

    def __init__(self, thunks: list, per: int):
        self.thunks, self.per = thunks, per
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):      # warm-up (compiles, workspaces) off the capture stream
            for f in thunks:
                f()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for f in thunks:
                f()
        torch.cuda.synchronize()
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def sample(self, reps: int, during=None) -> float:
        """µs per unit over `reps` back-to-back replays; `during` runs while the GPU works."""
        self.start.record()
        for _ in range(reps):
            self.graph.replay()
        self.end.record()
        if during is not None:
            during()
        self.end.synchronize()
        return self.start.elapsed_time(self.end) * 1e3 / (reps * self.per)

    def replay_sync(self) -> None:
        self.graph.replay()
        torch.cuda.current_stream().synchronize()

    def close(self) -> None:
        self.graph = self.thunks = None


class Sampler:
    """Readings of `read()` (NVML clocks and power) tagged with the contestant being timed: a
    background thread reads every `interval_s`, and poll() adds one reading per sample while the
    GPU is busy. interval_s=0: no thread (dry runs and tests)."""

    def __init__(self, read, interval_s: float = 0.01, note: str = ""):
        self.read, self.interval, self.note = read, interval_s, note
        self.tag = None
        self.samples = []
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        if self.read is not None and self.interval:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return False

    def _loop(self):
        while not self._stop.wait(self.interval):
            self.poll()

    def mark(self, tag) -> None:
        self.tag = tag

    def poll(self) -> None:
        tag = self.tag
        if tag is None or self.read is None:
            return
        try:
            r = self.read()
        except Exception:  # a failed NVML read loses one sample, never the timing
            return
        self.samples.append((tag, r))

    def summary(self, tag) -> dict:
        rs = [r for t, r in self.samples if t == tag]
        if not rs:
            return {"n": 0, "note": self.note or "no readings"}
        out = {"n": len(rs)}
        for key in rs[0]:
            vals = [r[key] for r in rs]
            out[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
        return out


def _nvml_handle(nv):
    idx = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:   # match by PCI address: NVML indices ignore CUDA_VISIBLE_DEVICES
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            pci = nv.nvmlDeviceGetPciInfo(h)
            if pci.bus == bus and pci.device == getattr(props, "pci_device_id", pci.device):
                return h
    vis = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if idx < len(vis) and vis[idx].isdigit():
        idx = int(vis[idx])
    return nv.nvmlDeviceGetHandleByIndex(idx)


def nvml_reader():
    """(read, note): read() gives the SM and memory clocks (MHz) and power (W) of the GPU that
    torch uses; (None, why) without NVML."""
    try:
        import pynvml as nv
        nv.nvmlInit()
        h = _nvml_handle(nv)
    except Exception as e:
        return None, f"NVML unavailable ({type(e).__name__}: {e})"

    def read():
        return {"sm_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                "mem_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
                "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0}
    return read, ""


def time_rounds(timers: dict, pairs: int, warmup: int, min_sample_ms: float, sampler=None):
    """Every contestant once per round, the order reversed every other round (A B C, C B A, ...)
    so drift and order effects hit all alike. Warm-up rounds are not kept; they size `reps`, the
    replays per sample, so that a sample lasts about min_sample_ms. Returns ({label: [µs per unit
    per round]}, {label: reps}, [order of each round])."""
    labels = list(timers)
    est = {}
    for _ in range(max(1, warmup)):
        for lab in labels:
            est[lab] = timers[lab].sample(1)
    reps = {lab: max(1, math.ceil(min_sample_ms * 1e3 / max(est[lab] * timers[lab].per, 1e-3)))
            for lab in labels}
    times = {lab: [] for lab in labels}
    orders = []
    for i in range(pairs):
        order = labels if i % 2 == 0 else labels[::-1]
        orders.append(list(order))
        for lab in order:
            if sampler is not None:
                sampler.mark(lab)
            times[lab].append(timers[lab].sample(reps[lab], during=sampler.poll if sampler else None))
        if sampler is not None:
            sampler.mark(None)
    return times, reps, orders


def spread(vals) -> dict | None:
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def round_ratios(times: dict, pairs) -> dict:
    """'{y}_over_{x}': speedup of y over x per round, t_x / t_y (> 1: y faster), as a spread."""
    out = {}
    for x, y in pairs:
        if times.get(x) and times.get(y):
            out[f"{y}_over_{x}"] = spread([tx / ty for tx, ty in zip(times[x], times[y])])
    return out


def measure(env, contestants: list, cfg: Config):
    """Build every contestant's timer, time them in alternating rounds under the sampler.
    A contestant whose graph cannot be built is reported in `failed`, the rest still run."""
    timers, failed = {}, {}
    try:
        for c in contestants:
            try:
                timers[c.label] = env.timer(c)
            except Exception as e:
                failed[c.label] = f"graph build failed: {type(e).__name__}: {e}"
                env.release()
        times, reps, clocks = {}, {}, {}
        if timers:
            with env.sampler() as smp:
                times, reps, _ = time_rounds(timers, cfg.pairs, cfg.warmup, cfg.min_sample_ms, smp)
            clocks = {lab: smp.summary(lab) for lab in timers}
    finally:
        for t in timers.values():
            t.close()
        timers.clear()
        env.release()
    return times, reps, clocks, failed


# --- environments ---------------------------------------------------------------------------
class RealEnv:
    """Kernels for real: gates on `device` ('cuda', or 'cpu' with Triton's interpreter); times
    only on CUDA."""

    def __init__(self, device: str):
        self.device = device
        self.kind = "cuda" if device == "cuda" else "interpreter"
        self.can_time = device == "cuda"
        self.why_not = "" if self.can_time else "no CUDA GPU: timing skipped (the gate ran on Triton's interpreter)"
        self.default_shapes = "bonsai27b" if self.can_time else "small"
        self.reruns = 2
        self._gates = {}
        self._nvml = None

    def provenance(self) -> dict:
        from . import provenance
        info = provenance.collect()
        if self.can_time:
            read, note = self._reader()
            info["nvml"] = "yes" if read else note
            info["gpu_memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / GB, 1)
        return info

    def device_name(self) -> str:
        from . import backend
        return backend.name()

    def inputs(self, case):
        return checks.Inputs(case, self.device)

    def gate(self, case, inp, *, baseline=False) -> Gate:
        key = ("bf16:" if baseline else "") + case.id
        if key not in self._gates:
            self._gates[key] = gate(case, inp, self.device, reruns=self.reruns, repro=not baseline)
        return self._gates[key]

    def side(self, kset: str, case0, inp):
        """(path the set ran, its gate) for these inputs."""
        try:
            path = traced_path(kset, inp)
        except Exception as e:
            try:
                path = dispatch.resolve(case0.m, inp.w, inp.x, kset).name
            except Exception:
                path = "?"
            return path, Gate(path, False, f"pq2_matmul(kernels={kset!r}) raised {type(e).__name__}: {e}")
        return path, self.gate(replace(case0, path=path), inp)

    def baseline(self, inp):
        return BaselineInputs(inp, checks.DTYPES[inp.case.dtype])

    def baseline_gate(self, case, binp) -> Gate:
        return self.gate(case, binp, baseline=True)

    def timer(self, c: Contestant):
        return GraphTimer(c.build(), c.per)

    def _reader(self):
        if self._nvml is None:
            self._nvml = nvml_reader()
        return self._nvml

    def sampler(self):
        read, note = self._reader()
        return Sampler(read, 0.01, note)

    def free_bytes(self) -> int:
        if not self.can_time:
            return 0
        # blocks the caching allocator holds but no tensor uses are free to torch too
        return torch.cuda.mem_get_info()[0] + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()

    def release(self) -> None:
        """Hand cached blocks back between items. Never raises: after a CUDA fault the item
        that caused it is already recorded as an error, and the run must still report."""
        if not self.can_time:
            return
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:
            pass


# fake model for dry runs: fraction of the bandwidth reached, and int8/bf16 rates (ops/s)
FAKE_EFF = {"single": 0.87, "small_mma": 0.78, "int_gemv": 0.60, "native": 0.35, "mmq": 0.50,
            "mmq_planes": 0.55, "cublas": 0.90, "small_gemm": 0.70, "probe:read": 0.97,
            "probe:sum": 0.90, "probe:copy": 0.96}
FAKE_RATE = {"mmq": 0.75e15, "mmq_planes": 0.98e15, "cublas": 0.72e15, "native": 0.15e15}
FAKE_BW = 4.34e12


def fake_us(call: Call) -> float:
    t = call.nbytes / (FAKE_BW * FAKE_EFF.get(call.path, 0.5))
    if call.m > 16:
        t = max(t, call.flops / FAKE_RATE.get(call.path, 0.1e15))
    return t * 1e6 + 2.0


class FakeTimer:
    def __init__(self, c: Contestant, seed: int):
        self.per = c.per
        self.base = sum(fake_us(x) for x in c.calls) / c.per
        self.rng = random.Random(seed)

    def sample(self, reps: int, during=None) -> float:
        if during is not None:
            during()
        return self.base * (1 + self.rng.uniform(-0.03, 0.03))

    def close(self):
        pass


@dataclass(frozen=True)
class FakeWeight:
    """What dispatch.resolve reads of a PQ2 weight (its layout), with no bytes behind it."""
    n: int
    k: int
    layout: str


class FakeInputs:
    """Shapes only: enough for dispatch.resolve, nothing allocated."""

    def __init__(self, case):
        self.case = case
        dt = checks.DTYPES[case.dtype]
        self.x = torch.empty(1, case.k, dtype=dt).expand(case.m, case.k)
        dense = case.layout == "dense"
        self.w = torch.empty(0, dtype=dt) if dense else FakeWeight(case.n, case.k, case.layout)


class FakeEnv:
    """Dry run: real dispatch decisions, fake gates (PASS unless the path is in `blocked`) and
    fake timings from a bandwidth/throughput model. Nothing touches a GPU."""
    kind = "dry-run"
    device = "cpu"
    can_time = True
    why_not = ""
    default_shapes = "bonsai27b"

    def __init__(self, blocked=(), free_bytes: float = 141e9, seed: int = 0):
        self.reruns = 0
        self.blocked = set(blocked)
        self.free = free_bytes
        self.seed = seed
        self.built = []            # labels whose timers were built, in order (for tests)

    def provenance(self) -> dict:
        from . import provenance
        return {"backend": "dry run: fake gates and fake timings, no kernel ran",
                "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "commit": provenance.commit(),
                "torch": torch.__version__, "triton": _triton_version()}

    def device_name(self) -> str:
        return "none (dry run)"

    def inputs(self, case):
        return FakeInputs(case)

    def _gate(self, path, case) -> Gate:
        if path in self.blocked:
            return Gate(path, False, "relative RMS vs dense FP64 reference 0.02 > tolerance 0.0039 (fake)",
                        {"case": case.id})
        return Gate(path, True, "", {"case": case.id, "note": "fake gate"})

    def side(self, kset, case0, inp):
        path = dispatch.resolve(case0.m, inp.w, inp.x, kset).name
        return path, self._gate(path, replace(case0, path=path))

    def baseline(self, inp):
        return inp

    def baseline_gate(self, case, binp) -> Gate:
        return self._gate("cublas", case)

    def timer(self, c: Contestant):
        self.built.append(c.label)
        return FakeTimer(c, zlib.crc32(f"{self.seed}:{c.label}:{len(self.built)}".encode()))

    def sampler(self):
        return Sampler(lambda: {"sm_mhz": 1980, "mem_mhz": 3201, "power_w": 520.0}, 0)

    def free_bytes(self) -> int:
        return int(self.free)

    def release(self) -> None:
        pass


def _triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except ImportError:
        return "not installed"


def make_env(kind: str):
    """'cuda', 'cpu' (interpreter) or 'dry-run'."""
    return FakeEnv() if kind == "dry-run" else RealEnv(kind)


# --- bandwidth probe -------------------------------------------------------------------------
@functools.cache
def _read_kernel():
    # Defined on first use: TRITON_INTERPRET is read when the function is decorated.
    import triton
    import triton.language as tl

    @triton.jit
    def read_sum(src, part, n, ITERS: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        for i in range(ITERS):  # grid-stride: each step, all programs read one contiguous span
            offs = (i * nprog + pid).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            acc += tl.load(src + offs, mask=offs < n, other=0)
        tl.store(part + pid, tl.sum(acc, axis=0))
    return read_sum


def read_probe(buf: torch.Tensor, block: int = 4096, iters: int = 8):
    """A read-only pass over int32 `buf` (each byte read once, one int32 per program written).
    Returns (thunk, partial sums)."""
    n = buf.numel()
    grid = max(1, math.ceil(n / (block * iters)))
    part = torch.zeros(grid, dtype=torch.int32, device=buf.device)
    kern = _read_kernel()

    def thunk():
        kern[(grid,)](buf, part, n, ITERS=iters, BLOCK=block, num_warps=8)
    return thunk, part


def bandwidth_probes(cfg: Config) -> list:
    """Streaming read (Triton kernel and torch.sum, bytes read = buffer size) and a copy (bytes
    read + written). The buffer is far larger than L2, so every pass streams from HBM."""
    nbytes = int(cfg.bw_gb * GB) // 64 * 64

    @functools.cache
    def buf():
        return torch.randint(-2 ** 31, 2 ** 31 - 1, (nbytes // 4,), dtype=torch.int32, device="cuda")

    def read():
        return [read_probe(buf())[0]]

    def total():
        src = buf()
        return [lambda: torch.sum(src, dtype=torch.int64)]

    def copy():
        src, dst = buf(), torch.empty_like(buf())
        return [lambda: dst.copy_(src)]
    return [Contestant("read_triton", [Call("probe:read", 0, 0, 0, nbytes)], read, 1),
            Contestant("read_sum", [Call("probe:sum", 0, 0, 0, nbytes)], total, 1),
            Contestant("copy", [Call("probe:copy", 0, 0, 0, 2 * nbytes)], copy, 1)]


# --- the items -------------------------------------------------------------------------------
def _side(kset: str, path: str, g: Gate) -> dict:
    return {"kset": kset, "path": path, "gate": g.status, "reason": g.reason, "checks": g.detail}


def _fill(side: dict, c: Contestant, t: list, reps: int, clocks: dict, bw: float | None, unit: float):
    """µs (unit=1) or ms (unit=1e3) spread, GB/s, % of the streaming read bandwidth, Top/s."""
    sp = spread(t)
    med = sp["median"]
    gbps = c.nbytes / med / 1e3
    side.update(time={k: (v / unit if k != "n" else v) for k, v in sp.items()}, reps=reps,
                calls=len(c.calls), gbps=gbps, pct_bw=gbps / bw if bw else None,
                tops=c.flops / med / 1e6, clocks=clocks)


def run_bandwidth(env, cfg: Config) -> dict:
    row = {"kind": "bandwidth", "key": "bandwidth"}
    if not env.can_time:
        return {**row, "status": "skipped", "note": env.why_not}
    probes = bandwidth_probes(cfg)
    times, reps, clocks, failed = measure(env, probes, cfg)
    out = {}
    for c in probes:
        if c.label in failed:
            out[c.label] = {"error": failed[c.label]}
            continue
        sp = spread(times[c.label])
        out[c.label] = {"bytes": c.nbytes, "us": sp, "gbps": c.nbytes / sp["median"] / 1e3,
                        "clocks": clocks[c.label]}
    reads = [v["gbps"] for k, v in out.items() if k.startswith("read") and "gbps" in v]
    if not reads:
        row["error"] = "; ".join(f"{k}: {v.get('error')}" for k, v in out.items())
    row.update(probes=out, status="timed" if reads else "error",
               stream_read_gbps=max(reads) if reads else None,
               note="stream read = the faster read probe; copy counts bytes read plus written")
    return row


def run_shape(env, cfg: Config, item: Item, bw: float | None) -> dict:
    shape, m = item.shape, item.m
    case0 = bench_case("cublas" if shape.dense else "native", shape, m, cfg)
    inp = env.inputs(case0)
    sides = {}
    for s, kset in (("a", cfg.a), ("b", cfg.b)):
        path, g = env.side(kset, case0, inp)
        sides[s] = _side(kset, path, g)
    binp = None
    if not shape.dense:
        binp = env.baseline(inp)
        sides["bf16"] = _side("-", "cublas", env.baseline_gate(replace(case0, path="cublas", layout="dense"), binp))
    row = {"kind": "shape", "key": item.key, "shape": shape.name, "n": shape.n, "k": shape.k, "m": m,
           "dense": shape.dense, "dtype": cfg.dtype, "layout": case0.layout, "sides": sides, "ratios": {},
           "control": sides["a"]["path"] == sides["b"]["path"], "case": case0.id}
    blocked = [s for s in sides if sides[s]["gate"] != "PASS"]
    if not env.can_time:
        return {**row, "status": "blocked" if blocked else "skipped", "note": env.why_not}
    copies = weight_copies(inp, shape, cfg)      # shared by both sides
    contestants = [contestant_for(s, sides[s]["path"], shape, m, cfg, inp, binp if s == "bf16" else None, copies)
                   for s in sides if s not in blocked]
    times, reps, clocks, failed = measure(env, contestants, cfg)
    for c in contestants:
        if c.label in failed:
            sides[c.label]["error"] = failed[c.label]
        else:
            _fill(sides[c.label], c, times[c.label], reps[c.label], clocks[c.label], bw, 1.0)
    row["ratios"] = round_ratios(times, [("a", "b"), ("bf16", "b"), ("bf16", "a")])
    row["status"] = "error" if failed else "blocked" if blocked else "timed"
    return row


def _bf16_step_method(cfg: Config, env, pq2_total: int, bf16_total: int) -> str:
    if cfg.bf16_step != "auto":
        return cfg.bf16_step
    # the graph needs every bf16 copy plus the PQ2 copies (not yet made) and room for outputs
    return "graph" if env.free_bytes() >= bf16_total + pq2_total + 8 * GB else "sum"


def step_contestant(label, paths, parts, m, copies, dense_w=False):
    """The 257 calls of one step in model order, each on its own weight copy."""
    order = step_order()

    def call(nm):
        sh, inp, _ = parts[nm]
        nb = sh.n * sh.k * inp.x.element_size() if dense_w else pq2_nbytes(sh.n, sh.k)
        return Call("cublas" if dense_w else paths[nm], sh.n, sh.k, m, nb)
    calls = [call(nm) for nm in order]

    def build():
        ws = copies()
        nxt = {nm: iter(ws[nm]) for nm in ws}
        outs = {nm: torch.empty(m, parts[nm][0].n, dtype=parts[nm][1].x.dtype, device=parts[nm][1].x.device)
                for nm in ws}
        if dense_w:
            return [functools.partial(torch.mm, parts[nm][1].x, next(nxt[nm]).t(), out=outs[nm]) for nm in order]
        runs = {nm: registry.get(paths[nm]).kernel() for nm in ws}
        return [functools.partial(runs[nm], parts[nm][1].x, next(nxt[nm]), out=outs[nm]) for nm in order]
    return Contestant(label, calls, build, 1)


def step_parts(env, cfg: Config, m: int, ksets: dict, baseline: bool = True):
    """Inputs and gates of the six step shapes at M: ({shape: (Shape, inp, binp)}, {side: entry})
    where an entry holds the path per shape and a gate that passes only if every shape's does."""
    sides = {s: {"kset": ks, "paths": {}, "gate": "PASS", "reason": ""} for s, ks in ksets.items()}
    if baseline:
        sides["bf16"] = {"kset": "-", "paths": {}, "gate": "PASS", "reason": ""}
    reasons = {s: [] for s in sides}
    parts = {}
    for nm, shape in step_shapes().items():
        case0 = bench_case("native", shape, m, cfg)
        inp = env.inputs(case0)
        gates = {s: env.side(ks, case0, inp) for s, ks in ksets.items()}
        binp = env.baseline(inp) if baseline else None
        if baseline:
            gates["bf16"] = ("cublas", env.baseline_gate(replace(case0, path="cublas", layout="dense"), binp))
        for s, (path, g) in gates.items():
            sides[s]["paths"][nm] = path
            if not g.ok:
                sides[s]["gate"] = "BLOCKED"
                reasons[s].append(f"{nm} ({path}): {g.reason}")
        parts[nm] = (shape, inp, binp)
    for s in sides:
        sides[s]["reason"] = "; ".join(reasons[s])
    return parts, sides


def step_copies(parts: dict, dense: bool = False):
    """Each shape's weight (dense: its decoded matrix) and clones, one per call in the step."""
    return functools.cache(lambda: {nm: rotation(p[2].w if dense else p[1].w, STEP_COUNTS[nm])
                                    for nm, p in parts.items()})


def run_step(env, cfg: Config, item: Item, bw: float | None, rows: dict) -> dict:
    """One decode step as one graph: 257 projections in model order, each its own weight copy."""
    m, order, shapes = item.m, step_order(), step_shapes()
    parts, sides = step_parts(env, cfg, m, {"a": cfg.a, "b": cfg.b})
    pq2_total = sum(pq2_nbytes(shapes[nm].n, shapes[nm].k) for nm in order)
    bf16_total = sum(dense_nbytes(shapes[nm].n, shapes[nm].k, cfg.dtype) for nm in order)
    floor_ms = pq2_total / (bw * 1e9) * 1e3 if bw else None
    row = {"kind": "step", "key": item.key, "m": m, "dtype": cfg.dtype, "layout": cfg.layout,
           "calls": len(order), "weight_bytes": pq2_total, "bf16_bytes": bf16_total, "floor_ms": floor_ms,
           "bw_gbps": bw, "sides": sides, "ratios": {}, "control": sides["a"]["paths"] == sides["b"]["paths"]}
    blocked = [s for s in sides if sides[s]["gate"] != "PASS"]
    if not env.can_time:
        return {**row, "status": "blocked" if blocked else "skipped", "note": env.why_not}
    method = _bf16_step_method(cfg, env, pq2_total, bf16_total)
    sides["bf16"]["method"] = method
    pq2_copies = step_copies(parts)
    contestants = [step_contestant(s, sides[s]["paths"], parts, m, pq2_copies)
                   for s in ("a", "b") if s not in blocked]
    if method == "graph" and "bf16" not in blocked:
        contestants.append(step_contestant("bf16", None, parts, m, step_copies(parts, dense=True), dense_w=True))
    times, reps, clocks, failed = measure(env, contestants, cfg)
    for c in contestants:
        if c.label in failed:
            sides[c.label]["error"] = failed[c.label]
            continue
        s = sides[c.label]
        _fill(s, c, times[c.label], reps[c.label], clocks[c.label], bw, 1e3)   # ms per step
        if c.label != "bf16":
            s["pct_floor"] = floor_ms / s["time"]["median"] if floor_ms else None
    row["ratios"] = round_ratios(times, [("a", "b"), ("bf16", "b"), ("bf16", "a")])
    if method == "sum" and "bf16" not in blocked:
        _summed_bf16(row, rows, m)
    row["status"] = "error" if failed else "blocked" if blocked else "timed"
    return row


def _summed_bf16(row: dict, rows: dict, m: int) -> None:
    """The BF16 step as the per-shape cuBLAS medians of this run times the calls per step."""
    bf = row["sides"]["bf16"]
    total, missing = 0.0, []
    for nm, count in STEP_COUNTS.items():
        r = rows.get(f"shape:{nm}:m{m}")
        t = (r or {}).get("sides", {}).get("bf16", {}).get("time")
        if t is None:
            missing.append(nm)
        else:
            total += t["median"] * count
    if missing:
        bf["note"] = f"BF16 step not summed: no BF16 row at M={m} for {', '.join(missing)}"
        return
    ms = total / 1e3
    bf["time"] = {"median": ms, "min": ms, "max": ms, "n": 1}
    bf["note"] = "sum of per-shape cuBLAS medians x calls per step (not one graph)"
    for s in ("a", "b"):
        t = row["sides"][s].get("time")
        if t:
            row["ratios"][f"{s}_over_bf16"] = {"median": ms / t["median"], "min": ms / t["max"],
                                               "max": ms / t["min"], "n": t["n"]}


def execute(env, cfg: Config, item: Item, bw, rows: dict) -> dict:
    if item.kind == "bandwidth":
        return run_bandwidth(env, cfg)
    if item.kind == "shape":
        return run_shape(env, cfg, item, bw)
    return run_step(env, cfg, item, bw, rows)


# --- the run: plan, budget, JSON lines, resume ----------------------------------------------
def load_jsonl(path: Path, signature: dict) -> dict:
    """Rows already measured with the same settings, by key. A file from other settings is an
    error (mixing them would compare unlike runs)."""
    if not path.exists():
        return {}
    done = {}
    with open(path) as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue            # a line cut by a crash: that item runs again
            if rec.get("kind") == "header":
                if rec["config"] != signature:
                    raise ValueError(f"{path} was written with other settings {rec['config']}, not "
                                     f"{signature}; pass another --jsonl or drop --resume")
            elif "key" in rec:
                done[rec["key"]] = rec
    return done


def error_row(item: Item, e: Exception) -> dict:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    return {"kind": item.kind, "key": item.key, "m": item.m,
            "shape": item.shape.name if item.shape else None, "status": "error",
            "error": f"{type(e).__name__}: {e}", "traceback": "".join(tb[-3:])}


def run(cfg: Config, env, *, jsonl: Path, resume: bool = False, progress=None, clock=time.monotonic) -> dict:
    """Run the plan, writing each finished row as a JSON line (errors are not written, so a
    resume retries them). Items left when the budget is spent are listed in not_run."""
    if cfg.ms is None:
        cfg.ms = DEFAULT_MS if env.kind != "interpreter" else INTERP_MS
    cfg.check()
    env.reruns = cfg.reruns
    shapes = select_shapes(cfg.shapes, env.default_shapes)
    plan = make_plan(cfg, shapes, with_step=env.can_time)
    sig = cfg.signature(env.kind, env.device_name())
    jsonl = Path(jsonl)
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    done = load_jsonl(jsonl, sig) if resume else {}
    header = {"kind": "header", "config": sig, "settings": asdict(cfg), "provenance": env.provenance()}
    if not (resume and jsonl.exists()):
        jsonl.write_text(json.dumps(header, default=str) + "\n")
    res = {"header": header, "config": asdict(cfg), "rows": [], "not_run": [], "resumed": []}
    if not env.can_time:
        res["note"] = env.why_not + "; no decode step without a GPU"
    rows, bw = {}, None
    t0 = clock()
    for i, item in enumerate(plan):
        if item.key in done:
            row = done[item.key]
            res["resumed"].append(item.key)
        elif cfg.budget_s is not None and clock() - t0 > cfg.budget_s:
            res["not_run"].append(item.key)
            continue
        else:
            env.release()      # the previous item's copies and graph pools are gone by now
            try:
                row = execute(env, cfg, item, bw, rows)
            except Exception as e:  # one broken item never loses the rows before it
                row = error_row(item, e)
                env.release()
            if row["status"] != "error":
                with open(jsonl, "a") as f:
                    f.write(json.dumps(row, default=str) + "\n")
        if item.kind == "bandwidth":
            bw = row.get("stream_read_gbps")
        rows[item.key] = row
        res["rows"].append(row)
        if progress is not None:
            progress(i + 1, len(plan), row)
    res["elapsed_s"] = clock() - t0
    res["stream_read_gbps"] = bw
    res.update(assess(res, cfg))
    return res


# --- targets and the tuned-vs-legacy verdicts -------------------------------------------------
def tuned_side(cfg: Config) -> str:
    return "b" if cfg.b == "tuned" or cfg.a != "tuned" else "a"


def _other(s: str) -> str:
    return "a" if s == "b" else "b"


def ratio(row: dict, y: str, x: str) -> dict | None:
    """Speedup of side y over side x in a row (inverting the stored x-over-y when needed)."""
    r = row.get("ratios") or {}
    if f"{y}_over_{x}" in r:
        return r[f"{y}_over_{x}"]
    inv = r.get(f"{x}_over_{y}")
    if inv is None:
        return None
    return {"median": 1 / inv["median"], "min": 1 / inv["max"], "max": 1 / inv["min"], "n": inv["n"]}


def slower_than_legacy(rows: list, cfg: Config) -> list:
    """Every timed row where a tuned path ran against its legacy counterpart."""
    out = []
    for r in rows:
        if r.get("kind") != "shape" or r.get("status") not in ("timed", "blocked"):
            continue
        for s in ("a", "b"):
            o = _other(s)
            ps, po = r["sides"][s]["path"], r["sides"][o]["path"]
            p = registry.BY_NAME.get(ps)
            sp = ratio(r, s, o)
            if p is None or p.kset != "tuned" or p.counterpart != po or sp is None:
                continue
            verdict = ("faster" if sp["median"] >= 1 else "slower than legacy: remove from tuned selection")
            noise = sp["min"] < 1 < sp["max"]
            out.append({"shape": r["shape"], "m": r["m"], "tuned": ps, "legacy": po, "speedup": sp,
                        "slower": sp["median"] < 1, "within_noise": noise, "verdict": verdict})
    return out


def _target(name, want, got, met, gap) -> dict:
    return {"target": name, "want": want, "got": got, "met": met, "gap": gap}


def _step_targets(rows: dict, t: str, cfg: Config) -> list:
    out = []
    ms_list = sorted(set(cfg.step_ms) | {1})
    if not any(2 <= m <= 16 for m in ms_list):
        out.append(_target(f"decode step M=2-16: at >= {TARGET_STEP_SMALL_FLOOR:.0%} of the bandwidth floor",
                           f">= {TARGET_STEP_SMALL_FLOOR:.0%}", "-", None, "not measured in this run"))
    for m in ms_list:
        want_floor = TARGET_STEP_M1_FLOOR if m == 1 else TARGET_STEP_SMALL_FLOOR
        name = f"decode step M={m}: {cfg.b if t == 'b' else cfg.a} at >= {want_floor:.0%} of the bandwidth floor"
        r = rows.get(f"step:m{m}")
        side = (r or {}).get("sides", {}).get(t, {})
        if not side.get("time") or not r.get("floor_ms"):
            why = side.get("reason") or (r or {}).get("note") or (r or {}).get("error") or "not measured in this run"
            out.append(_target(name, f">= {want_floor:.0%}", "-", False if side.get("gate") == "BLOCKED" else None,
                               f"BLOCKED: {why}" if side.get("gate") == "BLOCKED" else why))
        else:
            ms, floor = side["time"]["median"], r["floor_ms"]
            pct = floor / ms
            need = floor / want_floor
            out.append(_target(name, f">= {want_floor:.0%} (<= {need:.3f} ms)",
                               f"{ms:.3f} ms = {pct:.1%} of floor {floor:.3f} ms", pct >= want_floor,
                               f"met with {ms - need:+.3f} ms to spare" if pct >= want_floor
                               else f"{ms - need:.3f} ms too slow ({(want_floor - pct) * 100:.1f} points)"))
        if m == 1:
            name = (f"decode step M=1: {cfg.b if t == 'b' else cfg.a} over {TARGET_STEP_M1_VS_BF16:g}x faster "
                    "than the BF16 step")
            sp = ((r or {}).get("ratios") or {}).get(f"{t}_over_bf16")
            bf = (r or {}).get("sides", {}).get("bf16", {}).get("time")
            if sp is None or not side.get("time"):
                out.append(_target(name, f"> {TARGET_STEP_M1_VS_BF16:g}x", "-", None, "not measured in this run"))
            else:
                ms = side["time"]["median"]
                need = bf["median"] / TARGET_STEP_M1_VS_BF16 if bf else None
                ok = sp["median"] > TARGET_STEP_M1_VS_BF16
                gap = "met" if ok else (f"needs <= {need:.3f} ms, has {ms:.3f} ms" if need else "missed")
                got = f"{sp['median']:.2f}x" + (f" (BF16 {bf['median']:.2f} ms)" if bf else "")
                out.append(_target(name, f"> {TARGET_STEP_M1_VS_BF16:g}x", got, ok, gap))
    return out


def _prefill_targets(res_rows: list, t: str, cfg: Config) -> list:
    out = []
    rows = [r for r in res_rows if r.get("kind") == "shape" and r.get("m") == PREFILL_M and not r.get("dense")
            and r.get("sides")]
    if not rows:
        return [_target(f"prefill M={PREFILL_M}: tuned >= {TARGET_PREFILL_VS_BF16:g}x cuBLAS BF16", "-", "-", None,
                        "not measured in this run")]
    for r in rows:
        side = r["sides"].get(t, {})
        name = f"prefill M={PREFILL_M} {r['shape']}: {side.get('path', '?')} >= {TARGET_PREFILL_VS_BF16:g}x cuBLAS BF16"
        sp = r["ratios"].get(f"{t}_over_bf16")
        if sp is None:
            blocked = side.get("gate") == "BLOCKED"
            why = side.get("reason") if blocked else r.get("note") or r.get("error") or "not timed"
            out.append(_target(name, f">= {TARGET_PREFILL_VS_BF16:g}x", "-", False if blocked else None,
                               f"BLOCKED: {why}" if blocked else why))
            continue
        us, bf = side["time"]["median"], r["sides"]["bf16"]["time"]["median"]
        ok = sp["median"] >= TARGET_PREFILL_VS_BF16
        out.append(_target(name, f">= {TARGET_PREFILL_VS_BF16:g}x",
                           f"{sp['median']:.2f}x ({us:.0f} µs vs {bf:.0f} µs, {side['tops']:.0f} Top/s)", ok,
                           "met" if ok else f"needs <= {bf / TARGET_PREFILL_VS_BF16:.0f} µs, has {us:.0f} µs"))
    return out


def assess(res: dict, cfg: Config) -> dict:
    rows = {r["key"]: r for r in res["rows"]}
    t = tuned_side(cfg)
    targets = _step_targets(rows, t, cfg) + _prefill_targets(res["rows"], t, cfg)
    pairs = slower_than_legacy(res["rows"], cfg)
    slow = [p for p in pairs if p["slower"]]
    targets.append(_target("every tuned path faster than its legacy counterpart", "all faster",
                           f"{len(pairs) - len(slow)} of {len(pairs)} faster", (not slow) if pairs else None,
                           "met" if pairs and not slow else "not measured in this run" if not pairs else
                           "slower: " + ", ".join(f"{p['tuned']} vs {p['legacy']} {p['shape']} M={p['m']} "
                                                  f"({p['speedup']['median']:.2f}x)" for p in slow)))
    blocked = [r["key"] for r in res["rows"] if r.get("status") == "blocked"]
    errors = [r["key"] for r in res["rows"] if r.get("status") == "error"]
    return {"targets": targets, "tuned_vs_legacy": pairs, "blocked": blocked, "errors": errors}
