"""The one case model: what a case is, how its inputs are seeded, and the named profiles that
check, golden, bench, selftest and the tests draw their cases from.

A case is (path, shape, N, K, M, dtype, layout, activation kind, strided, seed); its id is
also its filter (`./pq2 check --case ID`, from the checkout). Inputs depend on the shape, M, dtype, kind and
strided flag, never on the path or the layout, so a path and its counterpart read the same
values and the layout changes bytes only. Weights are seeded by the shape alone.

Profiles:
- check: the shape set (`small` on the interpreter, `bonsai27b` on a GPU) x every M in range x
  dtype x layout; kinds rotate over (shape, M, dtype, layout) and strided rows over (M, dtype),
  so each kind and the strided corner are reached without multiplying the matrix, and a filter
  selects the same cases the full run has.
- golden: small fixed sets per backend (interpreter, gpu); its ids name committed captures, so
  its rule must not change without a recapture.
- bench: normal activations, unit stride, seeded by shape and M (`bench_case`).
- selftest: one small check case per path (`selftest_case`).
"""
import bisect
import zlib
from dataclasses import dataclass, replace

import torch

from kernels import sets as kernelsets
from . import registry
from .inputs import ACTIVATION_KINDS, KINDS

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# shape sets: weight kind -> [(name, N, K)]
SHAPES = {
    "small": {"pq2": [("a", 200, 640), ("b", 64, 384)], "dense": [("ba", 96, 384)]},
    "bonsai27b": {
        "pq2": [("gate_up", 34816, 5120), ("down", 5120, 17408), ("in_proj", 16384, 5120),
                ("qkv", 14336, 5120), ("out", 5120, 6144), ("lm_head", 248320, 5120)],
        "dense": [("in_proj_ba", 96, 5120)],
    },
}
MS = {"small": (1, 2, 3, 16, 17, 33), "bonsai27b": (1, 2, 3, 4, 8, 16, 17, 128, 2048)}
# golden: (name, N, K, span); span "one": the first dtype and the prepared layout only
GOLDEN_SHAPES = {
    "interpreter": {"pq2": [("ga", 64, 256, "all"), ("gb", 40, 1024, "one")], "dense": [("gd", 96, 256, "all")]},
    "gpu": {"pq2": [("ga", 2048, 2048, "all"), ("gb", 1536, 1024, "one")], "dense": [("gd", 96, 2048, "all")]},
}
GOLDEN_MS = {"interpreter": (1, 2, 17), "gpu": (1, 4, 17, 64)}
PROFILES = ("check", "golden", "bench", "selftest")
# shape labels of hand-made cases (tests, forced-config probes): any N x K; every other label
# names a shape of the suite and must have its size
FREE_SHAPES = ("t", "forced")
# the command a reproduce line gives: it works from the checkout, venv active or not
RUN = "./pq2"


def shape_sizes() -> dict[str, set[tuple[int, int]]]:
    """Every shape label the suite's profiles use, with the sizes it may have (a golden label
    has one size per backend)."""
    out: dict[str, set[tuple[int, int]]] = {}
    for sets in SHAPES.values():
        for ss in sets.values():
            for name, n, k in ss:
                out.setdefault(name, set()).add((n, k))
    for sets in GOLDEN_SHAPES.values():
        for ss in sets.values():
            for name, n, k, _ in ss:
                out.setdefault(name, set()).add((n, k))
    return out


@dataclass(frozen=True)
class Case:
    path: str
    shape: str
    n: int
    k: int
    m: int
    dtype: str
    layout: str
    kind: str = "normal"
    strided: bool = False
    seed: int = 0

    @property
    def id(self) -> str:
        s = f"{self.path}:{self.shape}={self.n}x{self.k}:m{self.m}:{self.dtype}:{self.layout}:{self.kind}"
        return s + (":strided" if self.strided else "") + f":seed{self.seed}"

    def repro(self) -> str:
        return f"{RUN} check --case {self.id}"

    @classmethod
    def parse(cls, spec: str) -> "Case":
        """Inverse of `id`: path:shape=NxK:mM:dtype:layout:kind[:strided]:seedS. Every field
        is checked against the path, so a case never runs as something other than its id says."""
        try:
            parts = spec.split(":")
            if len(parts) not in (7, 8) or (len(parts) == 8 and parts[6] != "strided"):
                raise ValueError
            path, shape = parts[0], parts[1]
            name, nk = shape.split("=")
            n, k = (int(v) for v in nk.split("x"))
            if not parts[2].startswith("m") or not parts[-1].startswith("seed"):
                raise ValueError
            m = int(parts[2][1:])
            dtype, layout, kind = parts[3], parts[4], parts[5]
            strided = len(parts) == 8
            seed = int(parts[-1].removeprefix("seed"))
        except (IndexError, ValueError):
            raise ValueError(f"--case {spec!r}: expected path:shape=NxK:mM:dtype:layout:kind[:strided]:seedS") from None
        p = registry.get(path)

        def bad(what):
            return ValueError(f"--case {spec!r}: {what}")
        if dtype not in DTYPES or DTYPES[dtype] not in p.dtypes:
            ok = [d for d in DTYPES if DTYPES[d] in p.dtypes]
            raise bad(f"dtype {dtype!r}: path {path} takes {', '.join(ok)}")
        if layout not in p.layouts:
            raise bad(f"layout {layout!r}: path {path} has layouts {', '.join(p.layouts)}")
        if kind not in KINDS:
            raise bad(f"input kind {kind!r}: expected one of {', '.join(KINDS)}")
        if not 0 <= seed < 2 ** 63:     # torch and numpy generators take no negative or wider seed
            raise bad(f"seed {seed}: expected 0 <= seed < 2**63")
        if n < 1 or k < 1 or not p.serves(m):
            raise bad(f"N, K must be >= 1 and path {path} serves M {p.m_range()}; got {n}x{k}, M={m}")
        sizes = shape_sizes()
        if name not in sizes and name not in FREE_SHAPES:
            raise bad(f"shape label {name!r} is not a shape of the suite; expected one of "
                      f"{', '.join(sizes)}, or {' or '.join(FREE_SHAPES)} for a hand-made size")
        if name in sizes and (n, k) not in sizes[name]:
            have = " or ".join(f"{a}x{b}" for a, b in sorted(sizes[name]))
            raise bad(f"shape {name!r} is {have}, not {n}x{k}")
        return cls(path, name, n, k, m, dtype, layout, kind, strided, seed)


def weight_seed(n: int, k: int) -> int:
    """Every path, M, dtype and layout of a shape reads the same weight values."""
    return zlib.crc32(f"w{n}x{k}".encode()) % 100_000


def seeded(c: Case) -> Case:
    """c with its input seed: from the shape, M, dtype, kind and strided flag (not the path)."""
    key = f"{c.n}x{c.k}:{c.m}:{c.dtype}:{c.kind}:{c.strided}"
    return replace(c, seed=zlib.crc32(key.encode()) % 100_000)


def select_paths(paths=None, kset: str | None = None, key: str | None = None) -> list[registry.Path]:
    """Registry paths by name and/or kernel set (kernelsets.members on backend `key`), in
    registry order. Unknown names, an empty list and a name given twice are ValueErrors naming
    the option (an empty list would silently mean every path)."""
    _distinct("--paths", paths)
    for n in paths or ():
        if n not in registry.BY_NAME:
            raise ValueError(f"--paths: unknown {n!r}; expected one of {', '.join(registry.BY_NAME)}")
    sel = list(registry.PATHS) if not paths else [registry.get(p) for p in paths]
    if kset is not None:
        kernelsets.check_name(kset, "--kernels ")
        members = {p.name for p in kernelsets.members(kset, key or "interpreter")}
        sel = [p for p in sel if p.name in members]
    return sel


def _distinct(opt: str, vals) -> None:
    """None means 'the default'; an empty list or a value given twice is refused."""
    if vals is None:
        return
    vals = list(vals)
    if not vals:
        raise ValueError(f"{opt}: empty; give at least one value (or leave the option out)")
    dup = sorted({str(v) for v in vals if vals.count(v) > 1})
    if dup:
        raise ValueError(f"{opt}: {', '.join(dup)} given twice")


def _validate(ms, dtypes, layouts) -> None:
    for opt, vals in (("--m", ms), ("--dtype", dtypes), ("--layout", layouts)):
        _distinct(opt, vals)
    all_layouts = tuple(dict.fromkeys(lay for p in registry.PATHS for lay in p.layouts))
    for opt, vals, known in (("--dtype", dtypes, tuple(DTYPES)), ("--layout", layouts, all_layouts)):
        bad = [v for v in vals or () if v not in known]
        if bad:
            raise ValueError(f"{opt}: unknown {', '.join(map(repr, bad))}; expected one of {', '.join(known)}")
    if any(m < 1 for m in ms or ()):
        raise ValueError(f"--m: expected integers >= 1, got {ms}")


def check_cases(shapes="small", paths=None, kset=None, ms=None, dtypes=None, layouts=None,
                key: str | None = None) -> list[Case]:
    """The check profile's matrix on a shape set (see the module docstring)."""
    if shapes not in SHAPES:
        raise ValueError(f"--shapes: expected one of {', '.join(SHAPES)}, got {shapes!r}")
    _validate(ms, dtypes, layouts)
    sel = select_paths(paths, kset, key)
    full = MS[shapes]
    out = []
    for p in sel:
        for s, (shape, n, k) in enumerate(SHAPES[shapes][p.weight]):
            for m in ms or full:
                if not p.serves(m):
                    continue
                # the rotation counts over the full profile (sorted), so a filter keeps the full
                # run's cases; an M outside the profile takes the place it would sort into
                i = bisect.bisect_left(full, m)
                for dt in dtypes or DTYPES:
                    if DTYPES[dt] not in p.dtypes:
                        continue
                    j = list(DTYPES).index(dt)
                    for lay in layouts or p.layouts:
                        if lay not in p.layouts:
                            continue
                        # + s: a path of one or two Ms still reaches every kind over its shapes
                        r = i + 2 * j + (lay == "raw") + s
                        kind = ACTIVATION_KINDS[r % len(ACTIVATION_KINDS)]
                        out.append(seeded(Case(p.name, shape, n, k, m, dt, lay, kind, strided=(i + j) % 3 == 1)))
    return out


def golden_cases(key: str, paths=None, kset: str | None = None) -> list[Case]:
    """The golden profile of a backend ('interpreter' or any GPU key). Its ids name committed
    captures: changing this rule means recapturing."""
    which = "interpreter" if key == "interpreter" else "gpu"
    ms = GOLDEN_MS[which]
    out = []
    for p in select_paths(paths, kset, key):
        # a path that serves none of the profile's Ms (gemv_pair, M = 2, on a GPU) is captured at
        # its smallest M, at the place that M sorts into: never left without captures
        mine = [(i, m) for i, m in enumerate(ms) if p.serves(m)] or [(bisect.bisect_left(ms, p.m_min), p.m_min)]
        for shape, n, k, span in GOLDEN_SHAPES[which][p.weight]:
            for i, m in mine:
                for j, dt in enumerate(DTYPES):
                    if DTYPES[dt] not in p.dtypes or (span == "one" and j):
                        continue
                    for lay in p.layouts:
                        if span == "one" and lay == "raw":
                            continue
                        c = Case(p.name, shape, n, k, m, dt, lay,
                                 ACTIVATION_KINDS[(i + 2 * j) % len(ACTIVATION_KINDS)], strided=m > 1 and i % 2 == 1)
                        out.append(seeded(c))
    return out


def bench_case(path: str, shape: str, n: int, k: int, m: int, dtype: str, layout: str) -> Case:
    """Normal activations, unit row stride, seeded by shape and M (not by path): both sides of
    an A/B and the cuBLAS baseline read the same values."""
    seed = zlib.crc32(f"bench:{n}x{k}:{m}:{dtype}".encode()) % 100_000
    return Case(path, shape, n, k, m, dtype, layout, "normal", False, seed)


def selftest_case(p: registry.Path) -> Case:
    """One small-shape case per path: bf16, the path's last layout, at least 3 groups (so a
    reordered fold changes bits), the smallest such shape, and M = 2 where served (rows to
    shift, batch invariance), else the path's smallest M. Its inputs are the rotation's first
    (normal activations, heavy on the raw layout) at unit stride, not the check matrix's cell:
    the planted faults are sized for them, and on the cell's inputs at M = 2 (heavier tails)
    small_gemm's one-ulp fault sits inside its per-element bound."""
    m = 2 if p.serves(2) else p.m_min
    lay = p.layouts[-1]
    cs = [seeded(replace(c, kind=ACTIVATION_KINDS[lay == "raw"], strided=False))
          for c in check_cases("small", paths=[p.name], ms=[m], dtypes=["bf16"], layouts=[lay]) if c.k >= 3 * 128]
    if not cs:
        raise ValueError(f"selftest: no small case of path {p.name} with M={m}, bf16, K >= 384")
    return min(cs, key=lambda c: (c.n * c.k, c.id))


def profile(name: str, key: str, **filters) -> list[Case]:
    """Cases of a named profile on backend `key` ('interpreter', 'sm90', ...)."""
    if name == "check":
        return check_cases("small" if key == "interpreter" else "bonsai27b", key=key, **filters)
    if name == "golden":
        return golden_cases(key, **filters)
    if name == "selftest":
        return [selftest_case(p) for p in select_paths(filters.get("paths"), filters.get("kset"), key)]
    if name == "bench":
        from .bench.plan import DEFAULT_MS, INTERP_MS
        shapes = "small" if key == "interpreter" else "bonsai27b"
        out = []
        for p in select_paths(filters.get("paths"), filters.get("kset"), key):
            for shape, n, k in SHAPES[shapes][p.weight]:
                for m in INTERP_MS if key == "interpreter" else DEFAULT_MS:
                    if p.serves(m):
                        out.append(bench_case(p.name, shape, n, k, m, "bf16", "dense" if p.weight == "dense" else "prepared"))
        return out
    raise ValueError(f"unknown profile {name!r}; expected one of {', '.join(PROFILES)}")


