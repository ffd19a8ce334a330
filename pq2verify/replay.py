"""Real-activation replay: every captured PQ2 projection call of the GSM8K model
(`golden capture --model`, golden/<key>/model) is run under kernel spec A and under B on the
same inputs and compared with the FP64 references and with each other. It is the gate for a
kernel change: model-level metrics (GSM8K answers, KL) cannot tell a sub-ulp scale fault from
FP32 fold noise, this can (issue 14).

Each side of each call must meet the check engine's bounds (pq2verify/checks.py, registry
tolerances): relative RMS against the path's FP64 references, the per-element bound
|y - Y| <= F + spacing(|Y| + F) / 2 (registry.FOLD_UNIT), integer group dots equal to the exact
ones, and A's dots equal to B's where both write them. And its error must be unbiased (BIAS_WHY).

A and B must compare two different things: dispatch's choice for each call (resolve_paths) is
decided before the run and must differ between them in path or fold order, and the dispatch
trace of every call must show it.

Faults (`FAULTS`) are B-side variants that wrap the weight or the call's output, never the
kernels, each directed one planted both ways; `fold_reversed` is the control: the same
arithmetic in another valid FP32 order, void (a failure) where it equals A.
"""
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from kernels import dispatch
from kernels.format import PQ2Weight
from . import golden, golden_model, registry, verdicts

# the bias test's threshold and the Q8 allowance's reason live with the other bounds
from .numerics import BIAS_ALPHA, BIAS_WHY, Q8_WHY, bias, bias_threshold  # noqa: E402,F401
STALE_TILE_N = 8     # the H200 single/int_gemv kernels' BN: one program's output tile


class ReplayError(ValueError):
    """A capture or model that cannot be replayed (missing, or its weights differ)."""


class MissingCapture(ReplayError):
    """No model capture in the folder (the CLI adds the command that makes one)."""


@dataclass
class Call:
    key: str
    layer: str        # the PQ2 weight's name
    kind: str         # the name without the model's layer index, e.g. 'mlp.down_proj'
    position: int | str   # the captured decode position; 'M<m>' for a batched call (batched())
    x: torch.Tensor   # on the device
    distinct: int = 0  # a batched call's distinct rows (its first ones; the rest repeat them); 0: all


_INDEX = re.compile(r"(?:^|\.)(\d+)\.(.+)$")


def kind_of(layer: str) -> str:
    m = _INDEX.search(layer)
    return m.group(2) if m else layer


def layer_index(layer: str) -> int | None:
    m = _INDEX.search(layer)
    return int(m.group(1)) if m else None


def default_capture(key: str) -> Path:
    """This backend's model capture if there is one, else the committed H200 one (the inputs
    are activations: any backend's serve)."""
    own = golden.default_dir(key) / "model"
    return own if (own / golden.MANIFEST).exists() else golden.default_dir("sm90") / "model"


def load(capture: Path, device, runner, *, positions=None, layers=None, limit=None, ms=(1,)):
    """(manifest, [Call], {name: PQ2Weight on device}) for the selected records. The weights are
    re-derived by the model runner and must hash to the captured ones. ms: the call sizes M
    replayed; M = 1 is one call per captured position, M > 1 two calls per weight whose rows are
    that weight's captured positions repeated to M rows (the second rotated by one row), so the
    paths that serve a decode batch run on real activations too (batched())."""
    if not (Path(capture) / golden.MANIFEST).exists():
        raise MissingCapture(f"--capture {capture}: no model capture there ({Path(capture) / golden.MANIFEST} "
                             "is missing)")
    try:
        g = golden.load(capture)
    except (golden.NoCapture, golden.GoldenIntegrityError) as e:
        raise ReplayError(f"--capture {capture}: {e}") from None
    man = g.manifest
    if man.get("kind") != "model":
        raise ReplayError(f"--capture {capture}: not a model capture (golden capture --model writes one)")
    recs = man["records"]
    have = sorted({r["position"] for r in recs})
    if positions is not None:
        bad = sorted(set(positions) - set(have))
        if bad:
            raise ReplayError(f"--positions {','.join(map(str, bad))}: not captured; the capture has {have}")
        recs = [r for r in recs if r["position"] in positions]
    if layers is not None:
        recs = [r for r in recs if layers in r["layer"]]
        if not recs:
            names = sorted({r["layer"] for r in man["records"]})
            raise ReplayError(f"--layers {layers!r}: matches no captured weight, e.g. {names[:2]}")
    if limit is not None:
        recs = recs[:limit]
    conv = golden_model.checked(runner).prepare(None, None, device)
    by_name = {name: w for name, w in golden_model.pq2_weights(conv.model).values()}
    weights = {}
    for r in recs:
        name = r["layer"]
        if name in weights:
            continue
        w = by_name.get(name)
        if w is None:
            raise ReplayError(f"the model has no PQ2 weight {name} (capture of model {man.get('model_id')})")
        if golden.tensor_sha256(w.data) != r["weight_sha256"]:
            raise ReplayError(f"{name}: the model's weight differs from the one captured in {capture} (model "
                              f"{man.get('model_id')} at {man.get('digits')} digits): capture again, "
                              "`pq2verify golden capture --model`, or replay with --capture DIR --capture-first")
        weights[name] = w
    t = g.tensors("model.safetensors")
    calls = [Call(r["key"], r["layer"], kind_of(r["layer"]), r["position"], t[r["key"] + "/x"].to(device))
             for r in recs]
    return man, batched(calls, ms), weights


def batched(calls: list, ms) -> list:
    """The M = 1 calls (if 1 is in ms) and, per M > 1, two calls per weight of M rows: its
    captured rows cycled from row 0, then from row 1. position is 'M<m>' for those."""
    out = [c for c in calls if 1 in ms]
    by_layer = {}
    for c in calls:
        by_layer.setdefault(c.layer, []).append(c.x)
    for m in sorted(v for v in set(ms) if v > 1):
        for layer, xs in by_layer.items():
            x = torch.cat(xs)
            for r in range(2):
                idx = torch.tensor([(r + i) % x.shape[0] for i in range(m)], device=x.device)
                out.append(Call(f"{layer}/M{m}.{r}", layer, kind_of(layer), f"M{m}", x.index_select(0, idx),
                                min(m, x.shape[0])))
    return out


# --- FP64 references, once per weight for all of its calls (rows are independent) ----------
class References:
    def __init__(self, calls, weights):
        self.weights, self._c = weights, {}
        self.x = {c.key: c.x for c in calls}
        self.rows = {}
        for c in calls:
            self.rows.setdefault(c.layer, []).append(c.key)

    def _weight(self, name):
        if name not in self._c:
            from reference import pq2, projection, q8
            w = self.weights[name].to("cpu")
            wb = dict(weight=w.data, layout=w.layout, n=w.n, k=w.k)   # the bytes: reference decodes them itself
            keys = self.rows[name]
            x = torch.cat([self.x[k].cpu() for k in keys])
            dots = projection.group_dots(x, **wb)
            xs = q8.quantize_q8(x).scales.astype(np.float64)
            ws = np.abs(pq2.read(w.data, layout=w.layout, n=w.n, k=w.k)[1].astype(np.float64))
            abs_q = np.einsum("mng,mg,ng->mn", np.abs(dots).astype(np.float64), xs, ws)
            self._c[name] = dict(x=x, w=w, quantized=projection.quantized(x, **wb), dense=projection.floating(x, **wb),
                                 dots=dots, abs_integer=abs_q)
        return self._c[name]

    def get(self, c: Call, what: str) -> np.ndarray:
        """'quantized' | 'dense' | 'dots' | 'abs_integer' | 'abs_floating' rows of call c."""
        d = self._weight(c.layer)
        if what == "abs_floating" and what not in d:
            from reference import pq2, projection
            w = d["w"]
            d[what] = projection.dense(d["x"].abs(), np.abs(pq2.decode(w.data, layout=w.layout, n=w.n, k=w.k)))
        start = sum(self.x[k].shape[0] for k in self.rows[c.layer][:self.rows[c.layer].index(c.key)])
        return d[what][start:start + c.x.shape[0]]


# --- faults: B-side variants of the weight or of the call's output --------------------------
def _scales_changed(w: PQ2Weight, fn) -> PQ2Weight:
    """A copy of w whose fp16 scale plane [N, G] is replaced by fn(scales)."""
    p = w.to_prepared()
    flat = p.data.clone()
    cut = w.n * w.k // 4
    s = flat[cut:].view(torch.float16).view(w.n, w.groups)
    s.copy_(fn(s.clone()))
    out = PQ2Weight(flat, w.n, w.k, "prepared")
    return out if w.layout == "prepared" else out.to_raw()


def _ulp_up(s):
    # +1 in the bits is the next fp16 away from zero for either sign (scales are finite)
    return (s.view(torch.int16) + 1).view(torch.float16)


def _ulp_down(s):
    # -1 in the bits is the next fp16 toward zero for either sign; a zero scale stays zero
    # (its bits - 1 would be a NaN)
    return torch.where(s == 0, s, (s.view(torch.int16) - 1).view(torch.float16))


def _last_group_zero(s):
    s[:, -1] = 0
    return s


def _refold(x, w, dots, dtype, *, reverse=False, rounding="nearest"):
    """sum over groups (0..G-1, or G-1..0) of (dot * xs) * ws in FP32 from 0.0 on the call's own
    dots, rounded once to dtype: to nearest (the integer paths' expression in another valid
    order), or toward +inf / -inf (an output conversion that rounds the wrong way)."""
    from kernels.emulation import quantize_q8
    _, xs = quantize_q8(x)
    ws = w.scales_matrix().to(torch.float32)
    acc = torch.zeros(dots.shape[:2], dtype=torch.float32, device=dots.device)
    for g in (reversed(range(w.groups)) if reverse else range(w.groups)):
        acc = acc + (dots[:, :, g].to(torch.float32) * xs[:, g:g + 1]) * ws[:, g]
    y = acc.to(dtype)
    if rounding == "nearest":
        return y
    up = rounding == "up"
    wrong = (y.float() < acc) if up else (y.float() > acc)     # rounded to nearest on the other side
    b = y.view(torch.int16)
    pos, neg = y > 0, y < 0
    # the next value up (down) in the bits: away from zero for a positive (negative) y, toward
    # zero for the other sign, and the smallest subnormal of the right sign from a zero
    step = torch.where(pos, b + (1 if up else -1), torch.where(neg, b + (-1 if up else 1),
                                                               torch.full_like(b, 1 if up else -32767)))
    return torch.where(wrong, step, b).view(dtype)


def _refold_reversed(x, w, dots, dtype):
    """The control: the integer paths' expression in descending group order (see _refold)."""
    return _refold(x, w, dots, dtype, reverse=True)


# name -> (expected verdict, what it plants, default target); every fault with a direction is
# planted both ways (a one-sided judge would pass the other)
FAULTS = {
    "fold_reversed": ("PASS", "B's own integer group dots folded in descending group order: the same "
                      "arithmetic in another valid FP32 order (arithmetic noise, the control)", "all"),
    "scale_ulp": ("FAIL", "every fp16 weight scale of the target +1 ulp (away from zero)", None),
    "scale_ulp_down": ("FAIL", "every fp16 weight scale of the target -1 ulp (toward zero)", None),
    "scale_1pct": ("FAIL", "every fp16 weight scale of the target x1.01", None),
    "scale_1pct_down": ("FAIL", "every fp16 weight scale of the target x0.99", None),
    "drop_group": ("FAIL", "the last K-group of every row of the target zeroed (a K loop one "
                   "iteration short)", None),
    "stale_tile": ("FAIL", f"one output tile ({STALE_TILE_N} columns from n=0) of the target's second "
                   "replayed call taken from its previous call", None),
    "round_up": ("FAIL", "the target's output rounded toward +inf instead of to nearest (B's own dots "
                 "folded in ascending order; an offset up)", None),
    "round_down": ("FAIL", "the target's output rounded toward -inf instead of to nearest (B's own dots "
                   "folded in ascending order; an offset down)", None),
    # inside every per-call bound by construction: the linked chain (chain.py) must catch it
    "coherent": ("PASS", "the target gate_up's outputs moved within their per-element bounds, lined up "
                 "with a row of the down weight (chain.FAULT_WHY): per-call PASS, chain FAIL",
                 "mlp.gate_proj+up_proj"),
}
CONTROL = "fold_reversed"
_SCALE = {"scale_ulp": _ulp_up, "scale_ulp_down": _ulp_down,
          "scale_1pct": lambda s: (s.float() * 1.01).to(torch.float16),
          "scale_1pct_down": lambda s: (s.float() * 0.99).to(torch.float16),
          "drop_group": _last_group_zero}


@dataclass
class Fault:
    name: str
    targets: list          # weight names it touches
    where: str             # the selector as given (or the default), for repro lines
    _w: dict = field(default_factory=dict)
    _seen: dict = field(default_factory=dict)
    context: dict = field(default_factory=dict)   # coherent: {"refs": References, "weights": {name: w}}

    @property
    def spec(self) -> str:
        return f"{self.name}:{self.where}"

    def reset(self) -> None:
        """Forget the faulted weights and calls seen (one run's state)."""
        self._w.clear()
        self._seen.clear()

    def weight(self, name: str, w: PQ2Weight) -> PQ2Weight:
        fn = _SCALE.get(self.name)
        if fn is None or name not in self.targets:
            return w
        if name not in self._w:
            self._w[name] = _scales_changed(w, fn)
        return self._w[name]

    def output(self, c: Call, w, y, dots, prev, path=None):
        if c.layer not in self.targets:
            return y
        if self.name == "coherent":
            from . import chain
            down = c.layer[: -len(chain.GATE_UP)] + chain.DOWN
            weights = self.context["weights"]
            (ch,) = chain.chains_of([c], {c.layer: w, down: weights[down]})
            return chain.coherent_output(c, y, path, self.context["refs"], chain.folded_down(weights[down], ch),
                                         ch.inter)
        if self.name in ("fold_reversed", "round_up", "round_down"):
            if dots is None:
                raise ReplayError(f"fault {self.name}: B's path for {c.key} writes no integer dots "
                                  "(a floating path has no group fold to reorder)")
            if self.name == "fold_reversed":
                return _refold_reversed(c.x, w, dots.to(y.device), y.dtype)
            return _refold(c.x, w, dots.to(y.device), y.dtype, rounding=self.name.split("_")[1])
        if self.name == "stale_tile":     # the second call of each (weight, M)
            n = self._seen.get((c.layer, c.x.shape[0]), 0)
            self._seen[(c.layer, c.x.shape[0])] = n + 1
            if n == 1:
                y = y.clone()
                y[:, :STALE_TILE_N] = prev[:, :STALE_TILE_N]
        return y


def check_fault_name(spec: str, opt: str = "--fault") -> str:
    """The fault's name; opt: the option it came from (--fault or --faults), named in errors."""
    name = spec.partition(":")[0]
    if name not in FAULTS:
        raise ReplayError(f"{opt} {spec!r}: unknown fault {name!r}; expected one of {', '.join(FAULTS)}")
    return name


def _two_inputs(calls: list, layer: str) -> bool:
    """Whether some M has two calls of `layer` on different inputs (a stale tile can show)."""
    by_m = {}
    for c in calls:
        if c.layer == layer:
            by_m.setdefault(c.x.shape[0], []).append(c.x)
    return any(len(xs) > 1 and not torch.equal(xs[0], xs[1]) for xs in by_m.values())


def parse_fault(spec: str, calls: list, opt: str = "--fault") -> Fault:
    """NAME[:WHERE], WHERE: 'all', a layer index (every projection of that layer) or a
    substring of weight names; default: FAULTS' default, else the first replayed weight."""
    name, where = check_fault_name(spec, opt), spec.partition(":")[2]
    names = list(dict.fromkeys(c.layer for c in calls))
    where = where or FAULTS[name][2] or names[0]
    if where == "all":
        targets = list(names)
    elif where.isdigit():
        targets = [n for n in names if layer_index(n) == int(where)]
    else:
        targets = [n for n in names if where in n]
    if not targets:
        raise ReplayError(f"{opt} {spec!r}: {where!r} matches no replayed weight, e.g. {names[:2]}")
    if name == "coherent":
        from . import chain
        have = set(names)
        if where == "all":      # every gate_up of the selection: the fault has no meaning elsewhere
            targets = [t for t in targets if t.endswith(chain.GATE_UP)] or targets
        bad = [t for t in targets if not t.endswith(chain.GATE_UP) or t[: -len(chain.GATE_UP)] + chain.DOWN not in have]
        if bad:
            raise ReplayError(f"{opt} {spec!r}: targets a gate_up weight whose layer's down_proj is replayed too "
                              f"(it lines up with the down weight); {bad[0]} is not one: replay e.g. --layers "
                              "layers.0.mlp")
    if name == "stale_tile" and not any(_two_inputs(calls, t) for t in targets):
        raise ReplayError(f"{opt} {spec!r}: needs two replayed calls of a target (the tile comes from the "
                          "previous call); replay more positions")
    return Fault(name, targets, where)


# --- running one side -----------------------------------------------------------------------
@dataclass
class Out:
    path: str
    y: torch.Tensor            # CPU
    dots: torch.Tensor | None  # CPU int64 [M, N, G], None for a path without integer dots
    dots_from: str = ""        # "kernel" | "emulation"
    notes: list = field(default_factory=list)


def _call(x, w, emulated_dots):
    """The dispatched call, and its integer group dots from the same path's kernel (dots=; the
    emulation has no kernel: its shared integer GEMM gives them, the same for every path, so
    `emulated_dots()` computes them once per call)."""
    with dispatch.trace() as t:
        y = dispatch.pq2_matmul(x, w)
    (path,) = t
    p = registry.get(path)
    dots, src, notes = None, "", []
    if p.has_dots:
        if dispatch.backend_key(x.device) == "emulate":
            dots, src = emulated_dots(), "emulation"
        else:
            dots = torch.empty((x.shape[0], w.n, w.groups), dtype=torch.int32, device=x.device)
            y2 = p.kernel()(x, w, dots=dots)
            src = "kernel"
            if not torch.equal(y2.view(torch.int16), y.view(torch.int16)):
                notes.append(f"{path}: the output with dots= differs from the dispatched call's")
    return y, path, dots, src, notes


def _emulated_dots(c: Call, w: PQ2Weight, cache: dict):
    def get():
        if c.key not in cache:     # faults change scales, never codes: one set per call
            from kernels import emulation
            q, _ = emulation.quantize_q8(c.x)
            cache[c.key] = emulation.group_dots(q, w).permute(1, 2, 0).to(torch.int32)
        return cache[c.key]
    return get


def run_side(spec: dict, calls, weights, fault: Fault | None = None, log=None, cache=None) -> list[Out]:
    """Every call under kernel spec `spec` (with B's variant `fault`). cache: a dict shared by
    the runs of one replay (the emulation's dots)."""
    from kernels import use
    from .gsm8k.runs import run_spec
    outs, prev = [], {}
    cache = {} if cache is None else cache
    if fault is not None:
        fault.reset()
    with use(run_spec(spec)):
        for i, c in enumerate(calls):
            w = weights[c.layer] if fault is None else fault.weight(c.layer, weights[c.layer])
            y, path, dots, src, notes = _call(c.x, w, _emulated_dots(c, weights[c.layer], cache))
            if fault is not None:
                y = fault.output(c, w, y, dots, prev.get((c.layer, c.x.shape[0])), path=path)
            prev[(c.layer, c.x.shape[0])] = y
            outs.append(Out(path, y.cpu(), None if dots is None else dots.cpu().to(torch.int64), src, notes))
            if log and (i + 1) % 60 == 0:
                log(f"  {i + 1}/{len(calls)} calls")
    if fault is not None:
        fault.reset()      # its weights (and their emulation caches) are not kept past the run
    return outs


# --- what A and B run: the dispatch choice before the run, the trace after it ----------------
def resolve_paths(spec: dict, calls, weights) -> list[str]:
    """The path dispatch chooses under kernel spec `spec` for each call, from its shape, M,
    dtype, layout and device alone (dispatch.resolve, the function pq2_matmul calls), without
    running anything."""
    from kernels import use
    from .gsm8k.runs import run_spec
    out, seen = [], {}
    with use(run_spec(spec)):
        kset = dispatch.kernel_set()
        for c in calls:
            k = (c.layer, c.x.shape[0])
            if k not in seen:
                try:
                    seen[k] = dispatch.resolve(c.x.shape[0], weights[c.layer], c.x, kset).name
                except ValueError as e:
                    raise ReplayError(f"{c.key}: {e}") from None
            out.append(seen[k])
    return out


def fold_plan(path: str, m: int, w: PQ2Weight, key: str):
    """The path's FP32 order for this call as splits -> lanes -> groups (emulation.kernel_plan,
    from the kernel file's own fold()), or None where it declares none."""
    from kernels import emulation
    try:
        return emulation.kernel_plan(path, m, w, interpret=key == "interpreter")
    except TypeError:
        return None


def control_plan(w: PQ2Weight) -> list:
    """fold_reversed's order: one split, one lane, groups G-1..0."""
    return [[list(reversed(range(w.groups)))]]


def describe_plan(plan) -> str:
    if plan is None:
        return "undeclared"
    lanes = {len(s) for s in plan}
    runs = [lane for s in plan for lane in s if len(lane) > 1]     # a lane of one group has no order
    up = all(r == sorted(r) for r in runs)
    down = bool(runs) and all(r == sorted(r, reverse=True) for r in runs)
    order = "descending" if down else "ascending" if up else "in mixed orders"
    n = sum(len(lane) for s in plan for lane in s)
    return f"{len(plan)} split(s) x {'/'.join(map(str, sorted(lanes)))} lane(s), {n} groups {order}"


def same_thing(calls, weights, paths_a, paths_b, key: str) -> list[dict]:
    """Per (kind, M): the paths A and B run and the calls on which they are the same path with
    the same fold order, i.e. where the A/B compares nothing."""
    rows = {}
    for c, a, b in zip(calls, paths_a, paths_b):
        m = c.x.shape[0]
        r = rows.setdefault((c.kind, m), {"kind": c.kind, "m": m, "a": [], "b": [], "calls": 0, "same": 0,
                                          "a_fold": "", "b_fold": ""})
        w = weights[c.layer]
        pa, pb = fold_plan(a, m, w, key), fold_plan(b, m, w, key)
        r["calls"] += 1
        r["same"] += a == b and pa == pb
        for side, p, plan in (("a", a, pa), ("b", b, pb)):
            if p not in r[side]:
                r[side].append(p)
            r[f"{side}_fold"] = r[f"{side}_fold"] or describe_plan(plan)
    return [rows[k] for k in sorted(rows, key=lambda k: (k[1], k[0]))]


# --- metrics and verdicts -------------------------------------------------------------------
def side_metrics(c: Call, out: Out, refs: References) -> dict:
    """The check engine's verdicts (pq2verify.verdicts) for one side of one call, plus the bias
    statistics. "failures": the messages, "failed": the check of each (verdicts.CHECKS)."""
    p = registry.get(out.path)
    dt = out.y.dtype
    y64 = out.y.double().numpy()
    fails = [verdicts.failure(verdicts.DOTS_CALL, n, c.key) for n in out.notes]
    r = {"path": out.path, "failures": [], "q8_error": None}
    integer = p.arithmetic == "integer"
    for v in verdicts.rms(p, y64, lambda which: refs.get(c, which), dt):
        if v.q8_error is not None:
            r["q8_error"] = v.q8_error
        r[f"rel_rms_{v.which}"], r[f"tol_{v.which}"] = v.err, v.tol
        if not v.ok:
            fails.append(verdicts.failure(v.check, f"{out.path}: relative RMS vs {v.which} FP64 {v.err:.3g} > "
                                                   f"tolerance {v.tol:.3g}", c.key))
    ref = refs.get(c, p.reference)
    e = verdicts.element(p, c.x.shape[1], out.y, ref, refs.get(c, "abs_integer" if integer else "abs_floating"), dt)
    r["elem_ratio"], r["elem_outside"] = e.ratio, e.outside
    r["max_ulp"] = e.max_ulp
    if e.outside:
        i, j = e.first
        fails.append(verdicts.failure(
            verdicts.PER_ELEMENT, f"{out.path}: per-element bound: {e.outside} of {e.size} outputs outside "
            f"(worst {e.ratio:.3g}x); first y[{i}, {j}] = {float(e.y[i, j])!r} vs FP64 {float(ref[i, j])!r}",
            f"{c.key} y[{i}, {j}]"))
    r["dots_exact"] = None
    if out.dots is not None:
        first = verdicts.dots(out.dots.numpy(), refs.get(c, "dots"))
        r["dots_exact"] = first is None
        if first is not None:
            m_, n_, g_ = first
            fails.append(verdicts.failure(
                verdicts.DOTS, f"{out.path}: integer group dots ({out.dots_from}) differ from the exact ones, "
                f"first at m={m_}, n={n_}, group {g_}", f"{c.key} dots[{m_}, {n_}, {g_}]"))
    r["failures"][:] = verdicts.messages(fails)
    r["failed"] = verdicts.names(fails)
    # over distinct rows only: a repeated row repeats its errors, which the t statistic would
    # count as independent evidence (a correct path read as biased at M = 16 from 3 rows)
    d = c.distinct or None
    r["t_scale"], r["t_offset"] = bias(y64[:d], ref[:d], dt)
    return r


def pair_metrics(a: Out, b: Out, fault: Fault | None, where: str = "") -> dict:
    from reference import metrics
    r = {"rel_rms": metrics.relative_rms(b.y, a.y), "max_ulp": metrics.max_ulp(b.y, a.y),
         "bit_equal": metrics.bitwise_equal(b.y, a.y), "dots_equal": None, "failures": []}
    fails = []
    if a.dots is not None and b.dots is not None:
        r["dots_equal"] = bool(torch.equal(a.dots, b.dots))
        if not r["dots_equal"]:
            fails.append(verdicts.failure(verdicts.DOTS_AB, f"A ({a.path}) and B ({b.path}) integer group dots differ",
                                          where))
    pb = registry.get(b.path)
    claimed = pb.bit_identical_to == a.path or (a.path == b.path and pb.deterministic)
    if fault is None and claimed and not r["bit_equal"]:   # a variant of B is another function
        fails.append(verdicts.failure(verdicts.CLAIM_AB, f"B ({b.path}) bytes differ from A ({a.path}), which the "
                                      "registry claims equal: " + metrics.describe_difference(b.y, a.y), where))
    r["failures"][:] = verdicts.messages(fails)
    r["failed"] = verdicts.names(fails)
    return r


def _sided(side: str, r: dict, where: str) -> list:
    """One side's failures, each message led by the side's name."""
    return [verdicts.Failure(check, f"{side} {msg}", where) for check, msg in zip(r["failed"], r["failures"])]


def evaluate(calls, refs: References, outs_a, outs_b, fault: Fault | None = None, *, planned=None,
             key: str = "emulate") -> dict:
    """Per call metrics and failures, per-kind pooled bias, the threshold used, and the verdict.
    planned: {"a": [path], "b": [path]} that dispatch chose before the run (resolve_paths); the
    dispatch trace of each call must show them, and A and B must differ on it (path or fold
    order). The control (fold_reversed) must differ from A in fold order on every call and in
    at least one output's bits, or it controls nothing and the run fails. Beside each list of
    "failures" (messages) stands "failed": the check of each (verdicts.CHECKS)."""
    kinds = sorted({c.kind for c in calls})
    # two statistics per call and per kind, each a two-sided test (BIAS_WHY)
    z = bias_threshold(2 * (len(calls) + len(kinds)))
    rows, run_fails = [], []
    for i, (c, a, b) in enumerate(zip(calls, outs_a, outs_b)):
        ra, rb = side_metrics(c, a, refs), side_metrics(c, b, refs)
        ab = pair_metrics(a, b, fault, c.key)
        fails = _sided("A", ra, c.key) + _sided("B", rb, c.key) + [verdicts.Failure(k, f, c.key)
                                                      for k, f in zip(ab["failed"], ab["failures"])]
        for side, r in (("A", ra), ("B", rb)):
            for stat in ("t_scale", "t_offset"):
                if not abs(r[stat]) <= z:
                    fails.append(verdicts.failure(verdicts.BIAS, f"{side} {r['path']}: biased, {stat} = {r[stat]:.3g} "
                                                  f"standard errors (|t| > {z:.2f})", c.key))
        m, w = c.x.shape[0], refs.weights[c.layer]
        for side, out in (("a", a), ("b", b)):
            want = planned[side][i] if planned else out.path
            if out.path != want:
                fails.append(verdicts.failure(verdicts.TRACE, f"{side.upper()} ran {out.path} (dispatch trace) where "
                                              f"dispatch chose {want} before the run: the A/B does not compare what "
                                              "it says", c.key))
        ab["same_path_and_fold"] = a.path == b.path and fold_plan(a.path, m, w, key) == fold_plan(b.path, m, w, key)
        if ab["same_path_and_fold"]:
            fails.append(verdicts.failure(verdicts.SAME, f"A and B both ran {a.path} with the same fold order "
                                          "(dispatch trace): this call compares a path with itself", c.key))
        rows.append({"key": c.key, "layer": c.layer, "kind": c.kind, "position": c.position, "m": m,
                     "n": int(a.y.shape[1]), "k": int(c.x.shape[1]), "a": ra, "b": rb, "ab": ab,
                     "failures": verdicts.messages(fails), "failed": verdicts.names(fails)})
    control = None
    if fault is not None and fault.name == CONTROL:
        # a control equal to A proves nothing: its fold must be another order than A's on every
        # call, and some output's bits must differ from A's
        ws = [refs.weights[c.layer] for c in calls]
        same_fold = [c.key for c, a, w in zip(calls, outs_a, ws)
                     if fold_plan(a.path, c.x.shape[0], w, key) == control_plan(w)]
        differ = sum(not r["ab"]["bit_equal"] for r in rows)
        control = {"fold": "one split, one lane, groups descending", "same_fold_as_a": len(same_fold),
                   "outputs_differ_from_a": differ, "calls": len(rows)}
        if same_fold:
            run_fails.append(verdicts.failure(verdicts.VOID_CONTROL, "the control is void: its fold order (groups "
                                              f"G-1..0) is A's own on {len(same_fold)} call(s), e.g. {same_fold[0]}",
                                              same_fold[0]))
        if rows and not differ:
            run_fails.append(verdicts.failure(verdicts.VOID_CONTROL, f"the control is void: none of its {len(rows)} "
                                              "calls differs from A's bits; it compares A with itself"))
    # pooled over each captured row once: the M = 1 calls, else the first batched call of each
    # weight at the smallest M (its distinct rows are every captured row)
    once = [r for r in rows if isinstance(r["position"], int)]
    if not once and rows:
        m0 = min(r["m"] for r in rows)
        once = [r for r in rows if r["m"] == m0 and r["key"].endswith(".0")]
    pooled = {}
    for kind in kinds:
        mine = [r for r in once if r["kind"] == kind]
        d = {}
        for side in ("a", "b"):
            for stat in ("t_scale", "t_offset"):
                d[f"{side}_{stat}"] = sum(r[side][stat] for r in mine) / math.sqrt(len(mine))
        fails = [verdicts.failure(verdicts.BIAS, f"{side.upper()} {kind}: biased over {len(mine)} calls, pooled "
                                  f"{stat} = {d[f'{side}_{stat}']:.3g} (|Z| > {z:.2f})", kind)
                 for side in ("a", "b") for stat in ("t_scale", "t_offset") if not abs(d[f"{side}_{stat}"]) <= z]
        d["failures"], d["failed"] = verdicts.messages(fails), verdicts.names(fails)
        pooled[kind] = d
    ok = not run_fails and not any(r["failures"] for r in rows) and not any(d["failures"] for d in pooled.values())
    return {"calls": rows, "kinds": pooled, "bias_threshold": z, "failures": verdicts.messages(run_fails),
            "control": control, "ok": ok, "failed": verdicts.names(run_fails)}
