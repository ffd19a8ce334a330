"""What a bench run shows: one progress line per item, the console tables, and a Markdown report
with a plot beside it (speedup and percent of bandwidth per shape and M). Reads only the result
dicts of pq2verify.bench, so a dry run exercises all of it."""
from pathlib import Path

from .plan import INT8_PEAK_TOPS, TARGET_GPU

DASH = "-"


# --- cells ------------------------------------------------------------------------------------
def num(v, digits=1) -> str:
    if v is None:
        return DASH
    return f"{v:,.{digits}f}" if abs(v) < 100 else f"{v:,.0f}"


def pct(v) -> str:
    return DASH if v is None else f"{v * 100:.0f}%"


def ratio_cell(sp, control=False) -> str:
    """median of the per-round ratios [its 95% bootstrap interval] (older rows: [min-max])."""
    if not sp:
        return DASH
    lo, hi = (sp["lo"], sp["hi"]) if "lo" in sp else (sp["min"], sp["max"])
    s = f"{sp['median']:.2f}x [{lo:.2f}-{hi:.2f}]"
    return s + (" A/A" if control else "")


def verdict_cell(row: dict) -> str:
    if row.get("status") == "same":
        return "A == B, not timed"
    v = row.get("verdict") or DASH
    sus = [s for s, side in (row.get("sides") or {}).items() if side.get("suspicious")]
    if sus:
        v += " SUSPICIOUS " + ",".join(sus)
    if row.get("check_failures"):
        v += " CHECK FAILED"
    return v


def rounds_cell(row: dict) -> str:
    t = row.get("timing") or {}
    if not t.get("rounds"):
        return DASH
    out = f"{t['rounds']}" + (f" ({t['stopped']})" if t.get("stopped") else "")
    d = t.get("drift")
    if d and d.get("flagged"):
        out += f" DRIFT {d['ratio'] - 1:+.0%}"
    if t.get("throttled"):
        out += f" throttled {t['throttled']}"
    return out


def time_cell(side: dict, digits=1) -> str:
    if side is None:
        return DASH
    if side.get("error"):
        return "ERROR"
    if side.get("gate") == "BLOCKED":
        return "BLOCKED"
    t = side.get("time")
    return DASH if not t else num(t["median"], digits)


def clock_cell(side: dict) -> str:
    c = (side or {}).get("clocks") or {}
    sm = c.get("sm_mhz")
    return DASH if not sm else f"{sm['median']:.0f} ({sm['min']:.0f}-{sm['max']:.0f})"


def mem_cell(side: dict) -> str:
    c = ((side or {}).get("clocks") or {}).get("mem_mhz")
    return DASH if not c else f"{c['median']:.0f}"


def power_cell(side: dict) -> str:
    c = ((side or {}).get("clocks") or {}).get("power_w")
    return DASH if not c else f"{c['median']:.0f} (max {c['max']:.0f})"


def gate_cell(row: dict) -> str:
    if row.get("status") == "error":
        return "ERROR"
    bad = [s for s, v in (row.get("sides") or {}).items() if v.get("gate") != "PASS"]
    return "PASS" if not bad else "BLOCKED " + ",".join(bad)


def path_cell(row: dict, s: str) -> str:
    side = (row.get("sides") or {}).get(s) or {}
    if "paths" in side:   # a step: the distinct paths it ran
        names = sorted(set(side["paths"].values()))
        return "+".join(names) if names else DASH
    return side.get("path", DASH)


# --- progress -------------------------------------------------------------------------------
def progress_line(i: int, n: int, row: dict) -> str:
    head = f"[{i}/{n}] "
    st = row.get("status")
    if st == "error":
        return head + f"{row['key']}: ERROR {row.get('error')}"
    if row["kind"] == "bandwidth":
        if st != "timed":
            return head + f"bandwidth: {row.get('note', st)}"
        parts = ", ".join(f"{k} {num(v.get('gbps'), 0)} GB/s" for k, v in row["probes"].items())
        return head + f"bandwidth: stream read {num(row['stream_read_gbps'], 0)} GB/s ({parts})"
    if row["kind"] == "launch":
        return head + f"launch cost {row['shape']} M={row['m']}: " + (
            row.get("note", st) if st == "skipped" else "; ".join(launch_brief(e) for e in row.get("entries") or [])
            or f"{st}: {row.get('error')}")
    if row["kind"] == "aa":
        what = f"A/A {row['shape']} M={row['m']} {path_cell(row, 'a')}"
        if st != "timed":
            return head + f"{what}: {row.get('note') if st == 'skipped' else st.upper()}"
        noise = ratio_cell((row.get("ratios") or {}).get("a2_over_a"))
        return head + f"{what}: noise floor {noise}, rounds {rounds_cell(row)}"
    if st == "same":
        what = (f"{row['shape']} M={row['m']}" if row["kind"] == "shape" else f"decode step M={row['m']}")
        return head + f"{what}: {row.get('note')}"
    sides = row["sides"]
    what = (f"{row['shape']} {row['n']}x{row['k']} M={row['m']}" if row["kind"] == "shape"
            else f"decode step M={row['m']} ({row['calls']} calls)")
    unit = "µs" if row["kind"] == "shape" else "ms"
    bits = []
    for s, label in (("a", "A"), ("b", "B"), ("bf16", "BF16")):
        if s not in sides:
            continue
        side = sides[s]
        cell = f"{label} {path_cell(row, s)} {side['gate']}"
        if side.get("time"):
            cell += f" {num(side['time']['median'], 3 if unit == 'ms' else 1)} {unit}"
        if side.get("error"):
            cell += " ERROR"
        bits.append(cell)
    r = row.get("ratios") or {}
    if r.get("b_over_a"):
        bits.append("B/A " + ratio_cell(r["b_over_a"], row.get("control")))
    if r.get("b_over_bf16"):
        bits.append("B/BF16 " + ratio_cell(r["b_over_bf16"]))
    b = sides.get("b", {})
    if row["kind"] == "shape" and b.get("pct_bw") is not None:
        bits.append(f"B {pct(b['pct_bw'])} of BW, SM {clock_cell(b)} MHz")
    if row["kind"] == "step" and b.get("pct_floor") is not None:
        bits.append(f"B at {pct(b['pct_floor'])} of floor {row['floor_ms']:.3f} ms")
    best = row.get("sol_best")
    sol = (row.get("sol") or {}).get(best) or {}
    if sol.get("time"):
        bits.append(f"SOL {sol_name(best)} {num(sol['time']['median'], 3)} ms ({pct(sol.get('pct_floor'))} of floor)")
    errs = [lab for lab, v in (row.get("sol") or {}).items() if v.get("error")]
    if errs:
        bits.append("SOL ERROR " + ",".join(errs))
    pw = row.get("power")
    if pw:
        bp = (pw.get("sides") or {}).get("b+spin") or {}
        bits.append(f"power proxy ERROR {pw['error']}" if pw.get("error") else
                    f"with {pw['spin_us']:g} µs spins: B {num((bp.get('time') or {}).get('median'), 3)} ms, "
                    f"B matrix {num((bp.get('matrix') or {}).get('median'), 3)} ms at SM {clock_cell(bp)} MHz")
    if (row.get("timing") or {}).get("rounds"):
        bits.append(f"rounds {rounds_cell(row)}")
    if row.get("check_failures"):
        bits.append("CHECK AFTER TIMING FAILED: " + "; ".join(row["check_failures"]))
    if st == "skipped":
        bits.append(row.get("note", "timing skipped"))
    return head + what + ": " + " | ".join(bits)


# --- tables as rows of cells (shared by the console and Markdown) -----------------------------
SHAPE_COLS = ("shape", "M", "A path", "B path", "gate", "A µs", "B µs", "B/A", "verdict", "rounds", "BF16 µs",
              "B/BF16", "B GB/s", "B %BW", "B Top/s", "B %int8 peak", "B SM MHz", "mem MHz", "B power W")
STEP_COLS = ("M", "A paths", "B paths", "gate", "A ms", "B ms", "BF16 ms", "floor ms", "A %floor",
             "B %floor", "B/A", "verdict", "rounds", "B/BF16", "B SM MHz", "B power W")
SOL_COLS = ("M", "floor ms", "plain ms", "PDL wait first", "PDL 1 chunk", "PDL 2", "PDL 4", "PDL all",
            "SOL = best", "SOL %floor", "A/SOL", "B/SOL")
AA_COLS = ("item", "shape", "M", "path", "A µs", "A' µs", "A'/A (noise floor)", "rounds")
POWER_COLS = ("M", "spin µs (cycles; cycles/µs)", "spins alone ms (µs per spin)", "A ms", "A+spin ms", "A matrix ms",
              "B ms", "B+spin ms", "B matrix ms", "B matrix %floor", "B matrix / B plain", "B/A matrix",
              "B SM MHz plain", "B SM MHz +spin", "B power W plain", "B power W +spin", "note")
LAUNCH_COLS = ("shape", "M", "sides", "path", "host µs/call (min)", "GPU µs/call", "host/GPU", "launcher dominates",
               "first call ms", "cache", "note")


def sol_name(label) -> str:
    """'plain', 'PDL wait first', 'PDL 2 chunks', 'PDL all chunks' for a sol.SOL_LABELS label."""
    if not label:
        return DASH
    if label == "sol":
        return "plain"
    d = label[len("sol_pdl"):]
    return {"0": "PDL wait first", "_all": "PDL all chunks"}.get(d, f"PDL {d} chunk{'s' if d != '1' else ''}")
FIT_COLS = ("shape", "M", "side", "path", "fixed µs/call", "marginal GB/s", "marginal %BW",
            "µs at N/4, N/2, N", "max resid")


def shape_cells(row: dict) -> list:
    s = row.get("sides") or {}
    b, bf = s.get("b") or {}, s.get("bf16")
    r = row.get("ratios") or {}
    same = row.get("status") == "same"
    return [f"{row.get('shape')}", str(row.get("m")), path_cell(row, "a"), path_cell(row, "b"), gate_cell(row),
            time_cell(s.get("a")), time_cell(b) if not same else DASH,
            ratio_cell(r.get("b_over_a"), row.get("control")), verdict_cell(row), rounds_cell(row),
            time_cell(bf) if bf else DASH, ratio_cell(r.get("b_over_bf16")), num(b.get("gbps"), 0),
            pct(b.get("pct_bw")), *_tops_cells(row, b), clock_cell(b), mem_cell(b), power_cell(b)]


def _tops_cells(row: dict, b: dict) -> list:
    """Top/s and the fraction of the int8 peak, for prefill rows (M > 16) only."""
    if (row.get("m") or 0) <= 16 or not b.get("tops"):
        return [DASH, DASH]
    return [num(b["tops"], 0), pct(b["tops"] / INT8_PEAK_TOPS)]


def step_cells(row: dict) -> list:
    s = row.get("sides") or {}
    a, b, bf = s.get("a") or {}, s.get("b") or {}, s.get("bf16") or {}
    r = row.get("ratios") or {}
    bf_ms = time_cell(bf, 3)
    if bf.get("method") == "sum" and bf.get("time"):
        bf_ms += " (sum)"
    return [str(row.get("m")), path_cell(row, "a"), path_cell(row, "b"), gate_cell(row), time_cell(a, 3),
            time_cell(b, 3), bf_ms, num(row.get("floor_ms"), 3), pct(a.get("pct_floor")), pct(b.get("pct_floor")),
            ratio_cell(r.get("b_over_a"), row.get("control")), verdict_cell(row), rounds_cell(row),
            ratio_cell(r.get("b_over_bf16")), clock_cell(b), power_cell(b)]


def sol_cells(row: dict) -> list:
    """A step against the speed-of-light reads of its bytes: their ms and % of the floor, and
    each side's time over theirs (per round, median [min-max]; 1.00x = at the speed of light)."""
    from .sol import SOL_LABELS
    sol = row.get("sol") or {}
    r = row.get("ratios") or {}
    cells = [str(row.get("m")), num(row.get("floor_ms"), 3)]
    for lab in SOL_LABELS:
        v = sol.get(lab) or {}
        cells.append("ERROR" if v.get("error") else num((v.get("time") or {}).get("median"), 3))
    best = row.get("sol_best")
    cells += [sol_name(best), pct((sol.get(best) or {}).get("pct_floor"))]
    return cells + [ratio_cell(r.get(f"{best}_over_{s}")) if best else DASH for s in ("a", "b")]


def power_cells(row: dict) -> list:
    """The step with and without the power proxy (a spin after each call): each side's plain and
    with-spin ms, the matrix kernels' own ms (with-spin minus the spins alone, per round), clocks."""
    pw = row.get("power") or {}
    s, ps = row.get("sides") or {}, pw.get("sides") or {}
    a, b = s.get("a") or {}, s.get("b") or {}
    ap, bp, sp = ps.get("a+spin") or {}, ps.get("b+spin") or {}, ps.get("spin") or {}
    cal = pw.get("calibration") or {}
    notes = ([f"ERROR {pw['error']}"] if pw.get("error") else []) + \
        [f"{lab} ERROR {v['error']}" for lab, v in ps.items() if v.get("error")] + \
        [f"CHECK FAILED {f}" for f in pw.get("check_failures") or []]
    spin = (f"{pw['spin_us']:g} ({pw.get('cycles', DASH)}; {num(cal.get('cycles_per_us'), 0)})" if pw else DASH)
    return [str(row.get("m")), spin,
            time_cell(sp, 3) + (f" ({num(sp['us_per_spin'], 2)})" if sp.get("us_per_spin") else ""),
            time_cell(a, 3), time_cell(ap, 3), ci_cell(ap.get("matrix"), 3),
            time_cell(b, 3), time_cell(bp, 3), ci_cell(bp.get("matrix"), 3), pct(bp.get("matrix_pct_floor")),
            ratio_cell(bp.get("matrix_over_plain")), ratio_cell(pw.get("b_over_a")),
            clock_cell(b), clock_cell(bp), power_cell(b), power_cell(bp), "; ".join(notes) or DASH]


def ci_cell(ci, digits=3) -> str:
    """median [95% bootstrap interval] of a time."""
    if not ci:
        return DASH
    return f"{num(ci['median'], digits)} [{num(ci['lo'], digits)}-{num(ci['hi'], digits)}]"


def launch_entries(res: dict) -> list:
    """(launch row, entry) for every path of every launch row, by shape then M."""
    out = []
    for r in _rows(res, "launch"):
        es = r.get("entries") or ([{"path": "?", "sides": DASH, "error": str(r["error"])}] if r.get("error") else [])
        out += [(r, e) for e in es]
    return out


def launch_cells(row: dict, e: dict) -> list:
    h, f = e.get("host") or {}, e.get("first_call") or {}
    dom = e.get("dominates")
    return [str(row.get("shape")), str(row.get("m")), e.get("sides", DASH), e.get("path", DASH),
            f"{num(h['median_us'], 1)} ({num(h['min_us'], 1)})" if h else DASH, num(e.get("gpu_us"), 1),
            f"{e['host_over_gpu']:.2f}x" if e.get("host_over_gpu") else DASH,
            DASH if dom is None else "YES" if dom else "no", num(f.get("ms"), 0) if f else DASH,
            f.get("cache", DASH) if f else "not first called in this process",
            ("ERROR " + e["error"]) if e.get("error") else e.get("note") or DASH]


def launch_brief(e: dict) -> str:
    if e.get("error"):
        return f"{e.get('path')} ({e.get('sides')}) ERROR {e['error']}"
    h = e.get("host") or {}
    out = f"{e['path']} ({e['sides']}) host {num(h.get('median_us'), 1)} µs/call vs GPU {num(e.get('gpu_us'), 1)} µs"
    return out + (" LAUNCHER-BOUND" if e.get("dominates") else "")


LAUNCH_NOTE = ("No cached launch plan was built: this table measures whether one is needed (a plan must be keyed "
               "on more than a data pointer, which goes stale, and proven with the graph staleness checks); "
               "a path marked YES is launcher-bound in eager prefill at that M.")


def aa_cells(row: dict) -> list:
    s = row.get("sides") or {}
    return [row["key"], str(row.get("shape")), str(row.get("m")), path_cell(row, "a"), time_cell(s.get("a")),
            time_cell(s.get("a2")), ratio_cell((row.get("ratios") or {}).get("a2_over_a")), rounds_cell(row)]


def fit_rows(res: dict, bw=None) -> list:
    """One row per (shape, M, side) with a fixed-cost fit."""
    out = []
    for row in _rows(res, "shape"):
        for s, label in (("a", "A"), ("b", "B"), ("bf16", "BF16")):
            side = (row.get("sides") or {}).get(s) or {}
            f = side.get("fit")
            if not f and not side.get("fit_error"):
                continue
            if not f:
                out.append([row["shape"], str(row["m"]), label, side.get("path", DASH), "ERROR: " + side["fit_error"]]
                           + [DASH] * 4)
                continue
            gb = f.get("gbps")
            out.append([row["shape"], str(row["m"]), label, side.get("path", DASH), num(f["fixed_us"], 2),
                        num(gb, 0) if gb else "n/a (slope <= 0)", pct(gb / bw) if gb and bw else DASH,
                        ", ".join(num(t, 1) for _, t in f["points"]), f"{f['max_resid'] * 100:.1f}%"])
    return out


def _rows(res: dict, kind: str) -> list:
    """Rows of one kind for display: by shape (in plan order), then M."""
    rows = [r for r in res["rows"] if r.get("kind") == kind]
    first = {}
    for r in rows:
        first.setdefault(r.get("shape"), len(first))
    return sorted(rows, key=lambda r: (first[r.get("shape")], r.get("m") or 0))


def title(res: dict) -> str:
    c = res["config"]
    return f"pq2verify bench: A = {c['a']} vs B = {c['b']} ({c['dtype']}, {c['layout']} weights)"


# --- console ------------------------------------------------------------------------------------
def console_tables(res: dict) -> list:
    from rich.table import Table
    out = []
    for kind, cols, cells, name in (("aa", AA_COLS, aa_cells, "A/A: the control against itself (noise floor)"),
                                    ("shape", SHAPE_COLS, shape_cells, "per shape (µs per call)"),
                                    ("step", STEP_COLS, step_cells, "chained decode step (ms per step)"),
                                    ("step", SOL_COLS, sol_cells, "decode step against the speed of light")):
        rows = _rows(res, kind)
        if not rows:
            continue
        t = Table(title=f"{title(res)}: {name}")
        for col in cols:
            t.add_column(col, overflow="fold")
        for r in rows:
            style = "red" if r.get("status") in ("blocked", "error") else None
            t.add_row(*cells(r) if r.get("status") != "error" else _error_cells(r, len(cols)), style=style)
        out.append(t)
    pws = [r for r in _rows(res, "step") if r.get("power")]
    if pws:
        t = Table(title=f"{title(res)}: decode step at serving clocks (a spin after each call; matrix = with spin "
                        "minus the spins alone, per round)")
        for col in POWER_COLS:
            t.add_column(col, overflow="fold")
        for r in pws:
            t.add_row(*power_cells(r))
        out.append(t)
    le = launch_entries(res)
    if le:
        t = Table(title="launch cost outside graphs (eager prefill calls: host µs per call, first call in the process)")
        for col in LAUNCH_COLS:
            t.add_column(col, overflow="fold")
        for r, e in le:
            t.add_row(*launch_cells(r, e), style="red" if e.get("error") else "yellow" if e.get("dominates") else None)
        out.append(t)
    fits = fit_rows(res, res.get("stream_read_gbps"))
    if fits:
        t = Table(title="fixed cost per call and marginal bandwidth (t = fixed + bytes / BW over N/4, N/2, N)")
        for col in FIT_COLS:
            t.add_column(col, overflow="fold")
        for f in fits:
            t.add_row(*f)
        out.append(t)
    t = Table(title=f"targets ({targets_scope(res)})")
    for col in ("target", "want", "measured", "met", "gap"):
        t.add_column(col, overflow="fold")
    for g in res.get("targets", []):
        t.add_row(g["target"], g["want"], g["got"], met_cell(g["met"]), g["gap"])
    out.append(t)
    return out


def _error_cells(r: dict, n: int) -> list:
    first = ([r.get("shape") or DASH, str(r.get("m"))] if r["kind"] == "shape" else
             [r["key"], r.get("shape") or DASH, str(r.get("m"))] if r["kind"] == "aa" else [str(r.get("m"))])
    return first + ["ERROR: " + str(r.get("error"))] + [DASH] * (n - len(first) - 1)


def targets_scope(res: dict) -> str:
    """What the targets' heading names: the GPU they are set for, and this run's where it differs."""
    from .verdicts import other_gpu
    gpu = other_gpu(res)
    return f"set for the {TARGET_GPU}; this run: {gpu}" if gpu else TARGET_GPU


def met_cell(met) -> str:
    return "yes" if met else "NO" if met is False else "not measured"


def blocked_lines(res: dict) -> list:
    """'key side path: reason' for every side whose gate failed."""
    out = []
    for r in res["rows"]:
        for s, side in (r.get("sides") or {}).items():
            if side.get("gate") == "BLOCKED":
                rep = (side.get("checks") or {}).get("repro")
                out.append(f"{r['key']} {s} {path_cell(r, s)}: {side.get('reason')}"
                           + (f" (reproduce: {rep})" if rep else ""))
    return out


def values_lines(row: dict) -> list:
    """What the chained step's eager run (before timing) says of its values, per side."""
    out = []
    for s, side in (row.get("sides") or {}).items():
        v = side.get("values")
        if not v:
            continue
        head = f"{row['key']} {s}: chained values"
        if v.get("error"):
            out.append(f"ERROR {head}: the eager run raised {v['error']}")
        elif not v["finite"]:
            out.append(f"NOT FINITE {head}: {v['nonfinite']} of {v['calls']} outputs, the first at {v['first_bad']}")
        elif not v.get("bounded", True):
            out.append(f"UNBOUNDED {head}: output RMS {v['rms_min']:.3g}-{v['rms_max']:.3g} x the step input's "
                       f"(beyond 2^16 either way)")
        else:
            out.append(f"{head}: all {v['calls']} outputs finite, output RMS {v['rms_min']:.3g}-{v['rms_max']:.3g} "
                       f"x the step input's (last {v['rms_last']:.3g})")
    return out


def summary_lines(res: dict) -> list:
    out = []
    bw = res.get("stream_read_gbps")
    out.append(f"streaming read bandwidth (this run): {num(bw, 0)} GB/s" if bw else
               f"streaming read bandwidth: not measured ({res.get('note', 'no GPU')})")
    for p in sorted(res.get("tuned_vs_legacy", []), key=lambda p: (p["shape"], p["m"])):
        if p["slower"]:
            out.append(f"{p['tuned']} vs {p['legacy']} at {p['shape']} M={p['m']}: {ratio_cell(p['speedup'])} "
                       f"-> slower than legacy: remove from tuned selection"
                       + (" (interval includes 1: confirm with a fresh run)" if p["within_noise"] else ""))
    aa = res.get("noise")
    out.append(f"noise floor (A/A row, the control against itself): {ratio_cell(aa)}" if aa else
               "noise floor: no A/A row timed in this run (verdicts against 1 alone)")
    if res.get("run_drift"):
        d = res["run_drift"]
        out.append(f"run drift bracket (A/A control first and last): {d['ratio']:.3f}x"
                   + (" DRIFT beyond the tolerance" if d["flagged"] else ""))
    for line in res.get("suspicious") or []:
        out.append("SUSPICIOUS " + line)
    for line in res.get("suspect") or []:
        out.append("CHECK AFTER TIMING FAILED " + line)
    for line in res.get("drift") or []:
        out.append("DRIFT " + line)
    for line in res.get("throttled") or []:
        out.append("THROTTLED " + line)
    bl = res.get("baseline")
    if bl:
        out.append(f"regression gate against {bl['file']} (tolerance {bl['tol']:.0%}): {len(bl['rows'])} sides "
                   f"compared, {len(bl['regressions'])} slower beyond it"
                   + (f", {len(bl['missing'])} stored rows not timed in this run" if bl["missing"] else ""))
        for line in bl["regressions"]:
            out.append("REGRESSION " + line)
    for line in blocked_lines(res):
        out.append("BLOCKED " + line)
    for r in res["rows"]:
        if r.get("status") == "error":
            out.append(f"ERROR {r['key']}: {r.get('error')}")
        for s, side in {**(r.get("sides") or {}), **(r.get("sol") or {})}.items():
            if side.get("error"):
                out.append(f"ERROR {r['key']} {s}: {side['error']}")
            if side.get("fit_error"):
                out.append(f"ERROR {r['key']} {s} fixed-cost fit: {side['fit_error']}")
        out += values_lines(r)
        pw = r.get("power") or {}
        if pw.get("error"):
            out.append(f"POWER PROXY {r['key']}: {pw['error']} (the step without it stands)")
        for lab, v in (pw.get("sides") or {}).items():
            if v.get("error"):
                out.append(f"POWER PROXY {r['key']} {lab}: {v['error']} (the step without it stands)")
        for f in pw.get("check_failures") or []:
            out.append(f"POWER PROXY {r['key']} CHECK AFTER TIMING FAILED {f} (its times are not trusted)")
        if r.get("kind") == "launch":
            if r.get("error"):
                out.append(f"LAUNCH COST {r['key']}: {r['error']}")
            for e in r.get("entries") or []:
                if e.get("error"):
                    out.append(f"LAUNCH COST {r['key']} {e.get('path')}: {e['error']}")
    bound = sorted({f"{e['path']} at {r['shape']} M={r['m']} ({e['host']['median_us']:.0f} µs host > "
                    f"{e['gpu_us']:.0f} µs GPU)" for r, e in launch_entries(res) if e.get("dominates")})
    if bound:
        out.append("launcher-bound in eager prefill (host µs per call > GPU µs per call): " + ", ".join(bound))
    if res.get("not_run"):
        out.append(f"PARTIAL: {len(res['not_run'])} items not run (budget of {res['config'].get('budget_s')} s spent; "
                   "--resume continues): " + ", ".join(res["not_run"]))
    if res.get("resumed"):
        out.append(f"resumed from the JSON lines file: {len(res['resumed'])} items")
    return out


# --- Markdown -------------------------------------------------------------------------------------
def _md_table(cols, rows) -> list:
    """The report's table model (report.table) as Markdown; a BLOCKED or ERROR cell highlighted."""
    from ..report.table import Cell, Table
    t = Table(tuple(cols))
    t.rows = [([Cell(str(c), bad=str(c).startswith(("BLOCKED", "ERROR"))) for c in r], "") for r in rows]
    return t.markdown()


def _side_clock_rows(res: dict) -> list:
    out = []
    for r in res["rows"]:
        for s, side in {**(r.get("sides") or {}), **(r.get("sol") or {})}.items():
            if side.get("clocks"):
                n = side["clocks"].get("n", 0)
                out.append([r["key"], s, path_cell(r, s), clock_cell(side), mem_cell(side), power_cell(side), str(n)])
    return out


def markdown(res: dict, png_name: str | None, plot_note: str = "") -> str:
    h = res["header"]
    prov = h.get("provenance", {})
    c = res["config"]
    L = [f"# {title(res)}", ""]
    L += [f"- backend: {prov.get('backend', '?')}; torch {prov.get('torch', '?')}, triton {prov.get('triton', '?')}; "
          f"commit {prov.get('commit', '?')}; {prov.get('date', '')}",
          f"- NVML clocks and power: {prov.get('nvml', 'n/a')}; start clocks: SM {prov.get('sm_clock_mhz', '?')} MHz, "
          f"memory {prov.get('mem_clock_mhz', '?')} MHz, {prov.get('power_w', '?')} W",
          f"- settings: {c['pairs']} alternating rounds after {c['warmup']} warm-up, weights rotated through >= "
          f"{c['rotate_gb']} GB of copies, samples of >= {c['min_sample_ms']} ms, gate reruns {c['reruns']}, "
          f"budget {c['budget_s']} s; ran {res.get('elapsed_s', 0):.0f} s"]
    from .. import provenance
    L += [f"- {w}" for w in [provenance.status_line(prov)] if w]      # the backend's missing records
    for line in summary_lines(res):
        L.append(f"- {line}")
    L += ["", f"## Targets ({targets_scope(res)})", ""]
    L += _md_table(("target", "want", "measured", "met", "gap"),
                   [[g["target"], g["want"], g["got"], met_cell(g["met"]), g["gap"]] for g in res.get("targets", [])])
    pairs = res.get("tuned_vs_legacy", [])
    if pairs:
        L += ["", "## Tuned paths against their legacy counterparts", ""]
        L += _md_table(("shape", "M", "tuned", "legacy", "speedup [range]", "verdict"),
                       [[p["shape"], p["m"], p["tuned"], p["legacy"], ratio_cell(p["speedup"]),
                         p["verdict"] + (" (range includes 1)" if p["within_noise"] else "")]
                        for p in sorted(pairs, key=lambda p: (p["shape"], p["m"]))])
    bwr = next((r for r in res["rows"] if r.get("kind") == "bandwidth"), None)
    if bwr and bwr.get("probes"):
        L += ["", "## Bandwidth (measured in this run)", ""]
        L += _md_table(("probe", "bytes", "µs", "GB/s", "SM MHz"),
                       [[k, num(v.get("bytes", 0) / 1e9, 2) + " GB", num((v.get("us") or {}).get("median")),
                         num(v.get("gbps"), 0), clock_cell(v)] if "error" not in v else [k, "-", "-", v["error"], "-"]
                        for k, v in bwr["probes"].items()])
    aas = _rows(res, "aa")
    if aas:
        L += ["", "## A/A: the control against itself (the run's noise floor; first and last item)", ""]
        L += _md_table(AA_COLS, [aa_cells(r) if r.get("status") != "error" else _error_cells(r, len(AA_COLS))
                                 for r in aas])
    bl = res.get("baseline")
    if bl and bl["rows"]:
        L += ["", f"## Regression gate against {bl['file']}", ""]
        L += _md_table(("item", "side", "stored / this run [95%]", "verdict"),
                       [[e["key"], e["side"], f"{e['speedup']['median']:.3f}x [{e['speedup']['lo']:.3f}-"
                         f"{e['speedup']['hi']:.3f}]", e["verdict"]] for e in bl["rows"]])
    steps = _rows(res, "step")
    if steps:
        s0 = steps[0]
        calls, dense = s0.get("calls") or 0, s0.get("dense_calls") or 0
        L += ["", f"## Chained decode step ({calls} calls in model order: {calls - dense} PQ2 projections and "
              f"{dense} dense in_proj_ba; one graph, distinct weights, "
              f"{num((s0.get('weight_bytes') or 0) / 1e9, 2)} GB)", ""]
        L += _md_table(STEP_COLS, [step_cells(r) if r.get("status") != "error" else _error_cells(r, len(STEP_COLS))
                                   for r in steps])
        L += ["", "### Against the speed of light (pure streaming reads with the step's call structure; "
              "PDL swept over the chunks read before the wait; the SOL is the best of the sweep)", ""]
        L += _md_table(SOL_COLS, [sol_cells(r) if r.get("status") != "error" else _error_cells(r, len(SOL_COLS))
                                  for r in steps])
        L += ["", f"- chain: {s0['note']}"] if s0.get("status") == "timed" and s0.get("note") else [""]
        L += [f"- {v}" for r in steps for v in values_lines(r)]
        notes = {r["sides"]["bf16"].get("note") for r in steps if r.get("sides") and r["sides"]["bf16"].get("note")}
        meth = {r["sides"]["bf16"].get("method") for r in steps if r.get("sides")}
        gb = s0.get("bf16_bytes", 0) / 1e9
        graph = f"one chained graph of {calls} distinct bf16 weight copies ({gb:.1f} GB)"
        how = ([graph] if "graph" in meth else []) + (
            ["sum of the per-shape cuBLAS medians of this run times the calls per step"] if "sum" in meth else [])
        L += ["", "BF16 step: " + ("; ".join(how) if how else "not timed (no step row was timed)")]
        L += [f"- {n}" for n in sorted(notes)]
    pws = [r for r in steps if r.get("power")]
    if pws:
        L += ["", "### At serving clocks: a low-power spin after each call (torch.cuda._sleep), the step with and "
              "without it; matrix = the step with spins minus the graph of the spins alone, per round "
              "(median [95% interval])", ""]
        L += _md_table(POWER_COLS, [power_cells(r) for r in pws])
        cal = {(r["power"].get("calibration") or {}).get("source") for r in pws} - {None}
        L += [""] + [f"- spin calibration: {c}" for c in sorted(cal)]
    le = launch_entries(res)
    if le:
        L += ["", "## Launch cost outside graphs (eager prefill calls)", ""]
        L += _md_table(LAUNCH_COLS, [launch_cells(r, e) for r, e in le])
        L += ["", f"- {LAUNCH_NOTE}"]
    shapes = _rows(res, "shape")
    if shapes:
        L += ["", "## Per shape (µs per call; B/A = A time / B time per round: median [95% bootstrap interval])", ""]
        L += _md_table(SHAPE_COLS, [shape_cells(r) if r.get("status") != "error" else _error_cells(r, len(SHAPE_COLS))
                                    for r in shapes])
    fits = fit_rows(res, res.get("stream_read_gbps"))
    if fits:
        L += ["", "## Fixed cost per call and marginal bandwidth (per path, shape and M)", ""]
        L += _md_table(FIT_COLS, fits)
    clocks = _side_clock_rows(res)
    if clocks:
        L += ["", "## Clocks and power during each measurement (NVML)", ""]
        L += _md_table(("item", "side", "path", "SM MHz median (min-max)", "mem MHz", "power W", "readings"), clocks)
    blocked = blocked_lines(res)
    if blocked:
        L += ["", "## Blocked: numerics gate failed, no speed reported", ""] + [f"- {b}" for b in blocked]
    L += ["", "## Method", "",
          "- Gate: before timing, checks.evaluate runs on the same x and weight that are timed (relative RMS "
          "against the FP64 references on sampled rows, integer group dots, exactness claims, every output "
          "written, reruns identical). The cuBLAS baseline is gated against FP64 of its own decoded matrix.",
          "- Paths: each side runs pq2_matmul(kernels=A or B) once under dispatch.trace(); the traced path is "
          "gated and timed (its run(x, w, out=y)). Same path on both sides: a control (A/A) ratio.",
          "- Timing: one CUDA graph per contestant holding one call per weight copy (byte-identical clones at "
          "distinct addresses, >= the rotation size, so L2 never holds the weight); replays timed with CUDA "
          "events; rounds A B BF16, BF16 B A, ...; per-round ratios.",
          "- GB/s counts weight bytes only (PQ2: N*K/128*34; BF16: N*K*2); %BW is against the faster read "
          "probe of this run. Top/s = 2*M*N*K / time. Floor = the step's weight bytes (PQ2 and in_proj_ba) / "
          "that bandwidth.",
          "- Decode step: one CUDA graph of the step's calls in model order (64 layers: DeltaNet in_proj and "
          "in_proj_ba, or full-attention qkv; out; gate_up; down; then lm_head), each on its own weight copy "
          "and each the path's whole run() (activation quantization included). Chained as in a layer: a "
          "call's input is the first M*K elements of its source's [M, N] output viewed as [M, K] "
          "(in_proj_ba reads the layer input). Values stay bounded without an extra kernel: each copy's "
          "values are 2^e times the gated weight's (fp16 scales scaled, codes unchanged), e chosen along "
          "the chain; the step runs once eagerly before timing and its output RMS is reported. The gate "
          "ran each shape at that M on its seeded input; the chained inputs are the step's own.",
          "- Speed of light (SOL): the same number of kernels in the same order, each a pure streaming read "
          "of exactly its call's weight copy; SOL+PDL launches them with programmatic dependent launch, "
          "each kernel letting the next launch at once and issuing its first loads before waiting for the "
          "previous grid. A/SOL = A's step time / SOL's, per round.",
          "- Fixed cost and marginal bandwidth: each side also timed on the first N/4 and N/2 rows of the "
          "same weight (same K and M, the same graph of one call per rotating copy, in the same rounds); "
          "t = fixed + bytes / BW fitted by least squares over N/4, N/2, N. fixed = what a call costs "
          "beyond streaming its weights (launches, quantize or reduce kernels, prologue and tail); "
          "marginal GB/s = 1 / slope; max resid = the largest misfit over its point's time (a large one: "
          "the path's config changes with N).",
          "- Statistics: a ratio is the median of the per-round ratios with its 95% percentile-bootstrap "
          "interval over the rounds (seeded). The A/A row times the control against itself (two graphs of the "
          "same calls) first and last in the run: its interval is the noise floor, and its first and last "
          "times are the run's drift bracket. Verdict: faster or slower when B/A's interval lies wholly "
          "outside the noise floor (widened to include 1), else within noise. Rounds go on two at a time "
          "until each interval is at most --ci-width wide, --max-pairs rounds, or the budget ends (the "
          "rounds column says which). Each item's control is also timed before the first and after the "
          "last round (drift bracket, flagged beyond 5%); rounds during which NVML reported a throttle "
          "reason are flagged and dropped (kept, and said so, when fewer than 7 clean rounds remain).",
          "- Checks after timing: one replay of each timed graph after the last round must give the gate's "
          "function of the gated inputs (bit-equal for PQ2 paths, whose determinism the gate proved; cuBLAS "
          "within 1e-3 relative RMS); x and every weight copy keep their fingerprints; with x rewritten "
          "between replays the output must follow it; the CUDA events must see at least half the time of "
          "the synchronized host clock. A failed one marks the row CHECK FAILED and the run FAIL.",
          "- Suspicious: a side faster than the best speed-of-light read (a step) or than streaming its "
          "weight bytes at the measured bandwidth (a shape) by more than the noise floor: skipped work or a "
          "cached result, not a speedup; the run FAILs.",
          "- Serving clocks (power proxy): after each call of the chained step, torch.cuda._sleep(cycles), a "
          "one-thread kernel that spins on clock64() and touches no memory, standing in for the rest of the "
          "model. cycles = --spin-us x cycles per µs, and cycles per µs is the SM clock in MHz (clock64 counts "
          "SM cycles), measured in the same run just before the step's graphs are built: the median NVML SM "
          "clock during a 20M-cycle calibration spin (without NVML: its cycles over its CUDA-event time). The "
          "spins alone are one more graph in the same rounds: their time gives the realised µs per spin, and "
          "the matrix kernels' own time is, per round, the step with spins minus the spins alone. A spin "
          "between two calls cuts their PDL edge where a path has one (it is launched without PDL and never lets "
          "its successor launch early; the edges inside a call remain), so the matrix time under the proxy "
          "holds the launch latency PDL hides between calls in the plain step. The proxy's graphs carry the step's checks after timing; a failure in them is reported in "
          "its table and does not fail the run.",
          "- Launch cost outside graphs: for each shape at each prefill M (M > 16) and each side's path, "
          "time.perf_counter around each of 20 eager calls (5 rounds; the median over the 100 calls), the GPU "
          "first given a spin that outlasts the round, so the calls queue behind it and the host's cost is "
          "measured, not the GPU's (a round that outlasts the spin is noted). GPU µs/call = the shape row's "
          "graph-timed median of the same path at the same M; launcher dominates = host > GPU. First call = the "
          "first call of the path in the process (the trace that proves the path), device synchronized around "
          "it; cold when Triton's on-disk cache gained entries across it (compiled), warm when not (loaded); "
          "TRITON_CACHE_DIR set to an empty folder gives every path its cold first call. "
          + LAUNCH_NOTE,
          "- A == B: an item whose A and B resolve to the same path is not timed (dense shapes, the cuBLAS "
          "reference, time A alone); a run in which no item differs is refused before any work."]
    if png_name:
        L += ["", f"![speedup and percent of bandwidth]({png_name})"]
    elif plot_note:
        L += ["", f"(no plot: {plot_note})"]
    return "\n".join(L) + "\n"


# --- plot -----------------------------------------------------------------------------------------
def plot(res: dict, png: Path) -> str:
    """Left: speedup of B over A (solid) and over cuBLAS BF16 (dashed) per shape against M.
    Right: B's percent of the streaming read bandwidth per shape, and the step's percent of its
    floor. Returns '' when written, else why not."""
    rows = [r for r in _rows(res, "shape") if (r.get("ratios") or {}).get("b_over_a")]
    steps = [r for r in _rows(res, "step") if (r["sides"].get("b") or {}).get("pct_floor")]
    if not rows and not steps:
        return "no timed rows"
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    names = sorted({r["shape"] for r in rows})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, nm in enumerate(names):
        col = colors[i % len(colors)]
        pts = sorted((r for r in rows if r["shape"] == nm), key=lambda r: r["m"])
        ms = [r["m"] for r in pts]
        med = [r["ratios"]["b_over_a"]["median"] for r in pts]
        err = [[m - r["ratios"]["b_over_a"]["min"] for m, r in zip(med, pts)],
               [r["ratios"]["b_over_a"]["max"] - m for m, r in zip(med, pts)]]
        ax1.errorbar(ms, med, yerr=err, marker="o", capsize=3, color=col, label=nm)
        bf = [(r["m"], r["ratios"]["b_over_bf16"]["median"]) for r in pts if r["ratios"].get("b_over_bf16")]
        if bf:
            ax1.plot(*zip(*bf), ls="--", marker=".", color=col, alpha=0.7)
        bw = [(r["m"], r["sides"]["b"]["pct_bw"] * 100) for r in pts if r["sides"]["b"].get("pct_bw") is not None]
        if bw:
            ax2.plot(*zip(*bw), marker="o", color=col, label=nm)
    if steps:
        ax2.plot([r["m"] for r in steps], [r["sides"]["b"]["pct_floor"] * 100 for r in steps],
                 "k--", marker="s", label="decode step (% of floor)")
    c = res["config"]
    ax1.axhline(1.0, color="grey", ls=":")
    ax1.set(xscale="log", xlabel="M (rows)", ylabel="speedup (x)",
            title=f"B={c['b']} over A={c['a']} (solid), over cuBLAS BF16 (dashed)")
    ax2.set(xscale="log", xlabel="M (rows)", ylabel="% of streaming read bandwidth",
            title=f"B={c['b']}: weight bytes / time")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return ""


def write(res: dict, md_path: Path) -> tuple:
    """The Markdown report and its PNG beside it (same name, .png). Returns (md, png or None)."""
    md_path = Path(md_path)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    png = md_path.with_suffix(".png")
    note = plot(res, png)
    md_path.write_text(markdown(res, None if note else png.name, note))
    return md_path, (None if note else png)
