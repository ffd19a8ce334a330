"""The regression gate (`bench --baseline F.json`): each row's sides against the same row of a
stored run on the same GPU. A side fails when it is slower and the interval of old time / new
time lies wholly below 1 - tol (tol: the run-to-run allowance, 0 = any slowdown whose interval
excludes 1). The interval resamples each run's rounds on its own (stats.unpaired_ratio).

Two runs on two leases of the same GPU differ by their clocks and thermals: on the H200 every
side of an unchanged tree, cuBLAS's BF16 included, came out 0.4-1.1% slower than a stored run
(results/2026-12-02-redesign-gpu/). So where a row has the BF16 side in both runs (a library the
kernel change cannot touch), each side's ratio is divided by the BF16 ratio, with the interval
taken conservatively (lo / bf16 hi, hi / bf16 lo): a side fails only when it lost against the
control drift. The BF16 side itself is that reference and is not judged; the A/A rows ('aa',
'aa:last') are the run's own noise floor, not a kernel, and are not judged either."""
import json
from pathlib import Path

from . import stats

TOL = 0.0
SIDES = ("a", "b", "bf16")


def load(path) -> dict:
    """A stored `bench --json` result; ValueError (naming --baseline) if it is not one."""
    try:
        res = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--baseline {path}: not a bench --json result ({e})") from None
    if not isinstance(res, dict) or "rows" not in res or "header" not in res:
        raise ValueError(f"--baseline {path}: not a bench --json result (no rows or header)")
    return res


def check_comparable(stored: dict, sig: dict, path) -> None:
    """The stored run must come from the same GPU, dtype and layout (timings of others do not
    compare)."""
    old = (stored.get("header") or {}).get("config") or {}
    diff = [f"{k} {old.get(k)!r} (this run {sig.get(k)!r})" for k in ("env", "device", "dtype", "layout")
            if old.get(k) != sig.get(k)]
    if diff:
        raise ValueError(f"--baseline {path}: recorded with other settings: " + ", ".join(diff))


def _ratio(old_row: dict, new_row: dict, side: str) -> dict | None:
    a = ((old_row.get("sides") or {}).get(side) or {}).get("rounds")
    b = ((new_row.get("sides") or {}).get(side) or {}).get("rounds")
    return stats.unpaired_ratio(a, b) if a and b else None


def compare(res: dict, stored: dict, tol: float = TOL) -> dict:
    """{'rows': [one entry per (row, side) timed in both], 'regressions': [lines], 'missing':
    [keys of the stored run not timed in this one]}."""
    old = {r["key"]: r for r in stored.get("rows", []) if "key" in r}
    out, bad, missing = [], [], []
    now = {r["key"]: r for r in res.get("rows", []) if "key" in r}
    for key, o in old.items():
        r = now.get(key)
        if r is None or r.get("status") not in ("timed", "suspect"):
            if o.get("status") == "timed":
                missing.append(key)
            continue
        if key.startswith("aa"):
            continue
        ref = _ratio(o, r, "bf16")
        for s in SIDES:
            ci = _ratio(o, r, s)
            if ci is None:
                continue
            if s == "bf16":
                out.append({"key": key, "side": s, "speedup": ci, "regression": False,
                            "verdict": "reference (the drift between the runs)"})
                continue
            raw = ci
            if ref is not None:
                ci = {"median": ci["median"] / ref["median"], "lo": ci["lo"] / ref["hi"], "hi": ci["hi"] / ref["lo"]}
            slower = ci["hi"] < 1 - tol
            e = {"key": key, "side": s, "speedup": ci, "raw": raw, "against_bf16": ref is not None,
                 "regression": slower,
                 "verdict": "slower (regression)" if slower else
                            "faster" if ci["lo"] > 1 + tol else "within noise"}
            out.append(e)
            if slower:
                drift = f", against the BF16 row's {ref['median']:.3f}x" if ref is not None else ""
                bad.append(f"{key} {s}: {ci['median']:.3f}x the stored run [{ci['lo']:.3f}-{ci['hi']:.3f}]{drift}, "
                           f"slower beyond {tol:.0%}")
    return {"rows": out, "regressions": bad, "missing": missing, "tol": tol}
