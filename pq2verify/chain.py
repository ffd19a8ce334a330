"""Linked chains: the model's MLP, gate_up -> activation -> down, run end to end through A's
and through B's kernels from the captured gate_up input, against an FP64 chain (issue 29).

What the capture holds (golden/<key>/model): every PQ2 call's input and output at decode
positions 1, 32 and 128, for every layer's q/k/v, o, gate_up and down weights. For one layer
and position the down input is exactly repeat(silu(gate) * up, T) of the gate_up output (bf16,
torch's own ops; T the digits along K, pq2verify.gsm8k.model._Stack): so the MLP chain starts
from the captured gate_up input. A whole layer is not linked: attention needs the KV cache of
every earlier position and the residual stream + RMSNorm between projections, neither captured.

The chain of one call (M rows):
  y1 = gate_up(x)                         the kernel, [M, 2I]; gate = y1[:, :I], up = y1[:, I:]
  h  = bf16(bf16(silu(gate)) * up)        the model's activation, in its own dtype
  y2 = down(repeat(pad(h, Kp), T))        the kernel on the chain's own h
and the FP64 chain: D1 = x W1^T, H = silu(D1_gate) D1_up, D2 = H W'^T, every step in FP64 from
the FP64 output before it; W' = the down weight decoded with its T digit slices (along K)
summed, [N, I].

The chain bound (per output of y2): with R1 the step-1 path's own FP64 reference (quantized for
an integer path, dense for a floating one), B1 its per-element bound (registry.Path
.element_bound: what every passing per-call check guarantees, |y1 - R1| <= B1), Hr = silu(R1_gate)
R1_up in FP64, R2(h) and B2 the step-2 path's reference and per-element bound on its own input h:

  y2 - D2 = (y2 - R2(h)) + (R2(h) - D2(h)) + W'(h - Hr) + W'(Hr - H)

  term 1: |.| <= B2 (the per-call bound of step 2);
  terms 2 and 4: computed exactly in FP64 (the Q8 arithmetic's own error on h, and step 1's
          exact Q8 error carried through the FP64 activation and W'; both 0 for floating paths);
  term 3: step 1's residue carried through the activation and down. Per element, e = h - Hr
          obeys |e_k| <= Eh_k (derived below from B1). Its sum over k is not taken worst case:
          a correct step's errors are rounding residues with no preferred sign (replay.BIAS_WHY)
          and independent between outputs, so by Hoeffding's inequality
          P(|sum_k W'_nk e_k| >= z sigma_n) <= 2 exp(-z^2 / 2), sigma_n^2 = sum_k W'_nk^2 Eh_k^2,
          and z = sqrt(2 ln(2 n_tests / alpha)) (Bonferroni over every output of every chain
          and side, alpha = numerics.BIAS_ALPHA). A fault whose residues line up with a row of W'
          adds up like sum_k |W'_nk| Eh_k, sqrt(I) times more: that is what compounds.

  Eh, propagated through the activation (L = max |silu'| = 1.0998 at x = 2.40, taken as 1.1;
  u = the dtype's unit roundoff, numerics.UNIT_ROUNDOFF; us = u + 2^-20 for torch's FP32
  evaluation of silu before its rounding; the bf16 x bf16 product is exact in FP32 and rounded
  once; eta = half the dtype's smallest subnormal, per rounding):
      Es = L Bg + us (|silu(Gr)| + L Bg) + eta          |bf16(silu(g)) - silu(Gr)|
      Eh = Es (|Ur| + Bu) + |silu(Gr)| Bu + u (|silu(Gr)| + Es)(|Ur| + Bu) + eta
  (|s u - S U| <= |s - S| |u| + |S| |u - U|, then the product's rounding <= u |s u|.) Eh is a
  worst-case bound and is checked as such: |h - Hr| <= Eh on every element ("activation").

  Terms 2 and 4 are known exactly, so they are subtracted, not bounded: every output must meet
      |(y2 - D2) - (R2(h) - D2(h)) - W'(Hr - H)| <= B2 + z sigma     (the chain bound),
  and the bound on |y2 - D2| itself, reported as a relative RMS, is B2 + |terms 2 + 4| + z sigma.

The planted fault `coherent` (replay.FAULTS, FAULT_WHY) stays inside every per-call bound of
gate_up (per element, relative RMS, bias) and lines its residue up with one row of W', so that
term 3 adds up like sum_k |W'_nk| Eh_k. On a floating gate_up path (F = (K + 2) 2^-23 S, several
ulps) that passes every per-call check and fails the chain. On an integer path it cannot (NO_ROOM):
the per-element bound there is the correctly rounded reference but for near-ties, and no fault
inside it lines up beyond the noise; a same-sign bias in every output, the obvious compounding
fault, is what the per-call bias test (replay.BIAS_WHY) already fails at a twentieth of an ulp.

A vs B: B's chain output against A's (relative RMS, max ulp, bit equality); where the registry
claims both steps' paths bit-identical (and no fault is planted) the bytes must be equal.
"""
import copy
import math
from dataclasses import dataclass

import numpy as np
import torch

from . import numerics, registry, replay

GATE_UP, DOWN = "mlp.gate_proj+up_proj", "mlp.down_proj"
KIND = f"{GATE_UP} -> silu*up -> {DOWN}"
SILU_LIP = 1.1          # >= max |silu'(x)| = 1.0998 (x = 2.3994); min silu' = -0.0998
SILU_EVAL = 2.0 ** -20  # torch's FP32 silu before its rounding to the dtype: far below this
FAULT = "coherent"
FAULT_WHY = (
    "each output of the target gate_up moved to the representable value farthest from its FP64 "
    "reference within its per-element bound, in the direction that moves h = silu(gate)*up along the "
    "sign of one row of the down weight (the row whose L1/L2 ratio is largest), with the total kept "
    "inside half the per-call relative-RMS tolerance: inside every per-call bound, coherent across the "
    "chain")

NO_ROOM = (
    "on an integer path the per-element bound leaves a gate_up output no room: its fold allowance "
    "F = (G + 2) 2^-24 S is far below half an output ulp, so every output within the bound is its FP64 "
    "reference correctly rounded, except at near-ties (where the other neighbour is also within F) and "
    "near zero (where F is tiny in absolute terms); no fault inside every per-call bound can line up "
    "with the down weight beyond the noise (see the lined-up column), so the chain cannot fail where "
    "every per-call check passes. The chain check bites where a step's per-element bound is loose: a "
    "floating path (F = (K + 2) 2^-23 S, several ulps), e.g. --b legacy,int_gemv=off (native)")


@dataclass
class Chain:
    call: replay.Call        # the gate_up call (its captured x starts the chain)
    down: str                # the down weight's name
    digits: int              # T: digit slices along the down weight's K
    inter: int               # I: the activation's width (gate and up are I each)


def chains_of(calls, weights, digits=None) -> list[Chain]:
    """A chain per gate_up call whose layer's down weight is in the selection."""
    out = []
    for c in calls:
        if c.kind != GATE_UP:
            continue
        down = c.layer[: -len(GATE_UP)] + DOWN
        if down not in weights:
            continue
        w1, w2 = weights[c.layer], weights[down]
        inter = w1.n // 2
        kp = -(-inter // 128) * 128
        t = digits or w2.k // kp
        if w1.n % 2 or w2.k != t * kp:
            raise replay.ReplayError(f"{c.layer} -> {down}: the down weight's K = {w2.k} is not {t} digit(s) of "
                                     f"the activation's {inter} (padded to {kp})")
        out.append(Chain(c, down, t, inter))
    return out


def missing_note(calls, weights) -> str | None:
    """Why the selection has no chain (for the report), or None when it has one."""
    if chains_of(calls, weights):
        return None
    have = sorted({c.kind for c in calls})
    return (f"no linked chain: the selection holds {', '.join(have)}; a chain needs a layer's {GATE_UP} and "
            f"{DOWN} both (e.g. --layers layers.0.mlp)")


def activation(y1: torch.Tensor, inter: int) -> torch.Tensor:
    """The model's MLP activation in its own dtype: silu(gate) * up (LlamaMLP / SmolLM2)."""
    return torch.nn.functional.silu(y1[:, :inter]) * y1[:, inter:]


def down_input(h: torch.Tensor, ch: Chain, k: int) -> torch.Tensor:
    kp = k // ch.digits
    if kp != h.shape[1]:
        h = torch.nn.functional.pad(h, (0, kp - h.shape[1]))
    return h.repeat(1, ch.digits)


def _silu64(v):
    return v / (1.0 + np.exp(-v))


def folded_down(w2, ch: Chain) -> np.ndarray:
    """W' [N, I]: the down weight decoded in FP64 with its T digit slices summed."""
    from reference import pq2
    d = pq2.decode(w2.data.cpu(), layout=w2.layout, n=w2.n, k=w2.k).astype(np.float64)
    return d.reshape(w2.n, ch.digits, -1).sum(1)[:, :ch.inter]


@dataclass
class SideOut:
    y1: replay.Out
    y2: replay.Out
    h: torch.Tensor          # CPU
    x2: torch.Tensor         # CPU, the down call's input


def run_side(spec: dict, chains, weights, fault=None) -> list[SideOut]:
    """Every chain under kernel spec `spec`, B's variant `fault` applied at each step it targets."""
    from .gsm8k.runs import EnvSwitch, spec_env
    out, prev = [], {}
    if fault is not None:
        fault.reset()
    with EnvSwitch(spec_env(spec)):
        for ch in chains:
            steps, x = [], ch.call.x
            for i, name in enumerate((ch.call.layer, ch.down)):
                c = ch.call if i == 0 else replay.Call(f"{ch.down}<-{ch.call.key}", ch.down, DOWN, ch.call.position, x,
                                                       ch.call.distinct)
                w = weights[name] if fault is None else fault.weight(name, weights[name])
                y, path, dots, src, notes = replay._call(x, w, replay._emulated_dots(c, weights[name], {}))
                if fault is not None:
                    y = fault.output(c, w, y, dots, prev.get((name, x.shape[0])), path=path)
                prev[(name, x.shape[0])] = y
                steps.append(replay.Out(path, y.cpu(), None if dots is None else dots.cpu().to(torch.int64), src,
                                        notes))
                if i == 0:
                    h = activation(y, ch.inter)
                    x = down_input(h, ch, weights[ch.down].k)
            out.append(SideOut(steps[0], steps[1], h.cpu(), x.cpu()))
    if fault is not None:
        fault.reset()
    return out


def _rel(y, ref) -> float:
    from reference import metrics
    return metrics.relative_rms(y, ref)


class Refs:
    """The FP64 chain of every chain (it does not depend on A or B) and W' per down weight."""

    def __init__(self, chains, weights, refs: replay.References):
        self.refs, self.weights, self._w, self._sides = refs, weights, {}, {}
        self.fp64 = {}
        for ch in chains:
            d1 = refs.get(ch.call, "dense")
            hh = _silu64(d1[:, :ch.inter]) * d1[:, ch.inter:]
            self.fp64[ch.call.key] = dict(d1=d1, h=hh, d2=hh @ self.w_fold(ch).T)

    def w_fold(self, ch: Chain) -> np.ndarray:
        if ch.down not in self._w:
            self._w[ch.down] = folded_down(self.weights[ch.down], ch)
        return self._w[ch.down]

    def step2(self, chains, outs) -> tuple[list, replay.References]:
        """One side's down calls (each on that side's own h) and their FP64 references, built
        together: References decodes each down weight once for all of its rows, not once per
        chain."""
        calls = [replay.Call(f"{ch.down}<-{ch.call.key}", ch.down, DOWN, ch.call.position, s.x2, ch.call.distinct)
                 for ch, s in zip(chains, outs)]
        return calls, replay.References(calls, {ch.down: self.weights[ch.down] for ch in chains})

    def side(self, chains, outs, z: float, zb: float) -> list:
        """side_eval of every chain of one side. A's run is the same list for every B variant of a
        replay: its rows are computed once (held with the list, so its id is never reused)."""
        hit = self._sides.get(id(outs))
        if hit is None or hit[0] is not outs or hit[1] != (z, zb):
            calls2, refs2 = self.step2(chains, outs)
            rows = [side_eval(ch, s, self.fp64[ch.call.key], self.w_fold(ch), self.refs, c2, refs2, z, zb)
                    for ch, s, c2 in zip(chains, outs, calls2)]
            hit = self._sides[id(outs)] = (outs, (z, zb), rows)
        return copy.deepcopy(hit[2])     # each variant's report owns its rows


def step1_bound(ch: Chain, path: str, refs: replay.References, dtype):
    """(R1, B1): step 1's path reference and per-element bound (what its per-call check holds)."""
    p = registry.get(path)
    integer = p.arithmetic == "integer"
    r1 = refs.get(ch.call, p.reference)
    b1, _, _ = numerics.element_bound(p, ch.call.x.shape[1],
                                      refs.get(ch.call, "abs_integer" if integer else "abs_floating"), r1, dtype)
    return r1, b1


def activation_bound(r1, b1, inter: int, dtype):
    """(Hr, Eh): the FP64 activation of step 1's reference and the worst-case |h - Hr| (module
    docstring)."""
    from reference import metrics
    u = numerics.UNIT_ROUNDOFF[dtype]
    eta = float(metrics.spacing(0.0, dtype)) / 2
    gr, ur, bg, bu = r1[:, :inter], r1[:, inter:], b1[:, :inter], b1[:, inter:]
    sr = _silu64(gr)
    es = SILU_LIP * bg + (u + SILU_EVAL) * (np.abs(sr) + SILU_LIP * bg) + eta
    eh = es * (np.abs(ur) + bu) + np.abs(sr) * bu + u * (np.abs(sr) + es) * (np.abs(ur) + bu) + eta
    return sr * ur, eh


def threshold(n_tests: int) -> float:
    """Hoeffding's z at family-wise alpha over n_tests outputs: 2 exp(-z^2/2) = alpha / n_tests."""
    return math.sqrt(2.0 * math.log(2.0 * max(n_tests, 1) / numerics.BIAS_ALPHA))


def side_eval(ch: Chain, s: SideOut, fp: dict, w_fold: np.ndarray, refs: replay.References, c2: replay.Call,
              refs2: replay.References, z: float, zb: float):
    """The per-call checks of both steps (replay.side_metrics; step 2, call c2, on its own input
    h, referenced in refs2: Refs.step2) and the chain's errors, bound and failures for one side
    of one chain. A batched chain repeats its rows: c2 carries the distinct count for the bias
    test (replay.side_metrics)."""
    dt = s.y1.y.dtype
    m1, m2 = replay.side_metrics(ch.call, s.y1, refs), replay.side_metrics(c2, s.y2, refs2)
    r1, b1 = step1_bound(ch, s.y1.path, refs, dt)
    hr, eh = activation_bound(r1, b1, ch.inter, dt)
    h = s.h.double().numpy()
    p2 = registry.get(s.y2.path)
    integer2 = p2.arithmetic == "integer"
    r2, d2h = refs2.get(c2, p2.reference), refs2.get(c2, "dense")
    b2, _, _ = numerics.element_bound(p2, s.x2.shape[1], refs2.get(c2, "abs_integer" if integer2 else "abs_floating"),
                                      r2, dt)
    sigma = np.sqrt((eh ** 2) @ (w_fold ** 2).T)
    exact = (r2 - d2h) + (hr - fp["h"]) @ w_fold.T        # terms 2 and 4, signed
    bound = b2 + z * sigma
    y2 = s.y2.y.double().numpy()
    # the residue terms 1 + 3 = (y2 - D2) - exact, judged against B2 + z sigma
    err = np.abs(y2 - fp["d2"] - exact)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(np.isfinite(y2), err / bound, np.inf)
        coh = np.abs((h - hr) @ w_fold.T) / sigma
        act = np.where(np.isfinite(h), np.abs(h - hr) / eh, np.inf)
    fails = []
    bias_fails = [f"step {i} {m['path']}: biased, {stat} = {m[stat]:.3g} standard errors (|t| > {zb:.2f})"
                  for i, m in ((1, m1), (2, m2)) for stat in ("t_scale", "t_offset") if not abs(m[stat]) <= zb]
    if not (act <= 1).all():
        i, j = (int(v) for v in np.argwhere(~(act <= 1))[0])
        fails.append(f"activation: |h - Hr| beyond its derived bound on {int((~(act <= 1)).sum())} of {act.size} "
                     f"(worst {float(np.nanmax(act)):.3g}x; first h[{i}, {j}] = {float(h[i, j])!r} vs "
                     f"{float(hr[i, j])!r})")
    outside = ~(ratio <= 1)
    if outside.any():
        i, j = (int(v) for v in np.argwhere(outside)[0])
        fails.append(f"chain bound: {int(outside.sum())} of {ratio.size} outputs of {ch.down} outside (worst "
                     f"{float(np.nanmax(np.where(np.isfinite(ratio), ratio, np.inf))):.3g}x; step 1's residue "
                     f"lined up with W' to {float(np.nanmax(coh)):.3g} sigma, z = {z:.2f}); first y2[{i}, {j}] = "
                     f"{float(y2[i, j])!r} vs FP64 chain {float(fp['d2'][i, j])!r}")
    per_call = _rel(y2, d2h)
    chain2 = _rel(y2, fp["d2"])
    return {"paths": [s.y1.path, s.y2.path],
            "step1": _rel(s.y1.y.double().numpy(), fp["d1"]), "act": _rel(h, fp["h"]), "chain": chain2,
            "per_call": per_call, "growth": chain2 / per_call if per_call else math.inf,
            "bound_rel": float(np.linalg.norm(bound + np.abs(exact)) / np.linalg.norm(fp["d2"])),
            "ratio": float(np.nanmax(np.where(np.isfinite(ratio), ratio, np.inf))),
            "coherence": float(np.nanmax(coh)), "act_ratio": float(np.nanmax(act)),
            "per_call_failures": [f"step 1 {f}" for f in m1["failures"]] + [f"step 2 {f}" for f in m2["failures"]]
            + bias_fails,
            "failures": fails}


def evaluate(chains, crefs: Refs, outs_a, outs_b, fault=None) -> dict:
    """Per chain: A's and B's chain metrics and the A-vs-B comparison; the verdict."""
    from reference import metrics
    n = sum(2 * ch.call.x.shape[0] * crefs.weights[ch.down].n for ch in chains)
    z = threshold(n)
    zb = replay.bias_threshold(2 * 2 * 2 * len(chains))    # 2 statistics x 2 steps x 2 sides per chain
    rows = []
    side_a = crefs.side(chains, outs_a, z, zb)
    calls2, refs2 = crefs.step2(chains, outs_b)
    for ch, a, b, ra, c2 in zip(chains, outs_a, outs_b, side_a, calls2):
        rb = side_eval(ch, b, crefs.fp64[ch.call.key], crefs.w_fold(ch), crefs.refs, c2, refs2, z, zb)
        ab = {"rel_rms": metrics.relative_rms(b.y2.y, a.y2.y), "max_ulp": metrics.max_ulp(b.y2.y, a.y2.y),
              "bit_equal": metrics.bitwise_equal(b.y2.y, a.y2.y)}
        fails = [f"A {f}" for f in ra["failures"]] + [f"B {f}" for f in rb["failures"]]
        claimed = all(registry.get(pb).bit_identical_to == pa or (pa == pb and registry.get(pb).deterministic)
                      for pa, pb in zip(ra["paths"], rb["paths"]))
        if fault is None and claimed and not ab["bit_equal"]:
            fails.append(f"B's chain bytes differ from A's, whose paths the registry claims equal: "
                         + metrics.describe_difference(b.y2.y, a.y2.y))
        rows.append({"key": ch.call.key, "layer": ch.call.layer, "down": ch.down, "position": ch.call.position,
                     "m": ch.call.x.shape[0], "a": ra, "b": rb, "ab": ab, "failures": fails})
    return {"kind": KIND, "threshold": z, "bias_threshold": zb, "chains": rows,
            "ok": not any(r["failures"] for r in rows),
            "per_call_ok": not any(r[s]["per_call_failures"] for r in rows for s in ("a", "b"))}


# --- the planted compounding fault ----------------------------------------------------------
def coherent_output(c: replay.Call, y: torch.Tensor, path: str, refs: replay.References, w_fold: np.ndarray,
                    inter: int) -> torch.Tensor:
    """FAULT_WHY: each row of y replaced by its FP64 reference R moved by d_k a_k, d_k the sign
    that pushes h along row n* of W', a_k <= its per-element bound B_k. The amplitudes that line
    up most under an L2 budget are proportional to |W'_n*k dh_k/dy_k| (Cauchy-Schwarz), capped
    at B_k; n* is the row where that sum is largest against the chain's sigma."""
    from reference import metrics
    dt = y.dtype
    p = registry.get(path)
    integer = p.arithmetic == "integer"
    r = refs.get(c, p.reference)
    b, _, _ = numerics.element_bound(p, c.x.shape[1], refs.get(c, "abs_integer" if integer else "abs_floating"), r, dt)
    b = 0.999 * b
    tol = 0.9 * numerics.tolerance(p, dt, p.reference)
    y64 = y.double().cpu().numpy()
    out = y64.copy()
    for m in range(r.shape[0]):
        rm, bm = r[m], b[m]
        gr, ur = rm[:inter], rm[inter:]
        sg = 1 / (1 + np.exp(-gr))
        dh = np.concatenate([sg * (1 + gr * (1 - sg)) * ur, gr * sg])            # dh_k / dy_k
        wf = np.concatenate([w_fold, w_fold], axis=1)                           # [N, 2I]
        a = np.abs(wf * dh)
        # n*: the row whose capped aligned sum is largest against its Hoeffding scale
        score = (a * bm).sum(1) / np.maximum(np.sqrt(((a * bm) ** 2).sum(1)), 1e-300)
        n = int(np.argmax(score))
        d, an = np.sign(wf[n] * dh), a[n]
        budget = tol * float(np.sqrt(np.mean(rm ** 2)))
        for _ in range(40):
            amp = np.minimum(bm, budget * an / max(float(np.sqrt(np.mean(an ** 2))), 1e-300))
            cand = metrics.round_once(rm + d * amp, dt)
            back = np.abs(cand - rm) > bm            # rounded past the bound: one spacing back
            cand = np.where(back, cand - d * metrics.spacing(cand, dt), cand)
            keep = ~((np.abs(cand - rm) <= bm) & np.isfinite(cand))
            cand = np.where(keep, y64[m], cand)
            if np.sqrt(np.mean((cand - rm) ** 2)) <= tol * np.sqrt(np.mean(rm ** 2)):
                break
            budget *= 0.8
        out[m] = cand
    return torch.from_numpy(out).to(dt).to(y.device)


def expected(fault) -> str | None:
    """The chain verdict a B variant must get: PASS unchanged and for the control, FAIL for the
    compounding fault; None (not judged) for the per-call faults, which the per-call checks
    catch."""
    if fault is None or fault.name == replay.CONTROL:
        return "PASS"
    return "FAIL" if fault.name == FAULT else None
