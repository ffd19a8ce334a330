"""Before any work: which path A and B serve for every item of the plan (dispatch.resolve on
the item's shapes, no data). An A/B run must compare two different things: a run in which no
item differs is refused (a usage error), and an item whose A and B resolve to the same path is
reported as "A == B, not timed" instead of a ratio (items.run_shape / run_step, which then prove
it again from the traced paths)."""
import torch

from kernels import dispatch
from .. import checks
from .envs import FakeWeight
from .gate import bench_case
from .plan import Config, Item, step_shapes


class SameSides(ValueError):
    """A and B resolve to the same path for every item: nothing would be compared."""


def _path(kset: str, shape, m: int, cfg: Config, device: str) -> str:
    case = bench_case("cublas" if shape.dense else "native", shape, m, cfg)
    dt = checks.DTYPES[cfg.dtype]
    x = torch.empty(1, shape.k, dtype=dt, device=device).expand(m, shape.k)
    w = torch.empty(0, dtype=dt, device=device) if shape.dense else FakeWeight(shape.n, shape.k, case.layout)
    return dispatch.resolve(m, w, x, kset).name


def sides(cfg: Config, item: Item, device: str) -> dict | None:
    """{'a': path, 'b': path, 'same': bool} of a shape item (a step: paths per shape name);
    None for the items that compare nothing (bandwidth, the A/A row) or that do not resolve
    (the item itself then reports why)."""
    try:
        if item.kind == "shape":
            a, b = (_path(k, item.shape, item.m, cfg, device) for k in (cfg.a, cfg.b))
            return {"a": a, "b": b, "same": a == b}
        if item.kind == "step":
            a, b = ({nm: _path(k, sh, item.m, cfg, device) for nm, sh in step_shapes().items()}
                    for k in (cfg.a, cfg.b))
            return {"a": a, "b": b, "same": a == b}
    except (ValueError, TypeError):
        return None
    return None


def preflight(cfg: Config, plan: list, device: str) -> dict:
    """{item key: sides()} for every comparing item; SameSides when none of them differs (a
    dense shape on one path both ways is still timed, once, as the cuBLAS reference the BF16
    step sums, but it compares nothing)."""
    out = {i.key: r for i in plan if (r := sides(cfg, i, device)) is not None}
    if not any(i.kind in ("shape", "step") for i in plan):
        raise ValueError("--m and --step-m leave no shape and no decode step to time: nothing would be compared")
    if out and all(r["same"] for r in out.values()):
        eg = ", ".join(f"{k} -> {r['a']}" for k, r in list(out.items())[:3] if isinstance(r["a"], str))
        raise SameSides(f"--a {cfg.a} and --b {cfg.b} resolve to the same path for every item of this run"
                        + (f" ({eg}, ...)" if eg else "") + "; an A/B must compare two different paths: "
                        "choose other kernel sets, or other --m / --shapes where they differ")
    return out
