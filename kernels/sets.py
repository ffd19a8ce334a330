"""The one rule for what a kernel set holds on a backend. dispatch picks from it at run time;
check, golden, bench and gsm8k select their paths with it, so they can never disagree.

- legacy: the legacy paths.
- tuned: the tuned paths that are not deselected (measured slower than their counterpart),
  then the legacy paths as the fallback for what no tuned path serves.
- exact: the tuned paths of `tuned` whose bit identity to their counterpart
  `check --derive-exact` proved on this backend (pq2verify/verified/exact-<key>.json: rule
  "proven", derived from the kernel sources as they are now), then the legacy paths. For a call
  of shape (n, k, m), dispatch also requires the two paths' declared fold orders to be equal
  there on this backend (`same_fold`): the proof covers the shapes where they are.
Per-path switches (PQ2_PATH_<NAME>) are applied by dispatch on top of this, per call.
"""
import functools
import hashlib
import json
from pathlib import Path as _P

from . import table

# The record's format: an entry of an older one (no "rule") is never trusted.
FORMAT = 2
# Kernel files every integer path's arithmetic shares (Q8, the fold term, the output rounding,
# split-K); a proof names their digest with the two paths' own files.
SHARED_SOURCES = ("kernels/common.py", "kernels/prepare.py", "kernels/splitk.py")
_ROOT = _P(__file__).resolve().parent.parent
# The proofs `pq2verify check --derive-exact` writes; the exact set trusts only these records.
VERIFIED_DIR = _ROOT / "pq2verify" / "verified"


def check_name(kset: str, source: str = "kernel set ") -> str:
    """kset if it is a kernel set's name; else ValueError naming where it came from
    (source: 'kernels=', 'PQ2_KERNELS=', '--kernels ')."""
    if kset not in table.KERNEL_SETS:
        raise ValueError(f"{source}{kset!r}: unknown kernel set; expected one of {', '.join(table.KERNEL_SETS)}")
    return kset


def verified_file(key: str) -> _P:
    return VERIFIED_DIR / f"exact-{'interpreter' if key == 'emulate' else key}.json"


def interpret_folds(key: str) -> bool:
    """Whose configs (and so fold orders) run on backend `key`: the interpreter's there; the
    GPU's on a GPU and in the emulation (emulation.emulate uses the GPU's configs)."""
    return key == "interpreter"


def sources_digest(*names: str) -> str:
    """sha256 (16 hex digits) of the kernel files of the named paths plus SHARED_SOURCES: a
    proof derived from other sources is stale. Read once per process (as the kernels are)."""
    return _digest(tuple(sorted(names)))


@functools.lru_cache(maxsize=None)
def _digest(names):
    files = sorted({table.get(n).module.replace(".", "/") + ".py" for n in names} | set(SHARED_SOURCES))
    h = hashlib.sha256()
    for f in files:
        h.update(f.encode() + b"\0" + (_ROOT / f).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def fold_plan(name: str, n: int, k: int, m: int, interpret: bool):
    """The declared FP32 order of path `name` for (n, k, m) as splits -> lanes -> groups (as
    emulation.kernel_plan builds it), or None where it cannot be compared: a floating path, a
    library's order (fold None), a dense split GEMM (the MMA's own order inside a split)."""
    return _plan(name, n, k, m, interpret)


@functools.lru_cache(maxsize=4096)
def _plan(name, n, k, m, interpret):
    p = table.get(name)
    if p.arithmetic != "integer" or p.weight != "pq2":
        return None
    f = p.fold(n, k, m, interpret=interpret)
    if not f or "groups_per_split" not in f:
        return None
    g, per, lanes = k // 128, f["groups_per_split"], f.get("lanes", 1)
    plan = tuple(tuple(tuple(range(s0 + c, min(s0 + per, g), lanes)) for c in range(lanes))
                 for s0 in range(0, g, per))
    if len(plan) != f.get("splits", len(plan)):
        return None      # a fold that contradicts itself proves nothing
    return plan


def same_fold(a: str, b: str, n: int, k: int, m: int, interpret: bool) -> bool:
    """The two paths' declared fold orders for (n, k, m) are the same sequence of FP32 adds
    (same splits, lanes and groups in the same places; empty lanes count)."""
    pa = fold_plan(a, n, k, m, interpret)
    return pa is not None and pa == fold_plan(b, n, k, m, interpret)


_records: dict = {}


def clear_cache() -> None:
    """Forget the folds, digests and records read (a kernel's fold or file changed: tests,
    and `check --derive-exact` before it derives)."""
    _plan.cache_clear()
    _digest.cache_clear()
    _records.clear()


def record(key: str) -> dict:
    """The verified record of backend `key` ({} without one); re-read when the file changes."""
    f = verified_file(key)
    try:
        st = f.stat()
    except FileNotFoundError:
        return {}
    stamp = f"{f} {st.st_mtime_ns} {st.st_size}"   # a string: an mtime in ns looks like an address
    if _records.get(key, (None,))[0] != stamp:
        _records[key] = (stamp, json.loads(f.read_text()))
    return _records[key][1]


def held(name: str, entry: dict) -> bool:
    """An entry is trusted only if it is of this format, its rule is 'proven', it is for the
    path's table counterpart, and it was derived from the kernel sources as they are now."""
    p = table.by_name().get(name)       # the attached host's table, as every other lookup
    return (p is not None and isinstance(entry, dict) and entry.get("format") == FORMAT
            and entry.get("rule") == "proven" and entry.get("counterpart") == p.counterpart
            and entry.get("sources") == sources_digest(name, p.counterpart))


def verified_exact(key: str) -> set[str]:
    """Tuned paths whose bit identity to their counterpart `check --derive-exact` proved on this
    backend key ('sm90', 'interpreter'; 'emulate' reads the interpreter's). No record: none."""
    return {name for name, r in record(key).get("paths", {}).items() if held(name, r)}


def members(kset: str, key: str, *, weight: str | None = None, shape: tuple | None = None) -> list[table.Entry]:
    """The set's paths in dispatch preference order (tuned before legacy; integer legacy
    paths before the floating one). shape (n, k, m): for `exact`, keep a tuned path only where
    its fold order equals its counterpart's for that call (dispatch passes it)."""
    check_name(kset)
    legacy = sorted(table.paths(kset="legacy", weight=weight), key=lambda p: p.arithmetic == "floating")
    if kset == "legacy":
        return legacy
    tuned = [p for p in table.paths(kset="tuned", weight=weight) if not p.deselected]
    if kset == "exact":
        ok = verified_exact(key)
        tuned = [p for p in tuned if p.name in ok
                 and (shape is None or same_fold(p.name, p.counterpart, *shape, interpret_folds(key)))]
    return tuned + legacy
