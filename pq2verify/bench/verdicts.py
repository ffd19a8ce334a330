"""Targets and the tuned-vs-legacy verdicts."""

from .. import registry
from .plan import (Config, PREFILL_M, TARGET_PREFILL_VS_BF16, TARGET_STEP_M, TARGET_STEP_M1_FLOOR,
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
    return {"median": 1 / inv["median"], "min": 1 / inv["max"], "max": 1 / inv["min"], "n": inv["n"]}


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
            noise = sp["min"] < 1 < sp["max"]
            out.append({"shape": r["shape"], "m": r["m"], "tuned": ps, "legacy": po, "speedup": sp,
                        "slower": sp["median"] < 1, "within_noise": noise, "verdict": verdict})
    return out


def _target(name, want, got, met, gap) -> dict:
    return {"target": name, "want": want, "got": got, "met": met, "gap": gap}


def _step_targets(rows: dict, t: str, cfg: Config) -> list:
    """One row per M of the issue's table (M = 1, 2, 4, 8, 16, measured in this run or not):
    the tuned side's step at >= its fraction of the floor and within its time limit."""
    out = []
    limits = {1: TARGET_STEP_M1_MS, 16: TARGET_STEP_M16_MS}
    for m in TARGET_STEP_M:
        want_floor = TARGET_STEP_M1_FLOOR if m == 1 else TARGET_STEP_SMALL_FLOOR
        max_ms = limits.get(m)
        want = f">= {want_floor:.0%} of floor" + (f", <= {max_ms:g} ms" if max_ms else "")
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
            out.append(_target(name, want, f"{ms:.3f} ms = {pct:.1%} of floor {floor:.3f} ms", ok,
                               f"met with {need - ms:.3f} ms to spare" if ok
                               else f"{ms - need:.3f} ms too slow (needs <= {need:.3f} ms): " + ", ".join(short)))
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
    targets = _step_targets(rows, t, cfg) + _prefill_targets(res["rows"], t, cfg)
    pairs = slower_than_legacy(res["rows"], cfg)
    slow = [p for p in pairs if p["slower"]]
    targets.append(_target("every tuned path faster than its legacy counterpart", "all faster",
                           f"{len(pairs) - len(slow)} of {len(pairs)} faster", (not slow) if pairs else None,
                           "met" if pairs and not slow else "not measured in this run" if not pairs else
                           "slower: " + ", ".join(f"{p['tuned']} vs {p['legacy']} {p['shape']} M={p['m']} "
                                                  f"({p['speedup']['median']:.2f}x)" for p in slow)))
    blocked = [r["key"] for r in res["rows"] if r.get("status") == "blocked"]
    errors = [r["key"] for r in res["rows"] if r.get("status") == "error"]
    return {"targets": targets, "tuned_vs_legacy": pairs, "blocked": blocked, "errors": errors}
