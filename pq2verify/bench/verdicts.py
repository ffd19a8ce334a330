"""Targets and the tuned-vs-legacy verdicts."""

from .. import registry
from . import stats
from .plan import (Config, PREFILL_M, TARGET_GPU, TARGET_PREFILL_VS_BF16, TARGET_STEP_M, TARGET_STEP_M1_FLOOR,
                   TARGET_STEP_M1_MS, TARGET_STEP_M16_MS, TARGET_STEP_M1_VS_BF16, TARGET_STEP_SMALL_FLOOR)


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
    out = {"median": 1 / inv["median"], "min": 1 / inv["max"], "max": 1 / inv["min"], "n": inv["n"]}
    if "lo" in inv:
        out.update(lo=1 / inv["hi"], hi=1 / inv["lo"], level=inv.get("level"))
    return out


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
            lo, hi = (sp["lo"], sp["hi"]) if "lo" in sp else (sp["min"], sp["max"])
            # closed, as stats.verdict's band: an interval that reaches 1 does not exclude it
            noise = lo <= 1 <= hi
            out.append({"shape": r["shape"], "m": r["m"], "tuned": ps, "legacy": po, "speedup": sp,
                        "slower": sp["median"] < 1, "within_noise": noise, "verdict": verdict})
    return out


def sol_best(row: dict) -> dict | None:
    """{label, ms, pct_floor} of the step row's best speed-of-light read (plain or PDL at any
    prefetch depth), or None."""
    lab = (row or {}).get("sol_best")
    v = ((row or {}).get("sol") or {}).get(lab) or {}
    if not v.get("time"):
        return None
    return {"label": lab, "ms": v["time"]["median"], "pct_floor": v.get("pct_floor")}


def _target(name, want, got, met, gap) -> dict:
    return {"target": name, "want": want, "got": got, "met": met, "gap": gap}


def other_gpu(res: dict) -> str | None:
    """The run's GPU when it is a CUDA GPU other than the one the targets' time limits are set
    for (TARGET_GPU), else None (that GPU, a dry run, the interpreter, or no header)."""
    sig = (res.get("header") or {}).get("config") or {}
    dev = sig.get("device") or ""
    return dev if sig.get("env") == "cuda" and TARGET_GPU not in dev else None


def _step_targets(rows: dict, t: str, cfg: Config, gpu: str | None = None) -> list:
    """One row per M of the issue's table (M = 1, 2, 4, 8, 16, measured in this run or not):
    the tuned side's step at >= its fraction of the floor and within its time limit. On another
    GPU (gpu, from other_gpu) the time limits are not judged: they are the H200's, and a limit
    below that GPU's own floor would read as a target beyond the speed of light."""
    out = []
    limits = {1: TARGET_STEP_M1_MS, 16: TARGET_STEP_M16_MS}
    for m in TARGET_STEP_M:
        want_floor = TARGET_STEP_M1_FLOOR if m == 1 else TARGET_STEP_SMALL_FLOOR
        unjudged = limits.get(m) if gpu else None
        max_ms = None if gpu else limits.get(m)
        want = (f">= {want_floor:.0%} of floor" + (f", <= {max_ms:g} ms" if max_ms else "")
                + (f" (<= {unjudged:g} ms on the {TARGET_GPU} only)" if unjudged else ""))
        name = f"decode step M={m}: {cfg.b if t == 'b' else cfg.a}"
        r = rows.get(f"step:m{m}")
        side = (r or {}).get("sides", {}).get(t, {})
        if not side.get("time") or not r.get("floor_ms"):
            skipped = (r or {}).get("note") if (r or {}).get("status") == "skipped" else None
            why = (side.get("reason") or side.get("error") or (r or {}).get("error") or skipped
                   or "not measured in this run")
            out.append(_target(name, want, "-", False if side.get("gate") == "BLOCKED" else None,
                               f"BLOCKED: {why}" if side.get("gate") == "BLOCKED" else why))
        else:
            ms, floor = side["time"]["median"], r["floor_ms"]
            pct = floor / ms
            need = min(floor / want_floor, max_ms or float("inf"))
            ok = pct >= want_floor and (max_ms is None or ms <= max_ms)
            short = [f"{pct:.1%} < {want_floor:.0%} of floor"] if pct < want_floor else []
            short += [f"{ms:.3f} ms > {max_ms:g} ms"] if max_ms and ms > max_ms else []
            tg = _target(name, want, f"{ms:.3f} ms = {pct:.1%} of floor {floor:.3f} ms", ok,
                         f"met with {need - ms:.3f} ms to spare" if ok
                         else f"{ms - need:.3f} ms too slow (needs <= {need:.3f} ms): " + ", ".join(short))
            if unjudged:
                tg["gap"] += f"; the {unjudged:g} ms limit is the {TARGET_GPU}'s, not judged on {gpu}"
            tg["needed_ms"] = need
            sol = sol_best(r)
            if sol:
                # the needed time against the best speed of light of this call structure
                tg["sol"] = {**sol, "needed_of_sol": sol["ms"] / need}
                tg["gap"] += (f"; SOL (best of the sweep: {sol['label']}) {sol['ms']:.3f} ms, the target needs "
                              f"{sol['ms'] / need:.0%} of its speed"
                              + (": below the speed of light of this call structure" if need < sol["ms"] else ""))
            out.append(tg)
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
    targets = _step_targets(rows, t, cfg, other_gpu(res)) + _prefill_targets(res["rows"], t, cfg)
    pairs = slower_than_legacy(res["rows"], cfg)
    slow = [p for p in pairs if p["slower"]]
    targets.append(_target("every tuned path faster than its legacy counterpart", "all faster",
                           f"{len(pairs) - len(slow)} of {len(pairs)} faster", (not slow) if pairs else None,
                           "met" if pairs and not slow else "not measured in this run" if not pairs else
                           "slower: " + ", ".join(f"{p['tuned']} vs {p['legacy']} {p['shape']} M={p['m']} "
                                                  f"({p['speedup']['median']:.2f}x)" for p in slow)))
    blocked = [r["key"] for r in res["rows"] if r.get("status") == "blocked"]
    errors = [r["key"] for r in res["rows"] if r.get("status") == "error"]
    return {"targets": targets, "tuned_vs_legacy": pairs, "blocked": blocked, "errors": errors, **judge(res)}


def noise_floor(res: dict) -> dict | None:
    """The run's noise floor: the interval of the A/A row's ratio (the control against itself)."""
    aa = next((r for r in res["rows"] if r.get("key") == "aa"), None)
    return ((aa or {}).get("ratios") or {}).get("a2_over_a")


def _faster_than_bandwidth(side: dict, bw: float | None) -> dict | None:
    """Per round, the time to stream the side's weight bytes at the run's read bandwidth over
    the side's time (> 1: faster than streaming its bytes), with its interval."""
    rounds, nb = side.get("rounds"), side.get("bytes")
    if not rounds or not nb or not bw:
        return None
    t_stream = nb / (bw * 1e3)             # µs
    return stats.ratio_interval([t_stream] * len(rounds), rounds)


def judge(res: dict) -> dict:
    """What the statistics say of every row: a verdict for B over A from its interval against
    the run's noise floor (faster, slower, within noise); a side faster than the speed of light
    (a step: the best SOL read; a shape: streaming its bytes at the measured bandwidth) by
    more than that noise is 'suspicious' (skipped work or a cached result); rows whose checks
    after timing failed; rows with throttled rounds or control drift; and the run's own drift
    (its A/A row first and last)."""
    aa = noise_floor(res)
    _, hi = stats.noise_band(aa)
    bw = res.get("stream_read_gbps")
    suspicious, suspect, drifted, throttled = [], [], [], []
    for r in res["rows"]:
        if r.get("kind") not in ("shape", "step", "aa"):
            continue
        rat = r.get("ratios") or {}
        if r.get("kind") != "aa" and rat.get("b_over_a"):
            r["verdict"] = stats.verdict(rat["b_over_a"], aa)
        elif r.get("status") == "same":
            r["verdict"] = "A == B, not timed"
        for s, side in (r.get("sides") or {}).items():
            if r["kind"] == "step":
                best = r.get("sol_best")
                ci = ratio(r, s, best) if best and s in ("a", "b") else None     # > 1: s faster than the SOL
                what = f"faster than the speed of light ({best})"
            else:
                ci = _faster_than_bandwidth(side, bw)
                what = "faster than streaming its weight bytes at the measured bandwidth"
            if ci and ci.get("lo", 0) > hi:
                side["suspicious"] = f"{ci['median']:.2f}x [{ci['lo']:.2f}-{ci['hi']:.2f}] {what}"
                path = side.get("path") or "+".join(sorted(set((side.get("paths") or {}).values())))
                suspicious.append(f"{r['key']} {s} {path}: " + side["suspicious"]
                                  + " by more than the noise: skipped work or a cached result?")
        if r.get("check_failures"):
            suspect += [f"{r['key']} {f}" for f in r["check_failures"]]
        t = r.get("timing") or {}
        d = t.get("drift")
        if d and d.get("flagged"):
            drifted.append(f"{r['key']}: control {t.get('control')} {d['first']:.4g} -> {d['last']:.4g} "
                           f"({d['ratio'] - 1:+.1%}, beyond {d['tol']:.0%})")
        if t.get("throttled"):
            throttled.append(f"{r['key']}: {t['throttled']} of {t.get('rounds')} rounds read a throttle reason "
                             + ("(dropped)" if t.get("dropped") else "(kept: too few clean rounds left)"))
    first = next((r for r in res["rows"] if r.get("key") == "aa"), None)
    last = next((r for r in res["rows"] if r.get("key") == "aa:last"), None)
    run_drift = None
    ta, tb = ((((x or {}).get("sides") or {}).get("a") or {}).get("rounds") for x in (first, last))
    if ta and tb:
        run_drift = stats.drift(ta, tb)
        if run_drift["flagged"]:
            drifted.append(f"run: the A/A control {run_drift['first']:.4g} µs at the start, {run_drift['last']:.4g} "
                           f"µs at the end ({run_drift['ratio'] - 1:+.1%}, beyond {run_drift['tol']:.0%})")
    return {"noise": aa, "suspicious": suspicious, "suspect": suspect, "drift": drifted, "throttled": throttled,
            "run_drift": run_drift}
