"""The one rule for what a kernel set holds on a backend. dispatch picks from it at run time;
check, golden, bench and gsm8k select their paths with it, so they can never disagree.

- legacy: the legacy paths.
- tuned: the tuned paths that are not deselected (measured slower than their counterpart),
  then the legacy paths as the fallback for what no tuned path serves.
- exact: the tuned paths of `tuned` whose bit-identity to their counterpart
  `check --derive-exact` proved on this backend (pq2verify/verified/exact-<key>.json), then
  the legacy paths.
Per-path switches (PQ2_PATH_<NAME>) are applied by dispatch on top of this, per call.
"""
import json
from pathlib import Path as _P

from . import registry

VERIFIED_DIR = _P(__file__).parent / "verified"


def check_name(kset: str, source: str = "kernel set ") -> str:
    """kset if it is a kernel set's name; else ValueError naming where it came from
    (source: 'kernels=', 'PQ2_KERNELS=', '--kernels ')."""
    if kset not in registry.KERNEL_SETS:
        raise ValueError(f"{source}{kset!r}: unknown kernel set; expected one of {', '.join(registry.KERNEL_SETS)}")
    return kset


def verified_file(key: str) -> _P:
    return VERIFIED_DIR / f"exact-{'interpreter' if key == 'emulate' else key}.json"


def verified_exact(key: str) -> set[str]:
    """Tuned paths whose bit-identity `check --derive-exact` proved on this backend key
    ('sm90', 'interpreter'; 'emulate' reads the interpreter's). No record: none."""
    f = verified_file(key)
    if not f.exists():
        return set()
    data = json.loads(f.read_text())
    return {name for name, r in data["paths"].items() if r.get("held")}


def members(kset: str, key: str, *, weight: str | None = None) -> list[registry.Path]:
    """The set's paths in dispatch preference order (tuned before legacy; integer legacy
    paths before the floating one)."""
    check_name(kset)
    legacy = sorted(registry.paths(kset="legacy", weight=weight), key=lambda p: p.arithmetic == "floating")
    if kset == "legacy":
        return legacy
    tuned = [p for p in registry.paths(kset="tuned", weight=weight) if not p.deselected]
    if kset == "exact":
        ok = verified_exact(key)
        tuned = [p for p in tuned if p.name in ok]
    return tuned + legacy
