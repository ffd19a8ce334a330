"""Seeded random cases beyond the fixed case matrix, each through the full check engine, with a
failure shrunk to the smallest case that still fails.

A case draws a path (round robin over the selection), N (tile edges of the path's configs: one
below, at and past each BN, and ragged multiples), K (multiples of 128: one group, odd group
counts, the edges of each split and group-chunk size), M (the path's range and its edges: 1, 2,
3, 15, 16, 17 and around each BM), dtype, layout, input regime (inputs.KINDS) and strided rows.
Every case is a `cases.Case` under the hand-made shape label `t`, so its id is also a
`./pq2 check --case ID` line that rebuilds the same inputs. The case list is a function of the
seed and the selection alone; the budget only decides how much of it runs.

On the interpreter shapes stay small (a case well under a few seconds); on a GPU they reach the
model's (cases.SHAPES["bonsai27b"])."""
import functools
import importlib
import math
import random
import time
from dataclasses import dataclass, field, replace

from . import cases, checks, registry
from .inputs import KINDS

LABEL = "t"
CHECKS = ("rms", "exact", "determinism", "batch", "nan")   # what `check --case` runs
# the declared-fold check reads inputs of its own (K = 1024, checks.FOLD_K) that depend only on
# path, M, dtype and layout: it runs once per such key, on the interpreter (checks.evaluate)
FOLD = "fold"
# ... for M up to these: its row i is scaled by 2^i (adversarial.activations), so past them x or
# the FP32 sums overflow and the check compares NaN payloads (bf16 M = 118-128 on mmq_wgmma:
# 'nan vs nan'), a limit of that construction, not a fold
FOLD_M_MAX = {"bf16": 64, "fp16": 16}
SEED_MAX = 2 ** 63
# interpreter: N, K and N*K caps that keep one case within a few seconds on a shared CPU
INTERP = dict(n_max=640, g_max=12, nk_max=200_000, m_max=130)
_MODEL = [s for ss in cases.SHAPES["bonsai27b"].values() for s in ss]
GPU = dict(n_max=max(n for _, n, _ in _MODEL), g_max=max(k for _, _, k in _MODEL) // 128,
           nk_max=max(n * k for _, n, k in _MODEL), m_max=4097)
# every N drawn fits the N*K cap at one group, so halving K alone meets the cap (draw)
assert all(lim["n_max"] * 128 <= lim["nk_max"] for lim in (INTERP, GPU))
SHRINK_EVALS = 40        # evaluations a shrink may spend


@functools.lru_cache(maxsize=None)    # configs() sweeps a grid; the draws ask once per case
def tiles(path: str, interpret: bool) -> dict[str, list[int]]:
    """Tile sizes of every config the path's kernel file can pick: 'n' (BN), 'm' (BM), 'g'
    (K in groups: GB, GC, groups_per_split and with SPLIT, k_per_split / 128, BK / 128)."""
    p = registry.get(path)
    mod = importlib.import_module(p.module)
    n, m, g = set(), set(), set()
    for c in getattr(mod, "configs", lambda interpret: [])(interpret):
        if "BN" in c:
            n.add(c["BN"])
        if "BM" in c:
            m.add(c["BM"])
        for f in ("GB", "GC", "groups_per_split"):
            if f in c:
                g.add(c[f])
        if "groups_per_split" in c and "SPLIT" in c:
            g.add(c["groups_per_split"] * c["SPLIT"])
        for f in ("k_per_split", "BK"):
            if f in c:
                g.add(max(1, c[f] // 128))
        if "k_per_split" in c and "SPLIT" in c:
            g.add(max(1, c["k_per_split"] * c["SPLIT"] // 128))
    if p.m_max is not None and p.m_max > 1:
        m.add(16)        # an MMA's M side (small_mma has no BM field)
    return {"n": sorted(n), "m": sorted(m), "g": sorted(g)}


def _pick(rng: random.Random, edges: list[int], lo: int, hi: int) -> int:
    """Half the time an edge (in [lo, hi]), else uniform, a third of those log-uniform."""
    edges = [e for e in edges if lo <= e <= hi]
    r = rng.random()
    if edges and r < 0.5:
        return rng.choice(edges)
    if r < 0.7 and hi > lo:
        return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi))))))
    return rng.randint(lo, hi)


def _edges(ts: list[int], extra=()) -> list[int]:
    out = set(extra)
    for t in ts:
        out |= {t - 1, t, t + 1, 2 * t + 1, 3 * t - 1}
    return sorted(v for v in out if v >= 1)


def limits(interpret: bool) -> dict:
    return INTERP if interpret else GPU


def draw(rng: random.Random, p: registry.Path, interpret: bool) -> cases.Case:
    """One case of path p."""
    lim = limits(interpret)
    ts = tiles(p.name, interpret)
    m_hi = p.m_max if p.m_max is not None else lim["m_max"]
    m_hi = min(m_hi, lim["m_max"])
    m = _pick(rng, _edges(ts["m"], (1, 2, 3, 15, 16, 17, p.m_min)), p.m_min, m_hi)
    g = _pick(rng, _edges(ts["g"], (1, 2, 3, 5, 7, 9)), 1, lim["g_max"])
    n = _pick(rng, _edges(ts["n"], (1, 2, 3, 7)), 1, lim["n_max"])
    while n * g * 128 > lim["nk_max"]:     # K shrinks, so a wide-N edge survives the cap
        g //= 2
    dts = [d for d in cases.DTYPES if cases.DTYPES[d] in p.dtypes]
    dtype = rng.choice(dts)
    layout = rng.choice(list(p.layouts))
    kind = rng.choice(KINDS)
    strided = rng.random() < 0.3
    seed = rng.randrange(100_000)
    return cases.Case(p.name, LABEL, n, g * 128, m, dtype, layout, kind, strided, seed)


def plan(seed: int, paths: list[registry.Path], count: int, interpret: bool) -> list[cases.Case]:
    """The first `count` cases of a seed: paths in turn, everything else drawn from one
    generator, so a seed names the same list whatever the budget."""
    rng = random.Random(seed)
    return [draw(rng, paths[i % len(paths)], interpret) for i in range(count)]


def stream(seed: int, paths: list[registry.Path], interpret: bool):
    rng = random.Random(seed)
    i = 0
    while True:
        yield draw(rng, paths[i % len(paths)], interpret)
        i += 1


@dataclass
class Outcome:
    case: cases.Case
    result: checks.Result | None
    seconds: float
    not_run: str = ""


@dataclass
class Report:
    seed: int
    outcomes: list = field(default_factory=list)
    failure: Outcome | None = None
    shrunk: Outcome | None = None
    shrink_steps: list = field(default_factory=list)
    stopped: str = ""

    @property
    def tested(self) -> int:
        return sum(1 for o in self.outcomes if not o.not_run)


def evaluate(c: cases.Case, device, kernel=None, fold: bool = False) -> Outcome:
    """The check engine on one case (fold: the declared-fold check too); a crash is a failure
    of that case, memory that runs out (or inputs that cannot be built) is NOT RUN."""
    import torch

    from .check_cli import RERUNS
    oom = tuple(t for t in (MemoryError, getattr(torch, "OutOfMemoryError", None)) if t)
    t0 = time.time()
    try:
        inp = checks.Inputs(c, device)
    except Exception as e:
        return Outcome(c, None, time.time() - t0, f"inputs could not be built: {type(e).__name__}: {e}")
    try:
        r = checks.evaluate(c, device, checks=CHECKS + ((FOLD,) if fold else ()), reruns=RERUNS, inp=inp, kernel=kernel)
    except oom as e:
        return Outcome(c, None, time.time() - t0, f"out of memory: {type(e).__name__}")
    except Exception as e:
        r = checks.Result(c)
        r.fail(f"raised {type(e).__name__}: {e}")
    return Outcome(c, r, time.time() - t0)


def _fails(o: Outcome, names: set) -> bool:
    return o.result is not None and not o.result.ok and bool(names & set(o.result.failed))


def _below(v: int, lo: int, edges: list[int]) -> list[int]:
    """Smaller values to try for v, smallest first: lo, each edge just past a tile below v,
    halves, v - 1."""
    cand = {lo, v // 2, v - 1} | {e for e in edges if e < v} | {e + 1 for e in edges if e + 1 < v}
    return sorted(c for c in cand if lo <= c < v)


def shrink(o: Outcome, device, kernel=None, interpret: bool = True, deadline: float | None = None,
           log=None) -> tuple[Outcome, list[str]]:
    """The smallest case found that still fails one of o's checks: simpler regime, unstrided,
    then smaller M, N and K (each trying the tile edges below first), repeated until nothing
    shrinks, SHRINK_EVALS evaluations are spent or the deadline passes."""
    names = set(o.result.failed)
    fold = checks.FOLD in names
    best, steps, spent, tried = o, [], 0, {o.case.id}
    p = registry.get(o.case.path)
    ts = tiles(p.name, interpret)

    def tries():
        c = best.case
        if c.kind != "normal":
            yield "regime", replace(c, kind="normal")
        if c.strided:
            yield "unstrided", replace(c, strided=False)
        for v in _below(c.m, p.m_min, ts["m"] + [1, 2, 3, 16, 17]):
            yield "M", replace(c, m=v)
        for v in _below(c.n, 1, ts["n"]):
            yield "N", replace(c, n=v)
        for v in _below(c.k // 128, 1, ts["g"]):
            yield "K", replace(c, k=v * 128)

    improved = True
    while improved:
        improved = False
        for what, c in tries():
            if spent >= SHRINK_EVALS or (deadline is not None and time.time() > deadline):
                return best, steps
            if not p.serves(c.m) or c.id in tried:
                continue
            spent += 1
            tried.add(c.id)
            t = evaluate(c, device, kernel, fold)
            if _fails(t, names):
                best = t
                steps.append(f"{what}: {c.id}")
                if log:
                    log(f"  shrink {what} -> {c.id} still fails")
                improved = True
                break      # restart from the simplest tries on the smaller case
    return best, steps


def run(seed: int, paths: list[registry.Path], device, *, budget_s: float, max_cases: int | None = None,
        kernel: dict | None = None, interpret: bool | None = None, on_case=None, log=None,
        shrink_s: float | None = None) -> Report:
    """Draw and check cases until the budget is spent (checked between cases), max_cases ran,
    or one fails; a failure is then shrunk (within shrink_s more seconds, default half the
    budget, at least 20 s). kernel: {path name: run function} replacing that path's kernel in
    every call (fault injection), as checks.evaluate's kernel=. on_case(outcome, report) is
    called after each case."""
    import torch
    if interpret is None:
        interpret = torch.device(device).type == "cpu"
    kernel = kernel or {}
    rep = Report(seed)
    fold_keys = set()
    t0 = time.time()
    for i, c in enumerate(stream(seed, paths, interpret)):
        if max_cases is not None and i >= max_cases:
            rep.stopped = f"{max_cases} cases (--max-cases)"
            break
        if i and time.time() - t0 >= budget_s:
            rep.stopped = f"budget of {budget_s:g}s spent"
            break
        key = (c.path, c.m, c.dtype, c.layout)
        fold = interpret and key not in fold_keys and c.m <= FOLD_M_MAX[c.dtype]
        fold_keys.add(key)
        o = evaluate(c, device, kernel.get(c.path), fold)
        rep.outcomes.append(o)
        if on_case:
            on_case(o, rep)
        if o.result is not None and not o.result.ok:
            rep.failure = o
            rep.stopped = "a case failed"
            break
    if rep.failure is not None:
        extra = shrink_s if shrink_s is not None else max(20.0, budget_s / 2)
        rep.shrunk, rep.shrink_steps = shrink(rep.failure, device, kernel.get(rep.failure.case.path),
                                              interpret, time.time() + extra, log)
    return rep
