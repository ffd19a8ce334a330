"""The items of a run: the bandwidth row, one (shape, M) row, and the decode step."""

import functools
from dataclasses import replace

import torch

from .. import registry
from .plan import Config, GB, Item, STEP_COUNTS, dense_nbytes, pq2_nbytes, step_order, step_shapes
from .gate import Gate, bench_case
from .contestants import Call, Contestant, contestant_for, rotation, weight_copies
from .timing import measure, round_ratios, spread
from .probe import bandwidth_probes


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
