"""The suite's own power: for every registry path, run the suite's checks against deliberately
broken variants of that path and record which check caught each fault.

A fault is a wrapper around the path's real run(x, w, *, out=None, dots=None): output-level
(an element off by 1 ulp, a row or column left unwritten, a tile left from the previous call,
rows shifted, a store past the end) or input-level (NaN activations turned finite, the next
group's weight scale, a fold order that changes on every call, a host value baked into a CUDA
graph), edge faults (an error planted at ~1.1x of the relative-RMS bound against the quantized
or the dense reference, or of the per-element bound; the same at ~0.9x as a control, which the
check at that bound must pass), and a tuned path answered by its legacy counterpart's kernel.
The edge plants sit at bounds derived here with constants of the selftest's own, so a bound
loosened in the judge shows as UNDETECTED. The checks are the suite's own, unchanged:
- checks.evaluate (rms quantized, rms dense, per-element, written, dots, exactness claim,
  determinism, batch invariance, NaN propagation, guard band; each failure carries its typed
  check name), and on the interpreter its opt-in declared-fold check for integer paths,
- the golden captures of this backend (golden.verify on one committed case of the path),
- graphs.check_inplace_update, and on CUDA graphs.check_graph_mutation.
Each check gets a fresh broken wrapper (its state never crosses checks). A fault that no check
catches is a hole in the suite; a fault that cannot exist for a path or backend is 'n/a' with the
reason, never counted as caught. A 'known hole' is a fault that no check of the backend can see
by design (known_hole says why: a path answered by its counterpart where nothing compares its
FP32 order); its checks still run, it is caught if one flags it, and it never counts as caught.
Before the checks, a fault meant to change a plain call's bits is shown to change them on the
case (an inert fault would make 'undetected' meaningless), and each check is run once on the
unbroken path: one that already fails there makes the verdict an error, never a catch. A crash
in a wrapper or a check is an error too.
"""
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
import torch

from kernels import backend
from kernels.format import PQ2Weight
from . import cases, checks, golden, graphs, provenance, registry, verdicts

REPRO = "pq2verify --device {device} selftest --paths {path} --faults {fault}"
RERUNS = 2          # determinism reruns per evaluate (each wrapper call is a fresh random fold)
FOLD_SEED = 1234    # the nondeterministic fold's permutations (seeded: the table is reproducible)
TILE = (16, 32)     # rows x columns of the stale tile (the output's last tile)


# --- faults ---------------------------------------------------------------------------------
class Broken:
    """A path's run with one fault. `fired` counts the calls in which the fault was injected."""

    def __init__(self, path: registry.Path, fault: "Fault", run=None):
        self.path, self.fault, self.run = path, fault, run or path.kernel()
        self.fired, self.state = 0, {}

    def __call__(self, x, w, *, out=None, dots=None, **_):
        return self.fault.apply(self, x, w, out, dots)

    def real(self, x, w, out=None, dots=None):
        """The path's own run; out allocated here when the caller passed none."""
        if out is None:
            out = torch.empty((x.shape[0], _n(w)), dtype=x.dtype, device=x.device)
        return self.run(x, w, out=out, dots=dots) if dots is not None else self.run(x, w, out=out)


def _n(w) -> int:
    return w.shape[0] if isinstance(w, torch.Tensor) else w.n


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _ulp(b, x, w, out, dots):
    y = b.real(x, w, out, dots)
    i, j = y.shape[0] // 2, y.shape[1] // 2
    y[i, j:j + 1].view({2: torch.int16, 4: torch.int32}[y.element_size()]).add_(1)
    b.fired += 1
    return y


def _unwritten(index):
    def apply(b, x, w, out, dots):
        if out is None:      # NaN, not torch.empty: what is left must not vary from run to run
            out = torch.full((x.shape[0], _n(w)), float("nan"), dtype=x.dtype, device=x.device)
        keep = out[index].clone()            # what the buffer held before the call
        y = b.real(x, w, out, dots)
        y[index] = keep
        b.fired += 1
        return y
    return apply


def _stale_tile(b, x, w, out, dots):
    y = b.real(x, w, out, dots)
    prev, b.state["prev"] = b.state.get("prev"), y.clone()
    if prev is not None and prev.shape == y.shape:
        m, n = y.shape
        tile = (slice(max(0, m - TILE[0]), m), slice(max(0, n - TILE[1]), n))
        y[tile] = prev[tile]
        b.fired += 1
    return y


def _nan_finite(b, x, w, out, dots):
    nan = torch.isnan(x)
    if not _capturing() and bool(nan.any()):
        b.fired += 1
    return b.real(torch.where(nan, torch.zeros((), dtype=x.dtype, device=x.device), x), w, out, dots)


def _pick(w: PQ2Weight, codes_idx: list, scales_idx: list | None = None) -> PQ2Weight:
    """A PQ2 weight (same layout) whose group j has group codes_idx[j]'s codes and group
    scales_idx[j]'s scale (default: the same group's). Slices only, no index tensor: nothing
    is copied from the host, so it also runs inside a CUDA graph capture."""
    scales_idx = codes_idx if scales_idx is None else scales_idx
    parts = graphs.weight_parts(w)
    c, s = (t if t.dim() == 3 else t.view(w.n, w.groups, width)
            for t, width in ((parts["codes"], 32), (parts["scales"], 2)))
    c = torch.cat([c[:, i:i + 1] for i in codes_idx], dim=1)
    s = torch.cat([s[:, i:i + 1] for i in scales_idx], dim=1)
    g = len(codes_idx)
    data = (torch.cat([s, c], dim=2).reshape(w.n, g * 34) if w.layout == "raw"
            else torch.cat([c.reshape(-1), s.reshape(-1)]))
    return PQ2Weight(data, w.n, 128 * g, w.layout, checked=True)


def _neighbour_scale(b, x, w, out, dots):
    groups = list(range(w.groups))
    b.fired += 1                                           # group g scaled by group g+1's scale
    return b.real(x, _pick(w, groups, groups[1:] + groups[:1]), out, dots)


def _rows_shifted(b, x, w, out, dots):
    y = b.real(x, w, out, dots)
    y[1:] = y[:-1].clone()                                 # row i gets row i-1's result
    b.fired += 1
    return y


def _fold_order(b, x, w, out, dots):
    """Split-K with one partial per 128-group, each from the path itself, added in the output
    dtype in a random order on every call (as atomics on a bf16/fp16 output do). A random FP32
    order alone is all but invisible on small outputs: an FP32-ulp change moves the bf16
    rounding only for sums within that ulp of a rounding boundary (~2^-16 of them)."""
    gen = b.state.setdefault("gen", torch.Generator().manual_seed(FOLD_SEED))
    groups = x.shape[1] // 128
    perm = torch.randperm(groups, generator=gen).tolist()
    if out is None:
        out = torch.empty((x.shape[0], _n(w)), dtype=x.dtype, device=x.device)
    acc = None
    for g in perm:
        xg = x[:, 128 * g:128 * (g + 1)]
        wg = w[:, 128 * g:128 * (g + 1)].contiguous() if isinstance(w, torch.Tensor) else _pick(w, [g])
        dg = None if dots is None else torch.empty_like(dots[:, :, :1])
        part = b.real(xg, wg, None, dg)
        if dots is not None:
            dots[:, :, g:g + 1] = dg
        acc = part if acc is None else (acc.float() + part.float()).to(out.dtype)
    out.copy_(acc)
    if perm != sorted(perm):
        b.fired += 1
    return out


def _host_value(b, x, w, out, dots):
    """Reads x[0, 0] on the host and feeds it back: right in eager, but a CUDA graph keeps the
    value seen at capture, so a replay after x changed uses the old one."""
    if _capturing():
        h = b.state.get("host", 0.0)
        b.fired += 1
    else:
        h = b.state["host"] = x[0, 0].item()
    x2 = x.clone()
    x2[0, 0].fill_(h)     # a scalar kernel argument, baked into a graph (no host-to-device copy)
    return b.real(x2, w, out, dots)


def _past_the_end(b, x, w, out, dots):
    """One store just past the output's last element, where the allocation has room (a guarded
    buffer); an exactly sized buffer gets none (on the CPU it would corrupt memory)."""
    y = b.real(x, w, out, dots)
    end = y.storage_offset() + sum((s - 1) * st for s, st in zip(y.shape, y.stride())) + 1
    if (end + 1) * y.element_size() <= y.untyped_storage().nbytes():
        torch.as_strided(y, (1,), (1,), end).copy_(y[-1, -1:])
        b.fired += 1
    return y


# --- edge faults: an error planted just beyond a bound, or just inside it (a control) ------
# The bounds are derived here (SPEC §7 and the formulas documented in pq2verify/registry.py)
# with the selftest's own constants, not read from registry: a judge loosened there no longer
# flags the beyond-plant, and the selftest says so.
EDGE_U = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}     # unit roundoff of the output
EDGE_FP32_FOLD, EDGE_Q8_BUDGET = 1e-5, 0.03
# half the smallest subnormal spacing: below the normal range the output rounding is absolute
EDGE_SUB_HALF = {torch.bfloat16: 2.0 ** -134, torch.float16: 2.0 ** -25}
EDGE_FOLD_U = {"integer": 2.0 ** -24, "floating": 2.0 ** -23}        # FP32 u; tensor cores may truncate
BEYOND, INSIDE = 1.1, 0.9
# where a per-element plant may land (representable values only): beyond, and inside but moved
ELEM_WINDOW = {BEYOND: (1.02, 1.3), INSIDE: (0.7, 0.98)}


def _spacing(v: np.ndarray, dtype) -> np.ndarray:
    p, emin = {torch.bfloat16: (8, -126), torch.float16: (11, -14)}[dtype]
    _, e = np.frexp(np.abs(v))
    return np.ldexp(1.0, np.maximum(e - 1, emin) - (p - 1))


def _references(p: registry.Path, x, w) -> dict:
    """FP64 'dense', 'quantized' (integer paths) and 'abs' (the per-element bound's S) of one call."""
    from reference import pq2, projection, q8
    xc = x.detach().cpu()
    if p.weight == "dense":
        wd = w.detach().cpu().double().numpy()
        d = {"dense": projection.dense(xc, w.detach().cpu())}
        d["abs"] = np.abs(xc.double().numpy()) @ np.abs(wd).T
        return d
    wc = w.to("cpu")
    wb = dict(weight=wc.data, layout=wc.layout, n=wc.n, k=wc.k)   # the bytes: reference decodes them itself
    d = {"dense": projection.floating(xc, **wb)}
    if p.arithmetic == "floating":
        d["abs"] = np.abs(xc.double().numpy()) @ np.abs(pq2.decode(wc.data, layout=wc.layout, n=wc.n, k=wc.k)).T
        return d
    d["quantized"] = projection.quantized(xc, **wb)
    qz = q8.quantize_q8(xc)
    codes, ws = pq2.read(wc.data, layout=wc.layout, n=wc.n, k=wc.k)
    m, k = qz.q.shape
    g = k // 128
    dots = np.einsum("mgk,ngk->mng", qz.q.astype(np.int64).reshape(m, g, 128),
                     (codes.astype(np.int64) - 1).reshape(-1, g, 128))
    d["abs"] = np.einsum("mng,mg,ng->mn", np.abs(dots).astype(np.float64), qz.scales.astype(np.float64),
                         np.abs(ws.astype(np.float64)))
    return d


def _finite_rows(x):
    """(rows of x that are all finite, x with its non-finite values zeroed): a plant goes into
    finite rows only, so a row with a NaN (the NaN check's) keeps the path's own outputs."""
    fin = torch.isfinite(x)
    return fin.all(1).cpu().numpy(), torch.where(fin, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _rel(y, r) -> float:
    n = float(np.linalg.norm(r))
    return float(np.linalg.norm(y - r)) / n if n else 0.0


def _sub_floor(dtype, r) -> float:
    # ||y - r|| <= u ||r|| + h sqrt(n) when each output rounds within u |r| + h
    n = float(np.linalg.norm(r))
    return EDGE_SUB_HALF[dtype] * float(np.sqrt(np.size(r))) / n if n else 0.0


def _row_tol(p, which, dtype, refs, i) -> float:
    own = "dense" if p.arithmetic == "floating" else "quantized"
    tol_q = EDGE_U[dtype] + EDGE_FP32_FOLD + _sub_floor(dtype, refs[own][i])
    if which == "quantized" or p.arithmetic == "floating":
        return tol_q
    q, d = refs["quantized"][i], refs["dense"][i]
    nd = float(np.linalg.norm(d))
    return max(EDGE_Q8_BUDGET, _rel(q, d) + tol_q * float(np.linalg.norm(q)) / nd if nd else 0.0)


def _settle(v: torch.Tensor, r: np.ndarray, target: float) -> np.ndarray:
    """One row `v` (output dtype) with outputs moved one representable step at a time, each move
    the one that brings the row's relative RMS against `r` closest to `target`, while a move
    does. On a short row one output's step is a few % of the row's error, so the bisection on t
    alone lands up to that far past the target, by where the path's own bits put the steps
    (GPU bits put 1.1x at 1.16x, 0.9x at 0.96x); the smaller outputs' steps close that gap."""
    v = v.clone()
    goal = (target * float(np.linalg.norm(r))) ** 2
    ints_of = {2: torch.int16, 4: torch.int32}[v.element_size()]
    for _ in range(4 * v.numel()):
        ints = v.view(ints_of).to(torch.int64)
        e2 = (v.double().numpy() - r) ** 2
        ss = float(e2.sum())
        best, pick = abs(ss - goal), None
        for k in (-1, 1):      # the neighbours: one step up or down in the bit pattern
            c = (ints + k).to(ints_of).view(v.dtype)
            cd = c.double().numpy()
            with np.errstate(invalid="ignore", over="ignore"):
                gap = np.where(np.isfinite(cd), np.abs(ss - e2 + (cd - r) ** 2 - goal), np.inf)
            j = int(np.argmin(gap))
            if gap[j] < best:
                best, pick = float(gap[j]), (j, c[j])
        if pick is None:
            break
        v[pick[0]] = pick[1]
    return v.double().numpy()


def _rms_edge(which: str, factor: float):
    """Each row's relative RMS against the `which` FP64 reference set to `factor` x its bound
    (derived here): the path's output plus t * s * |R| (s a seeded sign per element), or moved
    toward R where it is farther than that, t found by bisection on the rounded output, then
    settled one output step at a time (_settle). Per row, so a row depends on nothing but
    itself (batch invariance holds)."""
    def apply(b, x, w, out, dots):
        y = b.real(x, w, out, dots)
        if _capturing():
            return y
        fin, xf = _finite_rows(x)
        refs = _references(b.path, xf, w)
        y0 = y.double().cpu().numpy()
        planted = y0.copy()
        for i in np.flatnonzero(fin):
            r, target = refs[which][i], factor * _row_tol(b.path, which, y.dtype, refs, i)
            if not np.linalg.norm(r):
                continue
            inward = _rel(y0[i], r) > target
            s = (r - y0[i]) if inward else np.random.default_rng(FOLD_SEED + i).choice([-1.0, 1.0], r.shape) * np.abs(r)

            def err(t):
                return _rel(torch.from_numpy(y0[i] + t * s).to(y.dtype).double().numpy(), r)
            lo, hi = 0.0, 1.0 if inward else 1e-4
            while not inward and err(hi) < target:
                hi *= 2
            for _ in range(50):
                mid = (lo + hi) / 2
                if (err(mid) > target) if inward else (err(mid) < target):
                    lo = mid
                else:
                    hi = mid
            planted[i] = _settle(torch.from_numpy(y0[i] + hi * s).to(y.dtype), r, target)
        if not fin.any():
            return y
        y.copy_(torch.from_numpy(planted).to(y.dtype))
        got = _rel(y.double().cpu().numpy()[fin], refs[which][fin])
        whole = _row_tol(b.path, which, y.dtype, {k: v[fin].reshape(1, -1) for k, v in refs.items()}, 0)
        b.state.setdefault("planted", f"relative RMS vs {which} {got / whole:.3f}x of {whole:.3g}")
        b.fired += 1
        return y
    return apply


def _element_edge(factor: float):
    """In each row one output moved to a representable value at about `factor` x its per-element
    bound F + spacing(|Y| + F) / 2 (derived here; Y the path's FP64 reference), the one nearest
    that among values a few steps from the path's own; a row without such a value is left alone."""
    lo_w, hi_w = ELEM_WINDOW[factor]

    def apply(b, x, w, out, dots):
        y = b.real(x, w, out, dots)
        if _capturing():
            return y
        p = b.path
        fin, xf = _finite_rows(x)
        refs = _references(p, xf, w)
        Y = refs["quantized" if p.arithmetic == "integer" and p.weight == "pq2" else "dense"]
        terms = x.shape[1] // 128 if p.arithmetic == "integer" else x.shape[1]
        f = EDGE_FOLD_U[p.arithmetic] * (terms + 2) * refs["abs"] + (terms + 2) * 2.0 ** -126
        bound = f + _spacing(np.abs(Y) + f, y.dtype) / 2
        yc = y.cpu()
        ints = yc.view({2: torch.int16}[yc.element_size()]).to(torch.int32)
        best = np.full(Y.shape[0], np.inf)
        pick = {}
        for k in [k for k in range(-6, 7) if k]:
            v = (ints + k).to(torch.int16).view(y.dtype)
            ok = (torch.sign(v.float()) == torch.sign(yc.float())) & torch.isfinite(v) & (yc != 0)
            vd = v.double().numpy()
            with np.errstate(invalid="ignore"):
                ratio = np.where(ok.numpy(), np.abs(vd - Y) / bound, np.nan)
            score = np.where((ratio >= lo_w) & (ratio <= hi_w), np.abs(ratio - factor), np.inf)
            for i in np.flatnonzero(fin):
                j = int(np.argmin(score[i]))
                if score[i, j] < best[i]:
                    best[i], pick[i] = score[i, j], (j, float(vd[i, j]), float(ratio[i, j]))
        for i, (j, v, ratio) in pick.items():
            y[i, j] = v
            b.state.setdefault("planted", f"y[{i}, {j}] at {ratio:.3f}x of its per-element bound")
        if pick:
            b.fired += 1
        return y
    return apply


def _as_counterpart(b, x, w, out, dots):
    """The path's call answered by its counterpart's kernel (a tuned path that just calls the
    legacy one): same integer dots, the counterpart's FP32 order."""
    q = registry.get(b.path.counterpart)
    if out is None:
        out = torch.empty((x.shape[0], _n(w)), dtype=x.dtype, device=x.device)
    run = q.kernel()
    y = run(x, w, out=out, dots=dots) if (dots is not None and q.has_dots) else run(x, w, out=out)
    if dots is not None and not q.has_dots:
        b.real(x, w, torch.empty_like(out), dots)          # the dots from the path itself
    b.fired += 1
    return y


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    apply: Callable = field(repr=False)
    plain: bool = True        # changes a plain call's bits (shown before the checks run)
    needs_graphs: bool = False
    target: str = ""          # an edge fault: the check (checks.CHECK_NAMES) whose bound it is at
    control: bool = False     # planted inside that bound: the target must NOT flag it

    def not_applicable(self, p: registry.Path, device: str) -> str:
        """Why this fault cannot exist for path p on this backend ('' if it can)."""
        if self.needs_graphs and device != "cuda":
            return f"n/a on {device}: needs CUDA graphs"
        if self.name == "neighbour_scale" and p.weight == "dense":
            return "n/a: a dense weight has no group scales"
        if self.name == "rows_shifted" and p.m_max == 1:
            return "n/a: the path serves M=1 only (no other row to shift)"
        if self.name == "fold_order" and not p.deterministic:
            return "n/a: the path does not claim determinism"
        if self.target == checks.RMS_QUANTIZED and p.reference != "quantized":
            return "n/a: a floating path has no quantized reference (its bound is the dense one)"
        if self.name == "as_counterpart":
            if p.counterpart is None:
                return "n/a: a legacy path has no counterpart"
            if p.bit_identical_to == p.counterpart:
                return f"n/a: the path claims bytes == {p.counterpart}; being equal to it is what it must be"
        return ""


FAULTS: tuple[Fault, ...] = (
    Fault("ulp", "one output element off by 1 ulp", _ulp),
    Fault("last_row", "the last output row left unwritten", _unwritten((-1, slice(None)))),
    Fault("last_col", "the last output column left unwritten", _unwritten((slice(None), -1))),
    Fault("stale_tile", "the output's last tile left from the previous call", _stale_tile, plain=False),
    Fault("nan_finite", "NaN activations replaced by 0 (a NaN group turned finite)", _nan_finite, plain=False),
    Fault("neighbour_scale", "each group scaled by the next group's weight scale", _neighbour_scale),
    Fault("rows_shifted", "output rows shifted down by one", _rows_shifted),
    Fault("fold_order", "split-K partials added in the output dtype in a random order on every call",
          _fold_order),
    Fault("host_value", "a host value (x[0, 0].item()) baked into a CUDA graph", _host_value,
          plain=False, needs_graphs=True),
    Fault("past_the_end", "one store just past the end of the output", _past_the_end, plain=False),
    Fault("rms_quantized_beyond", f"each row's relative RMS vs the quantized FP64 reference at {BEYOND}x its bound",
          _rms_edge("quantized", BEYOND), target=checks.RMS_QUANTIZED),
    Fault("rms_quantized_inside", f"each row's relative RMS vs the quantized FP64 reference at {INSIDE}x its bound "
          "(a control)", _rms_edge("quantized", INSIDE), target=checks.RMS_QUANTIZED, control=True),
    Fault("rms_dense_beyond", f"each row's relative RMS vs the dense FP64 reference at {BEYOND}x its bound",
          _rms_edge("dense", BEYOND), target=checks.RMS_DENSE),
    Fault("rms_dense_inside", f"each row's relative RMS vs the dense FP64 reference at {INSIDE}x its bound "
          "(a control)", _rms_edge("dense", INSIDE), target=checks.RMS_DENSE, control=True),
    Fault("element_beyond", f"one output per row just beyond its per-element bound ({ELEM_WINDOW[BEYOND][0]}-"
          f"{ELEM_WINDOW[BEYOND][1]}x)", _element_edge(BEYOND), target=checks.PER_ELEMENT),
    Fault("element_inside", f"one output per row moved but inside its per-element bound ({ELEM_WINDOW[INSIDE][0]}-"
          f"{ELEM_WINDOW[INSIDE][1]}x; a control)", _element_edge(INSIDE), target=checks.PER_ELEMENT, control=True),
    Fault("as_counterpart", "the path answered by its counterpart's kernel (a tuned path that calls the legacy "
          "one: same dots, the counterpart's fold order)", _as_counterpart, plain=False),
)
BY_NAME = {f.name: f for f in FAULTS}


# --- the cases each path is tried on ----------------------------------------------------------
def golden_entry(g: golden.Golden, p: registry.Path) -> dict | None:
    """The path's captured case with the most groups, M >= 2 first, then the smallest M."""
    es = golden.selected(g, paths=[p.name])
    return min(es, key=lambda e: (-e["k"], e["m"] < 2, e["m"], e["id"])) if es else None


# --- running the checks ---------------------------------------------------------------------
@dataclass
class Verdict:
    fault: str
    path: str
    # "caught" | "UNDETECTED" | "known hole" (no check of this backend can see it: known_hole) |
    # "n/a" | "error"; a control (a plant inside a bound): "control" when its target check passed
    # it, "FALSE ALARM" when that check flagged it
    status: str
    caught_by: list = field(default_factory=list)  # typed check names (checks.CHECK_NAMES, golden's ...)
    reason: str = ""
    details: list = field(default_factory=list)   # the checks' own messages
    cases: list = field(default_factory=list)
    repro: str = ""
    target: str = ""                              # an edge fault's check
    planted: str = ""                             # where the edge plant landed on the case

    @property
    def ok(self) -> bool:
        return self.status in ("caught", "n/a", "control", "known hole")

    def cell(self) -> str:
        others = [c for c in self.caught_by if c != self.target]
        if self.status == "caught" and self.target:
            return f"{self.target} ({self.planted})" + (f"; also {', '.join(others)}" if others else "")
        if self.status == "caught":
            return ", ".join(self.caught_by)
        if self.status == "control":
            return f"control: {self.target} passed it ({self.planted})" + (
                f"; flagged by {', '.join(others)}" if others else "")
        if self.status == "n/a":
            return self.reason
        return f"{self.status}: {self.reason}" if self.reason else self.status


class Context:
    """Per-path inputs shared by every fault (read-only for the wrappers), and each check's
    verdict on the unbroken path: a check that already fails on it cannot credit a fault."""

    def __init__(self, p: registry.Path, device: str, g: "golden.Golden | str"):
        self.p, self.device = p, device
        self.case = cases.selftest_case(p)
        self.inp = checks.Inputs(self.case, device)
        self.g, self.entry = (None, None) if isinstance(g, str) else (g, golden_entry(g, p))
        self.no_golden = g if isinstance(g, str) else (
            "" if self.entry else f"no golden case of {p.name} in {g.dir}")
        self._baseline = {}

    def graph_inputs(self, seed: int):
        c = self.case
        return graphs.make_inputs(self.p, c.m, c.n, c.k, layout=c.layout, seed=seed, device=self.device)

    def detectors(self):
        fold = self.device == "cpu" and self.p.arithmetic == "integer" and self.p.weight == "pq2"
        return [d for d in DETECTORS if (d[0] != "golden" or self.entry) and (d[0] != "graph" or self.device == "cuda")
                and (d[0] != "fold" or fold)]

    def baseline(self, name: str, detect) -> list:
        if name not in self._baseline:
            self._baseline[name] = detect(self, None)
        return self._baseline[name]


def known_hole(ctx: Context, fault: Fault) -> str:
    """Why no check of this backend can see `fault` on ctx's path, '' where one should (then an
    uncaught fault is UNDETECTED and fails the run). Only a path answered by its counterpart:
    same dots and bounds, only the FP32 order differs, which the declared-fold check alone
    compares, for integer paths on the interpreter. Golden could see it where the two orders
    round apart on its captured case; a missing capture is a missing check, never a known hole."""
    p, dev = ctx.p, ctx.device
    if fault.name != "as_counterpart" or ctx.no_golden:
        return ""
    if dev == "cpu":
        golden_says = "golden compares a floating path within a bound off its capture's ISA"
    else:
        golden_says = (f"golden's exact bytes of {ctx.entry['id']} agree (the two FP32 orders round alike "
                       "on it)")
    if p.arithmetic == "floating":
        how = ("the interpreter runs a floating path's dot as the CPU's BLAS, so no emulation gives its "
               "declared fold bit for bit" if dev == "cpu" else
               f"the declared-fold check emulates integer paths only, and {p.counterpart} "
               f"({registry.get(p.counterpart).library or 'a library'}) sums in an order of its own, not known")
    elif "fold" not in [name for name, _ in ctx.detectors()]:
        how = ("the declared-fold check runs on the interpreter only (a GPU compiler may contract the fold "
               "into an FMA, the emulation never does)")
    else:
        return ""
    return f"no check can see it on {dev}: {how}, and {golden_says}"


def _inert(ctx: Context, fault: Fault) -> str:
    """'' if the fault changes the bits of a plain call on the case, else why not. For the
    fold order: two calls must differ from each other (what a rerun would see)."""
    real, _ = checks.call(ctx.p, ctx.inp)
    b = Broken(ctx.p, fault)
    outs = [checks.call(ctx.p, ctx.inp, kernel=b, guards=[])[0] for _ in range(3 if fault.name == "fold_order" else 1)]
    if fault.name == "fold_order":
        return "" if any(not graphs.same_bits(outs[0], o) for o in outs[1:]) else \
            f"3 random fold orders gave identical bits on {ctx.case.id}"
    return "" if not graphs.same_bits(real, outs[0]) else f"no bit changed on {ctx.case.id}"


# Each detector runs one of the suite's checks with `kernel` (None: the path's own run) and
# returns (check, message) for every failure.
def _evaluate(ctx, kernel) -> list:
    r = checks.evaluate(ctx.case, ctx.device, kernel=kernel, reruns=RERUNS, inp=ctx.inp)
    return [(f.check, f.message) for f in r.records]


def _fold(ctx, kernel) -> list:
    """checks.evaluate's opt-in declared-fold check (the interpreter, integer paths)."""
    r = checks.evaluate(ctx.case, ctx.device, kernel=kernel, inp=ctx.inp, checks=("fold",))
    return [(f.check, f.message) for f in r.records]     # the check's typed name (verdicts.CHECKS)


def _golden(ctx, kernel) -> list:
    out = []
    for o in golden.verify(ctx.g, ctx.device, paths=[ctx.p.name], ids=[ctx.entry["id"]], kernel=kernel):
        if o.status == "different":
            f = verdicts.failure(o.check, o.message(), o.case.id)
            out.append((f.check, f.message))
        elif not o.ok:        # an error, a damaged or missing capture: not a verdict on the kernel
            raise RuntimeError(f"golden: {o.message()}")
    return out


def _inplace(ctx, kernel) -> list:
    (x, w), (x2, w2) = ctx.graph_inputs(1), ctx.graph_inputs(2)
    found = graphs.check_inplace_update(graphs.kernel_fn(ctx.p, kernel), x, w, x2, w2)
    return [(f.check, f.message) for f in (verdicts.failure(verdicts.INPLACE, m, ctx.case.id) for m in found)]


def _graph(ctx, kernel) -> list:
    (x, w), (x2, w2) = ctx.graph_inputs(1), ctx.graph_inputs(2)
    found = graphs.check_graph_mutation(graphs.path_call(ctx.p, x, w, kernel=kernel), x2, w2)
    return [(f.check, f.message) for f in (verdicts.failure(verdicts.GRAPH, m, ctx.case.id) for m in found)]


DETECTORS = (("evaluate", _evaluate), ("fold", _fold), ("golden", _golden), ("in-place", _inplace),
             ("graph", _graph))


def try_fault(ctx: Context, fault: Fault) -> Verdict:
    p, dev = ctx.p, ctx.device
    v = Verdict(fault.name, p.name, "n/a", repro=REPRO.format(device=dev, path=p.name, fault=fault.name),
                target=fault.target)
    v.reason = fault.not_applicable(p, dev)
    if v.reason:
        return v
    v.cases = [ctx.case.id] + ([ctx.entry["id"]] if ctx.entry else [])
    hits, fired = [], 0
    try:
        if fault.plain:
            why = _inert(ctx, fault)
            if why and fault.control and fault.target == checks.PER_ELEMENT:
                v.reason = (f"n/a: no output of {ctx.case.id} has a representable value other than the path's own "
                            f"within {ELEM_WINDOW[INSIDE][0]}-{ELEM_WINDOW[INSIDE][1]}x of its bound (the half "
                            "spacing makes up the bound: the next value is past it)")
                return v
            if why:
                v.status, v.reason = "error", f"fault inert: {why}"
                return v
        for name, detect in ctx.detectors():
            base = ctx.baseline(name, detect)
            if base:
                v.status, v.reason = "error", f"the unbroken path already fails {base[0][0]}: {base[0][1]}"
                return v
            b = Broken(p, fault)
            for check, msg in detect(ctx, b):
                hits.append(check)
                v.details.append(msg)
            fired += b.fired
            v.planted = v.planted or b.state.get("planted", "")
    except Exception as e:       # a crash in a wrapper or a check is the selftest's error, not a catch
        v.status, v.reason = "error", f"raised {type(e).__name__}: {e}"
        return v
    v.caught_by = list(dict.fromkeys(hits))
    if fault.control:
        flagged = fault.target in v.caught_by
        v.status = "FALSE ALARM" if flagged else "control"
        if flagged:
            v.reason = f"{fault.target} flagged a plant inside its bound ({v.planted})"
    elif fault.target and fault.target not in v.caught_by:
        v.status = "UNDETECTED"
        v.reason = f"{fault.target} did not flag it ({v.planted})" + (
            f"; caught only by {', '.join(v.caught_by)}" if v.caught_by else "")
    elif v.caught_by:
        v.status = "caught"
    else:
        hole = known_hole(ctx, fault) if fired else ""
        v.status = "known hole" if hole else "UNDETECTED"
        v.reason = hole or ("no check failed" if fired else "never injected: no check made the call this fault needs")
        if ctx.no_golden:
            v.reason += f" ({ctx.no_golden})"
    return v


def run(paths=None, faults=None, device=None, log=None) -> list[Verdict]:
    """Every selected fault against every selected path (default: all of both)."""
    device = device or backend.device()
    sel_p = [registry.get(n) for n in paths] if paths else list(registry.PATHS)
    sel_f = [BY_NAME[n] for n in faults] if faults else list(FAULTS)
    try:
        g = golden.load(golden.default_dir())
    except golden.NoCapture as e:         # then golden catches nothing: said in each UNDETECTED
        g = str(e)
    out = []
    for p in sel_p:
        ctx = Context(p, device, g)
        for f in sel_f:
            out.append(try_fault(ctx, f))
            if log:
                log(out[-1])
    return out


# --- report -----------------------------------------------------------------------------------
STATUSES = ("caught", "UNDETECTED", "known hole", "n/a", "error", "control", "FALSE ALARM")


def summary(verdicts: list[Verdict]) -> dict:
    count = {s: sum(v.status == s for v in verdicts) for s in STATUSES}
    return {"ok": all(v.ok for v in verdicts), **count}


def _counts(s: dict) -> str:
    return (f"{s['caught']} caught, {s['UNDETECTED']} undetected, {s['known hole']} known holes, "
            f"{s['error']} errors, {s['n/a']} n/a, {s['control']} controls passed, {s['FALSE ALARM']} false alarms")


def text_table(verdicts: list[Verdict]) -> str:
    w_f = max(len("fault"), *(len(v.fault) for v in verdicts))
    w_p = max(len("path"), *(len(v.path) for v in verdicts))
    lines = [f"{'fault':<{w_f}}  {'path':<{w_p}}  caught by", f"{'-' * w_f}  {'-' * w_p}  {'-' * 9}"]
    for v in verdicts:
        lines.append(f"{v.fault:<{w_f}}  {v.path:<{w_p}}  {v.cell()}")
        if not v.ok:
            lines.append(f"{'':<{w_f}}  {'':<{w_p}}    reproduce: {v.repro}")
    lines.append(_counts(summary(verdicts)))
    return "\n".join(lines)


def _grid(verdicts: list[Verdict]) -> tuple[list, list, dict]:
    """(faults, paths, {(fault, path): verdict}) in first-seen order: the report's table."""
    return (list(dict.fromkeys(v.fault for v in verdicts)), list(dict.fromkeys(v.path for v in verdicts)),
            {(v.fault, v.path): v for v in verdicts})


def markdown(verdicts: list[Verdict]) -> str:
    faults, paths, at = _grid(verdicts)
    s = summary(verdicts)
    prov = provenance.collect()
    out = [f"# pq2verify selftest ({backend.name()})", "",
           "- " + ", ".join(f"{k}: {prov[k]}" for k in ("date", "commit", "torch", "triton") if k in prov),
           *[f"- {w}" for w in [provenance.status_line(prov)] if w], "",
           _counts(s) + ".",
           "Each cell: the checks that caught the fault (an edge fault's target check first, with where its "
           "plant landed); a control is a plant inside a bound, which its target check must pass.", "",
           "| fault | " + " | ".join(paths) + " |", "|---" * (len(paths) + 1) + "|"]
    for f in faults:
        out.append(f"| {f} | " + " | ".join(at[(f, p)].cell() if (f, p) in at else "" for p in paths) + " |")
    out += ["", "Faults:", ""] + [f"- `{f}`: {BY_NAME[f].what}" for f in faults]
    bad = [v for v in verdicts if not v.ok]
    if bad:
        out += ["", "Not caught, or a control flagged:", ""] + [
            f"- {v.fault} x {v.path}: {v.cell()}; reproduce: `{v.repro}`" for v in bad]
    holes = [v for v in verdicts if v.status == "known hole"]
    if holes:       # they pass the run, so they are listed where nobody can miss them
        out += ["", "Known holes (no check of this backend can see them; not counted as caught):", ""] + [
            f"- {v.fault} x {v.path}: {v.reason}; reproduce: `{v.repro}`" for v in holes]
    return "\n".join(out) + "\n"


def html(verdicts: list[Verdict]) -> str:
    """The markdown report's content as one self-contained page: the verdict line first, then
    the fault x path table (a row with a fault not caught, a flagged control or an error is
    marked), the faults missed with their reproduce lines, and the known holes."""
    from .report import html as h
    faults, paths, at = _grid(verdicts)
    s = summary(verdicts)
    tested = sum(v.status != "n/a" for v in verdicts)
    ok = s["ok"] and tested > 0
    head = "PASS" if ok else "FAIL"
    body = [h.verdict(ok, f"{head}: {_counts(s)}" + ("" if tested else "; no selected fault was applicable")),
            h.meta(provenance.collect())]
    rows = [[f] + [at[(f, p)].cell() if (f, p) in at else "" for p in paths] for f in faults]
    marks = ["fail" if any((f, p) in at and not at[(f, p)].ok for p in paths) else "" for f in faults]
    body.append(h.table(["fault"] + paths, rows, marks))
    bad = [v for v in verdicts if not v.ok]
    if bad:
        body.append(h.problems("Not caught, or a control flagged:",
                               [f"{v.fault} x {v.path}: {v.cell()}; reproduce: {v.repro}" for v in bad]))
    holes = [v for v in verdicts if v.status == "known hole"]
    if holes:
        body.append(h.problems("Known holes (no check of this backend can see them; not counted as caught):",
                               [f"{v.fault} x {v.path}: {v.reason}; reproduce: {v.repro}" for v in holes]))
    body.append(h.table(["fault", "what it plants"], [[f, BY_NAME[f].what] for f in faults if f in BY_NAME]))
    return h.page(f"pq2verify selftest ({backend.name()})", body)


def to_json(verdicts: list[Verdict], device: str) -> dict:
    return {"device": device, "provenance": provenance.collect(), "summary": summary(verdicts),
            "faults": {f.name: f.what for f in FAULTS}, "verdicts": [asdict(v) for v in verdicts]}
