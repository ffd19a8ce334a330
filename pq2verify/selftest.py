"""The suite's own power: for every registry path, run the suite's checks against deliberately
broken variants of that path and record which check caught each fault.

A fault is a wrapper around the path's real run(x, w, *, out=None, dots=None): output-level
(an element off by 1 ulp, a row or column left unwritten, a tile left from the previous call,
rows shifted, a store past the end) or input-level (NaN activations turned finite, the next
group's weight scale, a fold order that changes on every call, a host value baked into a CUDA
graph). The checks are the suite's own, unchanged:
- checks.evaluate (rms, per-element, written, dots, exactness claim, determinism, batch
  invariance, NaN propagation, guard band),
- the golden captures of this backend (golden.verify on one committed case of the path),
- graphs.check_inplace_update, and on CUDA graphs.check_graph_mutation.
Each check gets a fresh broken wrapper (its state never crosses checks). A fault that no check
catches is a hole in the suite; a fault that cannot exist for a path or backend is 'n/a' with the
reason, never counted as caught. Before the checks, a fault meant to change a plain call's bits
is shown to change them on the case (an inert fault would make 'undetected' meaningless), and
each check is run once on the unbroken path: one that already fails there makes the verdict an
error, never a catch. A crash in a wrapper or a check is an error too.
"""
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from . import backend, cases, checks, golden, graphs, provenance, registry
from .weights import PQ2Weight

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


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    apply: Callable = field(repr=False)
    plain: bool = True        # changes a plain call's bits (shown before the checks run)
    needs_graphs: bool = False

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
    status: str                                   # "caught" | "UNDETECTED" | "n/a" | "error"
    caught_by: list = field(default_factory=list)
    reason: str = ""
    details: list = field(default_factory=list)   # the checks' own messages
    cases: list = field(default_factory=list)
    repro: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("caught", "n/a")

    def cell(self) -> str:
        if self.status == "caught":
            return ", ".join(self.caught_by)
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
        return [d for d in DETECTORS if (d[0] != "golden" or self.entry) and (d[0] != "graph" or self.device == "cuda")]

    def baseline(self, name: str, detect) -> list:
        if name not in self._baseline:
            self._baseline[name] = detect(self, None)
        return self._baseline[name]


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
    return list(zip(r.failed, r.failures))     # the check's typed name (checks.CHECK_NAMES)


def _golden(ctx, kernel) -> list:
    out = []
    for o in golden.verify(ctx.g, ctx.device, paths=[ctx.p.name], ids=[ctx.entry["id"]], kernel=kernel):
        if o.status == "different":
            out.append(("golden bytes" if o.comparison.startswith("exact") else "golden bound", o.message()))
        elif not o.ok:        # an error, a damaged or missing capture: not a verdict on the kernel
            raise RuntimeError(f"golden: {o.message()}")
    return out


def _inplace(ctx, kernel) -> list:
    (x, w), (x2, w2) = ctx.graph_inputs(1), ctx.graph_inputs(2)
    return [("in-place update", f) for f in graphs.check_inplace_update(graphs.kernel_fn(ctx.p, kernel), x, w, x2, w2)]


def _graph(ctx, kernel) -> list:
    (x, w), (x2, w2) = ctx.graph_inputs(1), ctx.graph_inputs(2)
    return [("graph mutation", f) for f in graphs.check_graph_mutation(graphs.path_call(ctx.p, x, w, kernel=kernel), x2, w2)]


DETECTORS = (("evaluate", _evaluate), ("golden", _golden), ("in-place", _inplace), ("graph", _graph))


def try_fault(ctx: Context, fault: Fault) -> Verdict:
    p, dev = ctx.p, ctx.device
    v = Verdict(fault.name, p.name, "n/a", repro=REPRO.format(device=dev, path=p.name, fault=fault.name))
    v.reason = fault.not_applicable(p, dev)
    if v.reason:
        return v
    v.cases = [ctx.case.id] + ([ctx.entry["id"]] if ctx.entry else [])
    hits, fired = [], 0
    try:
        if fault.plain:
            why = _inert(ctx, fault)
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
    except Exception as e:       # a crash in a wrapper or a check is the selftest's error, not a catch
        v.status, v.reason = "error", f"raised {type(e).__name__}: {e}"
        return v
    v.caught_by = list(dict.fromkeys(hits))
    if v.caught_by:
        v.status = "caught"
    else:
        v.status = "UNDETECTED"
        v.reason = "no check failed" if fired else "never injected: no check made the call this fault needs"
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
def summary(verdicts: list[Verdict]) -> dict:
    count = {s: sum(v.status == s for v in verdicts) for s in ("caught", "UNDETECTED", "n/a", "error")}
    return {"ok": all(v.ok for v in verdicts), **count}


def text_table(verdicts: list[Verdict]) -> str:
    w_f = max(len("fault"), *(len(v.fault) for v in verdicts))
    w_p = max(len("path"), *(len(v.path) for v in verdicts))
    lines = [f"{'fault':<{w_f}}  {'path':<{w_p}}  caught by", f"{'-' * w_f}  {'-' * w_p}  {'-' * 9}"]
    for v in verdicts:
        lines.append(f"{v.fault:<{w_f}}  {v.path:<{w_p}}  {v.cell()}")
        if not v.ok:
            lines.append(f"{'':<{w_f}}  {'':<{w_p}}    reproduce: {v.repro}")
    s = summary(verdicts)
    lines.append(f"{s['caught']} caught, {s['UNDETECTED']} undetected, {s['error']} errors, {s['n/a']} n/a")
    return "\n".join(lines)


def markdown(verdicts: list[Verdict]) -> str:
    faults = list(dict.fromkeys(v.fault for v in verdicts))
    paths = list(dict.fromkeys(v.path for v in verdicts))
    at = {(v.fault, v.path): v for v in verdicts}
    s = summary(verdicts)
    prov = provenance.collect()
    out = [f"# pq2verify selftest ({backend.name()})", "",
           "- " + ", ".join(f"{k}: {prov[k]}" for k in ("date", "commit", "torch", "triton") if k in prov), "",
           f"{s['caught']} caught, {s['UNDETECTED']} undetected, {s['error']} errors, {s['n/a']} not applicable.",
           "Each cell: the checks that caught the fault.", "",
           "| fault | " + " | ".join(paths) + " |", "|---" * (len(paths) + 1) + "|"]
    for f in faults:
        out.append(f"| {f} | " + " | ".join(at[(f, p)].cell() if (f, p) in at else "" for p in paths) + " |")
    out += ["", "Faults:", ""] + [f"- `{f}`: {BY_NAME[f].what}" for f in faults]
    bad = [v for v in verdicts if not v.ok]
    if bad:
        out += ["", "Not caught:", ""] + [f"- {v.fault} x {v.path}: {v.cell()}; reproduce: `{v.repro}`" for v in bad]
    return "\n".join(out) + "\n"


def to_json(verdicts: list[Verdict], device: str) -> dict:
    return {"device": device, "provenance": provenance.collect(), "summary": summary(verdicts),
            "faults": {f.name: f.what for f in FAULTS}, "verdicts": [asdict(v) for v in verdicts]}
