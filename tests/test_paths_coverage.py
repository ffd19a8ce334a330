"""The CPU suite's generated numerics tests (tests/test_paths.py) run every check of the
engine per path: each check checks.evaluate can be asked for ("X" in checks, read from its
source) is generated for every path where it judges something, none left to `pq2verify check`."""
import inspect
import re

import test_paths

from pq2verify import checks, registry


def _judges(check: str, c) -> bool:
    """Whether evaluate judges anything for `check` on case c (its own conditions)."""
    p = registry.get(c.path)
    return {"determinism": p.deterministic, "batch": p.batch_invariant and c.m >= 2,
            "fold": p.arithmetic == "integer" and p.weight == "pq2" and test_paths.DEVICE == "cpu"}.get(check, True)


def test_every_engine_check_runs_per_path():
    engine = set(re.findall(r'"(\w+)" in checks', inspect.getsource(checks.evaluate)))
    assert engine >= {"rms", "exact", "determinism", "batch", "nan", "fold"}, engine
    have = {(c.path, check) for c, check in (p.values for p in test_paths._params())}
    missing = sorted((p.name, check) for p in registry.PATHS for check in engine
                     if any(c.path == p.name and _judges(check, c) for c in test_paths.CASES)
                     and (p.name, check) not in have)
    assert not missing, f"engine checks with no generated test: {missing}"
