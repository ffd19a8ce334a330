"""The suite's side of the config protocol: the shape grid the kernel files' `configs(interpret)`
sweep (the case model's shapes plus kernels.config.SMALL; pq2verify.registry installs it). The
protocol itself (force, the field rules, sweep) is kernels/config.py's, re-exported here."""
from . import registry  # noqa: F401  (binds the suite's table and grid)
from kernels.config import (MS, SMALL, STAGES, WARPS, _bad, flag, force, integer, multiple,  # noqa: F401
                            pow2, splits, sweep)


def grid(weight: str = "pq2") -> list[tuple[int, int]]:
    """(N, K) of every shape the case model knows for this weight kind, plus SMALL."""
    from . import cases
    shapes = {(n, k) for sets in cases.SHAPES.values() for _, n, k in sets[weight]}
    shapes |= {(n, k) for sets in cases.GOLDEN_SHAPES.values() for _, n, k, _ in sets[weight]}
    return sorted(shapes | set(SMALL))
