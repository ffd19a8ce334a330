"""The chained decode step: every call of plan.step_chain() in model order, each on its own
weight copy, each reading the output of the call before it in the layer (as a model does).

Call i's input is the first M*K_i elements of its source's [M, N] output, viewed as [M, K_i]
(contiguous; plan.check_chain proves every K fits). Each call runs its path's whole run()
(activation quantization included) into one output buffer per shape name, reused layer after
layer like a model's activation buffers.

Bounded values without an extra kernel: with unit-variance inputs, a projection multiplies the
RMS by about g = sqrt(mean_n ||W_n||^2), so 257 chained projections would overflow. Each copy's
values are scaled by a power of two 2^e_i (fp16 scales times 2^e, exact; codes unchanged), with
e_i chosen along the chain so that log2 of the running RMS stays within 1/2 of the step
input's (in expectation; chain_stats measures it). On the same input, a timed copy computes
exactly 2^e_i times what the gated weight computes."""

import functools
import math
from dataclasses import replace

import torch

from kernels.format import PQ2Weight, unpack_codes
from .. import registry
from .checkafter import Probe, Thunks
from .contestants import Call, Contestant, row_slice, scaled_clone
from .gate import bench_case
from .plan import Config, check_chain, pq2_nbytes, step_chain, step_shapes

GAIN_ROWS = 256          # rows sampled for a weight's gain
BOUND = 2.0 ** 16        # an output RMS beyond this factor of the input's (either way): unbounded


def step_parts(env, cfg: Config, m: int, ksets: dict, baseline: bool = True):
    """Inputs and gates of the step's shapes at M: ({shape: (Shape, inp, binp)}, {side: entry})
    where an entry holds the path per shape and a gate that passes only if every shape's does.
    binp: the decoded BF16 matrix the baseline times (a dense shape: its own inputs)."""
    sides = {s: {"kset": ks, "paths": {}, "gate": "PASS", "reason": ""} for s, ks in ksets.items()}
    if baseline:
        sides["bf16"] = {"kset": "-", "paths": {}, "gate": "PASS", "reason": ""}
    reasons = {s: [] for s in sides}
    parts = {}
    for nm, shape in step_shapes().items():
        case0 = bench_case("cublas" if shape.dense else "native", shape, m, cfg)
        inp = env.inputs(case0)
        gates = {s: env.side(ks, case0, inp) for s, ks in ksets.items()}
        binp = None
        if baseline:
            binp = inp if shape.dense else env.baseline(inp)
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


def gain_log2(w, rows: int = GAIN_ROWS) -> float:
    """log2 of sqrt(mean over sampled rows of ||W_n||^2): how a projection scales the RMS of
    unit-variance inputs."""
    r = min(rows, w.n if isinstance(w, PQ2Weight) else w.shape[0])
    s = row_slice(w, r)
    if isinstance(s, PQ2Weight):
        nz = (unpack_codes(s.codes_matrix()).view(r, s.groups, -1) != 1).sum(-1).double()
        norm2 = (s.scales_matrix().double() ** 2 * nz).sum(-1)
    else:
        norm2 = (s.double() ** 2).sum(-1)
    return 0.5 * math.log2(float(norm2.mean()))


def exponents(chain: list, gains: dict) -> tuple:
    """(e_i, level_i) per call: level = log2 of the RMS of call i's output relative to the step
    input's, e_i = the power of two that keeps it within [-1/2, 1/2]."""
    exps, level = [], []
    for nm, src in chain:
        pre = (level[src] if src >= 0 else 0.0) + gains[nm]
        e = -round(pre)
        exps.append(e)
        level.append(pre + e)
    return exps, level


def step_weights(parts: dict, dense: bool = False, bounded: bool = True):
    """() -> one weight per call of step_chain() (made on first use, then cached): a 2^e_i
    scaled copy of the shape's gated weight (dense: the decoded matrix the BF16 baseline times).
    bounded=False keeps every e_i at 0 (the values then grow along the chain)."""
    @functools.cache
    def make():
        chain = step_chain()
        gains = {nm: gain_log2(parts[nm][1].w) for nm in {nm for nm, _ in chain}}
        exps = exponents(chain, gains)[0] if bounded else [0] * len(chain)
        out = []
        for (nm, _), e in zip(chain, exps):
            shape, inp, binp = parts[nm]
            out.append(scaled_clone(binp.w if dense and not shape.dense else inp.w, e))
        return out
    return make


def _head(buf: torch.Tensor, m: int, k: int) -> torch.Tensor:
    """The first m*k elements of buf's storage as [m, k] (the next call's input)."""
    return buf.view(-1)[: m * k].view(m, k)


def step_contestant(label: str, paths, parts: dict, m: int, weights, dense_w: bool = False):
    """The step as one graph: every call of step_chain() in model order on its own weight of
    weights(), each reading its source's output. paths: path per shape name (dense_w: every
    call is torch.mm on the decoded matrices, the BF16 baseline)."""
    chain = step_chain()
    check_chain(chain, {nm: p[0] for nm, p in parts.items()})
    x0 = parts[chain[0][0]][1].x

    def call(nm):
        sh = parts[nm][0]
        nb = sh.n * sh.k * x0.element_size() if dense_w or sh.dense else pq2_nbytes(sh.n, sh.k)
        return Call("cublas" if dense_w else paths[nm], sh.n, sh.k, m, nb)
    calls = [call(nm) for nm, _ in chain]

    def build():
        ws = weights()
        outs = {nm: torch.empty(m, parts[nm][0].n, dtype=x0.dtype, device=x0.device) for nm in parts}
        runs = {nm: registry.get(paths[nm]).kernel() for nm in parts} if not dense_w else {}
        thunks = Thunks()
        for (nm, src), w in zip(chain, ws):
            x = x0 if src < 0 else _head(outs[chain[src][0]], m, parts[nm][0].k)
            if dense_w:
                thunks.append(functools.partial(torch.mm, x, w.t(), out=outs[nm]))
            else:
                thunks.append(functools.partial(runs[nm], x, w, out=outs[nm]))
        last = outs[chain[-1][0]]

        def expect():        # the same calls eagerly, in order (the step has no gate of its own)
            for f in thunks:
                f()
            return last.clone()
        # the BF16 step chains cuBLAS calls, which may pick another kernel in a graph: within 5e-2
        # (a check for stale or skipped work, not numerics); the PQ2 chain to lm_head is bit-exact
        thunks.probe = Probe(last, expect, x0, [x0] + [w.data if isinstance(w, PQ2Weight) else w for w in ws],
                             tol=5e-2 if dense_w else 0.0)
        return thunks
    return Contestant(label, calls, build, 1)


def run_chain(thunks: list) -> list:
    """Run the step's calls once, eagerly and in order: each output's RMS over the step
    input's (inf or NaN where the output is not finite)."""
    x_rms = thunks[0].args[0].double().pow(2).mean().sqrt()
    rms = [f().double().pow(2).mean().sqrt() for f in thunks]      # double: the square never overflows
    return [float(v) for v in (torch.stack(rms) / x_rms).cpu()]


def chain_stats(c: Contestant) -> dict:
    """The step run once eagerly (not timed), summarised: every output finite, the first that
    is not, the output RMS over the step input's (min, max, the last call's) and whether all
    of them stay within BOUND of 1 (neither overflowing nor dying out)."""
    try:
        rel = run_chain(c.build())
    except Exception as e:   # reported with the row; the timing reports its own failure
        return {"error": f"{type(e).__name__}: {e}"}
    bad = [i for i, v in enumerate(rel) if not math.isfinite(v)]
    names = [nm for nm, _ in step_chain()]
    fin = [v for v in rel if math.isfinite(v)] or [None]
    return {"calls": len(rel), "finite": not bad, "nonfinite": len(bad),
            "first_bad": f"call {bad[0]} ({names[bad[0]]}, {c.calls[bad[0]].path})" if bad else None,
            "rms_min": min(fin, key=lambda v: v or 0), "rms_max": max(fin, key=lambda v: v or 0),
            "rms_last": rel[-1], "bounded": all(1 / BOUND <= v <= BOUND for v in rel)}
