"""The config protocol's shared parts (docs/ADDING_A_PATH.md, "Configs"): the checks of a
config forced through `run(..., config=)` / `fold(..., config=)`, and the sweep a kernel file's
`configs(interpret)` runs its chooser over.

Field names are shared by every path, so a test can build a shape that exercises a config from
the config alone: BM, BN, BK (tiles along M, N, K), GB / GC (groups a step / a chunk loads),
groups_per_split or k_per_split with SPLIT (split-K), UNROLL, SWAP, PREFETCH, DEPTH (chunks in
flight), num_warps, num_stages."""
from . import table

# Small shapes: one group, a ragged N tile, odd group counts; N = 300, 600, 1200 reach
# int_gemv's interpreter tiles of 512-2048 rows. A host adds its own shapes (set_grid).
SMALL = ((8, 128), (16, 256), (24, 512), (100, 384), (96, 640), (40, 1024), (300, 128), (600, 128),
         (1200, 128), (3840, 640), (2304, 1536))
# Every M bucket a chooser sees: 1..16 one by one, then powers of two (choosers round M up).
MS = tuple(range(1, 17)) + tuple(2 ** i for i in range(5, 14))

_grid = None


def set_grid(fn) -> None:
    """fn(weight kind) -> [(N, K), ...]: the shapes configs() sweeps (None: SMALL alone). The
    verification suite sets its case model's shapes plus SMALL."""
    global _grid
    _grid = fn


def grid(weight: str = "pq2") -> list[tuple[int, int]]:
    return _grid(weight) if _grid is not None else sorted(set(SMALL))


def sweep(path: str, choose) -> list[dict]:
    """Every distinct config `choose(n, k, m)` returns over the grid of the path's weight kind
    and every M bucket the path serves, in first-seen order."""
    p = table.get(path)
    seen = {}
    for n, k in grid(p.weight):
        for m in MS:
            if p.serves(m):
                c = choose(n, k, m)
                seen.setdefault(tuple(sorted(c.items())), c)
    return list(seen.values())


def _bad(path, field, value, why):
    return ValueError(f"{path}: config field {field}={value!r}: {why}")


def integer(lo: int = 1, hi: int | None = None):
    def rule(path, field, v):
        if type(v) is not int or v < lo or (hi is not None and v > hi):
            raise _bad(path, field, v, f"expected an integer >= {lo}" + (f" and <= {hi}" if hi is not None else ""))
    return rule


def pow2(lo: int = 1, hi: int | None = None):
    def rule(path, field, v):
        integer(lo)(path, field, v)
        if v & (v - 1):
            raise _bad(path, field, v, "not a power of two (Triton tiles are)")
        if hi is not None and v > hi:
            raise _bad(path, field, v, f"expected at most {hi}")
    return rule


def flag(path, field, v):
    if type(v) is not bool:
        raise _bad(path, field, v, "expected True or False")


WARPS, STAGES = pow2(1, 32), integer(1)


def force(path: str, chosen: dict, config, rules: dict) -> dict:
    """`chosen` where config is None; else chosen with config's fields in place, each checked by
    its rule (rules: field -> rule(path, field, value)). Missing fields keep the chosen values.
    ValueError names the field: unknown, mistyped or out of its rule."""
    if config is None:
        return chosen
    if not isinstance(config, dict):
        raise ValueError(f"{path}: config must be a dict of fields ({', '.join(chosen) or 'none'}), "
                         f"got {type(config).__name__}")
    for f, v in config.items():
        if f not in chosen:
            raise ValueError(f"{path}: config field {f!r} unknown; the fields are {', '.join(chosen) or 'none'}")
        rules[f](path, f, v)
    return {**chosen, **config}


def splits(path: str, total: int, per: int, split: int, per_field: str = "groups_per_split",
           unit: str = "groups") -> None:
    """Split s covers [s * per, (s + 1) * per) of `total` units: together they must cover all of
    them, and each must hold at least one (an empty split would write a partial of zeros)."""
    if per * split < total:
        raise ValueError(f"{path}: config field SPLIT={split}: {split} x {per_field}={per} covers "
                         f"{per * split} of the {total} {unit}")
    if (split - 1) * per >= total:
        raise ValueError(f"{path}: config field SPLIT={split}: split {split - 1} would be empty "
                         f"({per_field}={per}, {total} {unit})")


def multiple(path: str, field: str, value: int, of_field: str, of: int) -> None:
    if value % of:
        raise _bad(path, field, value, f"not a multiple of {of_field}={of}")
