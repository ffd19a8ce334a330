"""The regression gate (`bench --baseline F.json`): each row's sides against the same row of a
stored run on the same GPU. A side fails when it is slower and the interval of old time / new
time lies wholly below 1 - tol (tol: the run-to-run allowance, 0 = any slowdown whose interval
excludes 1). The interval resamples each run's rounds on its own (stats.unpaired_ratio)."""
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
        for s in SIDES:
            a = ((o.get("sides") or {}).get(s) or {}).get("rounds")
            b = ((r.get("sides") or {}).get(s) or {}).get("rounds")
            if not a or not b:
                continue
            ci = stats.unpaired_ratio(a, b)
            slower = ci["hi"] < 1 - tol
            e = {"key": key, "side": s, "speedup": ci, "regression": slower,
                 "verdict": "slower (regression)" if slower else
                            "faster" if ci["lo"] > 1 + tol else "within noise"}
            out.append(e)
            if slower:
                bad.append(f"{key} {s}: {ci['median']:.3f}x the stored run [{ci['lo']:.3f}-{ci['hi']:.3f}], "
                           f"slower beyond {tol:.0%}")
    return {"rows": out, "regressions": bad, "missing": missing, "tol": tol}
