"""The items of a run: the bandwidth row, one (shape, M) row, the decode step (with its power
proxy, power.py) and the launch cost of eager prefill calls (launch.py)."""

import functools
from dataclasses import replace

from .plan import (Config, FIT_DIVS, GB, Item, STEP_COUNTS, STEP_DENSE, call_nbytes, check_chain,
                   copies_needed, dense_nbytes, step_chain, step_shapes)
from .gate import Gate, bench_case
from .contestants import (Call, Contestant, bf16_contestant, contestant_for, path_contestant, rotation,
                          row_slice, weight_copies)
from .timing import fit_fixed_bw, measure, round_ratios, spread
from .probe import bandwidth_probes
from .sol import SOL_LABELS, sol_contestants
from . import checkafter, launch, power, stats
from .step import chain_stats, step_contestant, step_parts, step_weights


def _side(kset: str, path: str, g: Gate) -> dict:
    return {"kset": kset, "path": path, "gate": g.status, "reason": g.reason, "checks": g.detail}


def _fill(side: dict, c: Contestant, t: list, reps: int, clocks: dict, bw: float | None, unit: float):
    """µs (unit=1) or ms (unit=1e3) spread, GB/s, % of the streaming read bandwidth, Top/s."""
    sp = spread(t)
    med = sp["median"]
    gbps = c.nbytes / med / 1e3
    side.update(time={k: (v / unit if k != "n" else v) for k, v in sp.items()}, reps=reps,
                calls=len(c.calls), gbps=gbps, pct_bw=gbps / bw if bw else None,
                tops=c.flops / med / 1e6, clocks=clocks, rounds=[v / unit for v in t], bytes=c.nbytes)


def _timing_notes(row: dict, info: dict) -> None:
    """The rounds' statistics on the row: rounds timed and why they stopped, throttled rounds,
    the control's drift bracket, and the checks after timing (a failed one: status 'suspect')."""
    b = info.get("bracket") or {}
    row["timing"] = {"rounds": info.get("rounds"), "stopped": info.get("stopped"),
                     "throttled": len(info.get("throttled") or ()), "dropped": info.get("dropped", False),
                     "drift": stats.drift(b.get("first") or (), b.get("last") or ()), "control": b.get("label")}
    if info.get("after"):
        row["after"] = info["after"]
    bad = checkafter.failures(info.get("after"))
    if bad:
        row["check_failures"] = bad


def _same(row: dict, what: str) -> dict:
    """A row whose A and B resolved to the same path: not timed, no ratio."""
    return {**row, "status": "same", "note": f"A == B ({what}), not timed"}


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
    sides, gates = {}, {}
    for s, kset in (("a", cfg.a), ("b", cfg.b)):
        path, g = env.side(kset, case0, inp)
        sides[s], gates[s] = _side(kset, path, g), g
    same = sides["a"]["path"] == sides["b"]["path"]
    binp = None
    if not shape.dense and not same:
        binp = env.baseline(inp)
        gates["bf16"] = env.baseline_gate(replace(case0, path="cublas", layout="dense"), binp)
        sides["bf16"] = _side("-", "cublas", gates["bf16"])
    row = {"kind": "shape", "key": item.key, "shape": shape.name, "n": shape.n, "k": shape.k, "m": m,
           "dense": shape.dense, "dtype": cfg.dtype, "layout": case0.layout, "sides": sides, "ratios": {},
           "control": sides["a"]["path"] == sides["b"]["path"], "case": case0.id}
    blocked = [s for s in sides if sides[s]["gate"] != "PASS"]
    if same and not shape.dense:
        if blocked:
            return {**row, "status": "blocked", "note": f"A == B ({sides['a']['path']}), not timed"}
        return _same(row, sides["a"]["path"])
    if not env.can_time:
        return {**row, "status": "blocked" if blocked else "skipped", "note": env.why_not}
    copies = weight_copies(inp, shape, cfg)      # shared by both sides
    # a dense shape is the cuBLAS reference (the BF16 step sums it): A == B, timed once, no ratio
    timed = [s for s in sides if s not in blocked and not (same and s == "b")]
    if same:
        row["note"] = f"A == B ({sides['a']['path']}): the reference row, B not timed"
    contestants = [contestant_for(s, sides[s]["path"], shape, m, cfg, inp, binp if s == "bf16" else None, copies,
                                  gates[s].output_print)
                   for s in timed]
    contestants += _fractions(sides, timed, shape, m, cfg, inp, binp)
    info = {}
    times, reps, clocks, failed = measure(env, contestants, cfg, compare=[("a", "b"), ("bf16", "b")], info=info)
    _timing_notes(row, info)
    for c in contestants:
        if "/" in c.label:
            continue
        if c.label in failed:
            sides[c.label]["error"] = failed[c.label]
        else:
            _fill(sides[c.label], c, times[c.label], reps[c.label], clocks[c.label], bw, 1.0)
    for s in timed:
        _fit(sides[s], s, shape, contestants, times, failed)
    row["ratios"] = round_ratios(times, [("a", "b"), ("bf16", "b"), ("bf16", "a")])
    bad = [lab for lab in failed if "/" not in lab]      # a failed fit point is noted on its side
    row["status"] = ("error" if bad else "blocked" if blocked else
                     "suspect" if row.get("check_failures") else "timed")
    return row


def run_aa(env, cfg: Config, item: Item, bw: float | None) -> dict:
    """The A/A row: the control's path against itself (two graphs of the same calls on the same
    weight copies, in the same rounds): its ratio's interval is the run's measured noise floor."""
    shape, m = item.shape, item.m
    case0 = bench_case("cublas" if shape.dense else "native", shape, m, cfg)
    inp = env.inputs(case0)
    path, g = env.side(cfg.a, case0, inp)
    row = {"kind": "aa", "key": item.key, "shape": shape.name, "n": shape.n, "k": shape.k, "m": m,
           "dtype": cfg.dtype, "sides": {"a": _side(cfg.a, path, g), "a2": _side(cfg.a, path, g)},
           "ratios": {}, "control": True, "case": case0.id,
           "note": "A/A: the control against itself, the run's noise floor"}
    if not g.ok:
        return {**row, "status": "blocked"}
    if not env.can_time:
        return {**row, "status": "skipped", "note": env.why_not}
    copies = weight_copies(inp, shape, cfg)
    contestants = [contestant_for(s, path, shape, m, cfg, inp, None, copies, g.output_print) for s in ("a", "a2")]
    info = {}
    times, reps, clocks, failed = measure(env, contestants, cfg, compare=[("a", "a2")], info=info)
    _timing_notes(row, info)
    for c in contestants:
        if c.label in failed:
            row["sides"][c.label]["error"] = failed[c.label]
        else:
            _fill(row["sides"][c.label], c, times[c.label], reps[c.label], clocks[c.label], bw, 1.0)
    row["ratios"] = round_ratios(times, [("a", "a2")])
    row["status"] = "error" if failed else "suspect" if row.get("check_failures") else "timed"
    return row


def _fractions(sides: dict, timed: list, shape, m: int, cfg: Config, inp, binp) -> list:
    """The fit's extra contestants: each timed side again on the first N/d rows of the same
    weight (d in FIT_DIVS), same K, M and graph structure, labelled 'side/d'; the PQ2 copies of
    each row count are shared by the sides."""
    out = []
    for d in FIT_DIVS:
        rows = shape.n // d
        if d == 1 or rows < 1:
            continue
        sub = replace(shape, n=rows)
        count = copies_needed(call_nbytes(sub, cfg.dtype), cfg.rotate_gb * GB)
        copies = functools.cache(lambda r=rows, c=count: rotation(row_slice(inp.w, r), c))
        for s in timed:
            if s == "bf16":
                out.append(bf16_contestant(f"{s}/{d}", sub, m, cfg, inp.x, lambda r=rows: binp.w[:r],
                                           cfg.rotate_gb * GB))
            else:
                out.append(path_contestant(f"{s}/{d}", sides[s]["path"], sub, m, cfg, inp.x, copies, count))
    return out


def _fit(side: dict, s: str, shape, contestants: list, times: dict, failed: dict) -> None:
    """side['fit']: t = fixed + bytes / bw by least squares over the side's N/d timings."""
    by = {c.label: c for c in contestants}
    pts, rows, errs = [], [], []
    for d in FIT_DIVS:
        lab = s if d == 1 else f"{s}/{d}"
        if lab in failed:
            errs.append(f"N/{d}: {failed[lab]}")
        elif times.get(lab) and lab in by:
            pts.append((by[lab].nbytes, spread(times[lab])["median"]))
            rows.append(shape.n // d)
    fit = fit_fixed_bw(pts)
    if fit is not None:
        side["fit"] = {**fit, "rows": rows}
    if errs:
        side["fit_error"] = "; ".join(errs)


def _bf16_step_method(cfg: Config, env, pq2_total: int, bf16_total: int) -> str:
    if cfg.bf16_step != "auto":
        return cfg.bf16_step
    # the graph needs every bf16 copy plus the PQ2 copies (not yet made) and room for outputs
    return "graph" if env.free_bytes() >= bf16_total + pq2_total + 8 * GB else "sum"


CHAIN_NOTE = ("chained: each call reads the first M*K elements of its source's output (in_proj_ba the "
              "layer input); values kept bounded by weight copies scaled by powers of two chosen along "
              "the chain (fp16 scales times 2^e, codes unchanged): no kernel added to the timed graph")


def run_step(env, cfg: Config, item: Item, bw: float | None, rows: dict) -> dict:
    """One decode step as one graph: the chained calls of plan.step_chain() (257 PQ2 projections
    and 48 dense in_proj_ba), each on its own weight copy, timed in alternating rounds with
    the speed-of-light reads of the same bytes (plain and PDL launches)."""
    m, chain, shapes = item.m, step_chain(), step_shapes()
    check_chain(chain, shapes)
    parts, sides = step_parts(env, cfg, m, {"a": cfg.a, "b": cfg.b})
    nbytes = [call_nbytes(shapes[nm], cfg.dtype) for nm, _ in chain]
    dense_total = sum(nb for nb, (nm, _) in zip(nbytes, chain) if shapes[nm].dense)
    total = sum(nbytes)
    bf16_total = sum(dense_nbytes(shapes[nm].n, shapes[nm].k, cfg.dtype) for nm, _ in chain)
    floor_ms = total / (bw * 1e9) * 1e3 if bw else None
    row = {"kind": "step", "key": item.key, "m": m, "dtype": cfg.dtype, "layout": cfg.layout,
           "calls": len(chain), "dense_calls": sum(shapes[nm].dense for nm, _ in chain),
           "weight_bytes": total, "pq2_bytes": total - dense_total, "dense_bytes": dense_total,
           "bf16_bytes": bf16_total, "floor_ms": floor_ms, "bw_gbps": bw, "sides": sides, "sol": {},
           "ratios": {}, "control": sides["a"]["paths"] == sides["b"]["paths"], "note": CHAIN_NOTE}
    blocked = [s for s in sides if sides[s]["gate"] != "PASS"]
    if row["control"] and not blocked:
        return _same(row, "every shape on the same path")
    if not env.can_time:
        return {**row, "status": "blocked" if blocked else "skipped", "note": env.why_not}
    method = _bf16_step_method(cfg, env, total, bf16_total)
    sides["bf16"]["method"] = method
    weights = step_weights(parts)
    contestants = [step_contestant(s, sides[s]["paths"], parts, m, weights)
                   for s in ("a", "b") if s not in blocked]
    if method == "graph" and "bf16" not in blocked:
        contestants.append(step_contestant("bf16", None, parts, m, step_weights(parts, dense=True), dense_w=True))
    if env.runs_kernels:      # the chain's values, once, eagerly (outside the timed graphs)
        for c in contestants:
            sides[c.label]["values"] = chain_stats(c)
        env.release()
    reads = [Call("", shapes[nm].n, shapes[nm].k, 0, nb) for nb, (nm, _) in zip(nbytes, chain)]
    sols = sol_contestants(weights, reads)
    contestants += sols
    spun, prow = _power_contestants(env, cfg, [c for c in contestants if c.label in ("a", "b")], len(chain))
    contestants += spun
    if prow is not None:
        row["power"] = prow
    info = {}
    times, reps, clocks, failed = measure(env, contestants, cfg, compare=[("a", "b"), ("bf16", "b")], info=info)
    if prow is not None:       # the proxy's checks after timing are its own: noted there, not fatal
        after = {lab: info["after"].pop(lab) for lab in power.POWER_LABELS if lab in (info.get("after") or {})}
        if after:
            prow["after"] = after
            prow["check_failures"] = checkafter.failures(after)
    _timing_notes(row, info)
    for c in contestants:
        if c.label in power.POWER_LABELS:
            dest = prow["sides"].setdefault(c.label, {})
            if c.label in failed:
                dest["error"] = failed[c.label]
            else:
                _fill(dest, c, times[c.label], reps[c.label], clocks[c.label], bw, 1e3)
            continue
        dest = row["sol"].setdefault(c.label, {"pdl": c.label != "sol", "depth": c.depth}) \
            if c.label in SOL_LABELS else sides[c.label]
        if c.label in failed:
            dest["error"] = failed[c.label]
            continue
        _fill(dest, c, times[c.label], reps[c.label], clocks[c.label], bw, 1e3)   # ms per step
        if c.label != "bf16":
            dest["pct_floor"] = floor_ms / dest["time"]["median"] if floor_ms else None
    row["ratios"] = round_ratios(times, [("a", "b"), ("bf16", "b"), ("bf16", "a")]
                                 + [(s, c.label) for c in sols for s in ("a", "b")])
    timed_sols = [lab for lab, v in row["sol"].items() if v.get("time")]
    # the speed of light is the best of the sweep (plain, and PDL at each prefetch depth)
    row["sol_best"] = min(timed_sols, key=lambda lab: row["sol"][lab]["time"]["median"]) if timed_sols else None
    if method == "sum" and "bf16" not in blocked:
        _summed_bf16(row, rows, m)
    if prow is not None:
        _power_summary(prow, times, floor_ms)
    # a failed SOL read or power-proxy graph is noted, not fatal
    bad = [lab for lab in failed if lab not in SOL_LABELS and lab not in power.POWER_LABELS]
    row["status"] = ("error" if bad else "blocked" if blocked else
                     "suspect" if row.get("check_failures") else "timed")
    return row


def _power_contestants(env, cfg: Config, steps: list, n: int) -> tuple:
    """([each step side with a spin after each call, the spins alone], the row's 'power' entry):
    none when --spin-us is 0; a failed calibration is the entry's error (the step runs on)."""
    if not cfg.spin_us or not steps:
        return [], None
    prow = {"spin_us": cfg.spin_us, "spins": n, "sides": {}}
    try:
        cal = env.spin_calibration()
        cycles = power.cycles_for(cfg.spin_us, cal["cycles_per_us"])
    except Exception as e:
        prow["error"] = f"spin calibration failed: {type(e).__name__}: {e}"
        return [], prow
    prow.update(calibration=cal, cycles=cycles)
    out = [power.with_spins(c, f"{c.label}+spin", cycles, cfg.spin_us) for c in steps]
    return out + [power.spins_only(n, cycles, cfg.spin_us)], prow


def _power_summary(prow: dict, times: dict, floor_ms: float | None) -> None:
    """The proxy's numbers: µs per spin (the spins alone), and per side the matrix kernels' own
    ms (step+spin minus spin, per round), their % of the floor, the matrix time over the plain
    step's (per round) and B/A on the matrix times."""
    sp = times.get("spin")
    if sp:
        prow["sides"]["spin"]["us_per_spin"] = spread(sp)["median"] / prow["spins"]
    mat = {}
    for s in ("a", "b"):
        ws = times.get(f"{s}+spin")
        if not ws or not sp:
            continue
        mat[s] = power.matrix_rounds(ws, sp)
        ci = stats.bootstrap_median([v / 1e3 for v in mat[s]])
        dest = prow["sides"][f"{s}+spin"]
        dest["matrix"] = ci
        dest["matrix_pct_floor"] = floor_ms / ci["median"] if floor_ms and ci and ci["median"] > 0 else None
        if times.get(s):
            dest["matrix_over_plain"] = stats.ratio_interval(mat[s], times[s])
    if "a" in mat and "b" in mat:
        prow["b_over_a"] = stats.ratio_interval(mat["a"], mat["b"])


def run_launch(env, cfg: Config, item: Item, rows: dict) -> dict:
    """Host µs per eager call of each side's path for one (shape, prefill M), against the GPU
    time per call of that path in the shape row at the same M, and the path's first call in the
    process (launch.py). A failed measurement is the entry's error; the run goes on."""
    shape, m = item.shape, item.m
    row = {"kind": "launch", "key": item.key, "shape": shape.name, "n": shape.n, "k": shape.k, "m": m,
           "dtype": cfg.dtype, "entries": [], "note": "eager calls (prefill), not graphs"}
    if not env.can_time:
        return {**row, "status": "skipped", "note": env.why_not}
    case0 = bench_case("cublas" if shape.dense else "native", shape, m, cfg)
    srow = (rows.get(f"shape:{shape.name}:m{m}") or {}).get("sides") or {}
    try:
        inp = env.inputs(case0)
    except Exception as e:
        return {**row, "status": "instrument failed", "error": f"inputs: {type(e).__name__}: {e}"}
    by = {}
    for s, kset in (("a", cfg.a), ("b", cfg.b)):
        try:
            path, g = env.side(kset, case0, inp)
        except Exception as e:
            row["entries"].append(launch.entry("?", s, None, None, None, f"{type(e).__name__}: {e}"))
            continue
        by.setdefault(path, {"sides": [], "gate": g})["sides"].append(s)
    for path, v in by.items():
        first = getattr(env, "first_calls", {}).get(path)
        gpu = next((srow[s]["time"]["median"] for s in v["sides"]
                    if (srow.get(s) or {}).get("path") == path and srow[s].get("time")), None)
        who = ",".join(v["sides"])
        if not v["gate"].ok:
            row["entries"].append(launch.entry(path, who, None, gpu, first,
                                               f"gate {v['gate'].status}: {v['gate'].reason} (not run)"))
            continue
        try:
            host = env.host_cost(path, inp)
        except Exception as e:
            env.release()
            row["entries"].append(launch.entry(path, who, None, gpu, first, f"{type(e).__name__}: {e}"))
            continue
        row["entries"].append(launch.entry(path, who, host, gpu, first))
    del inp
    env.release()
    row["status"] = "timed" if row["entries"] and not any(e.get("error") for e in row["entries"]) \
        else "instrument failed"
    return row


def _summed_bf16(row: dict, rows: dict, m: int) -> None:
    """The BF16 step as the per-shape cuBLAS medians of this run times the calls per step
    (separate calls on fixed inputs: not chained)."""
    bf = row["sides"]["bf16"]
    total, missing = 0.0, []
    for nm, count in {**STEP_COUNTS, **STEP_DENSE}.items():
        sd = (rows.get(f"shape:{nm}:m{m}") or {}).get("sides", {})
        # a dense shape has no bf16 side: its cuBLAS time is the side that ran cublas
        side = sd.get("bf16") if nm in STEP_COUNTS else next((v for v in sd.values() if v.get("path") == "cublas"), {})
        t = (side or {}).get("time")
        if t is None:
            missing.append(nm)
        else:
            total += t["median"] * count
    if missing:
        bf["note"] = f"BF16 step not summed: no BF16 row at M={m} for {', '.join(missing)}"
        return
    ms = total / 1e3
    bf["time"] = {"median": ms, "min": ms, "max": ms, "n": 1}
    bf["note"] = "sum of per-shape cuBLAS medians x calls per step (not one graph, not chained)"
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
    if item.kind == "aa":
        return run_aa(env, cfg, item, bw)
    if item.kind == "launch":
        return run_launch(env, cfg, item, rows)
    return run_step(env, cfg, item, bw, rows)
