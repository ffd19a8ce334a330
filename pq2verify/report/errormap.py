"""The error map of a failing case: |y - ref| / bound over output rows x columns (the check
engine's per-element bound), with the kernel's tile boundaries drawn (BM rows, BN columns) and
its split-K named, so a mask, tile or split bug shows as its shape (a block, a stripe, an edge)
rather than as one worst number. Written as a PNG next to the Markdown / HTML report."""
import importlib
from dataclasses import dataclass

import numpy as np


@dataclass
class ErrorMap:
    case: str
    path: str
    ratio: np.ndarray         # float64 [M, C]: |y - ref| / bound; inf where y is not finite
    cols: np.ndarray          # the output column n of each of the C map columns (all N, or the sampled ones)
    row_tiles: list           # row indices where a tile of rows begins (after 0)
    col_tiles: list           # map column indices where a tile of output columns begins (after 0)
    split: str                # the kernel's split-K, in words ('' for none)
    config: dict


def tiles(path: str, n: int, k: int, m: int, interpret: bool) -> tuple[list, list, str, dict]:
    """(row tile starts, column tile starts, split-K in words, config) of the config the path's
    kernel picks for (n, k, m); a path without tiles (a library call) has none."""
    from .. import registry
    mod = importlib.import_module(registry.get(path).module)
    try:
        cfg = dict(mod.config(n, k, m, interpret=interpret))
    except Exception:          # a library path, a config the shape does not admit: no boundaries
        cfg = {}
    bm, bn = cfg.get("BM"), cfg.get("BN")
    rows = list(range(bm, m, bm)) if bm else []
    cols = list(range(bn, n, bn)) if bn else []
    per = cfg.get("groups_per_split") or cfg.get("k_per_split")
    unit = "groups of 128" if "groups_per_split" in cfg else "K"
    split = ""
    if per and (cfg.get("SPLIT") or 0) != 1:
        total = k // 128 if unit != "K" else k
        splits = cfg.get("SPLIT") or -(-total // per)
        if splits > 1:
            split = f"split-K: {splits} splits of {per} {unit} (each output sums all of them)"
    return rows, cols, split, cfg


def from_arrays(case: str, path: str, y: np.ndarray, ref: np.ndarray, bound: np.ndarray, cols, n: int,
                k: int, interpret: bool) -> ErrorMap:
    """y: the kernel's outputs at the compared columns `cols` [M, len(cols)], ref and bound the
    same shape (the engine's FP64 reference and per-element bound). The map has one column per
    compared output column, in order of n: every column when the engine compares all N, the
    sampled ones on large shapes (a tile boundary then falls between two sampled columns)."""
    y, ref, bound = (np.asarray(a, dtype=np.float64) for a in (y, ref, bound))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(np.isfinite(y), np.abs(y - ref) / bound, np.inf)
    cols = np.asarray(cols)
    order = np.argsort(cols, kind="stable")
    cols, r = cols[order], r[:, order]
    m = y.shape[0]
    rt, ct, split, cfg = tiles(path, n, k, m, interpret)
    bn = cfg.get("BN")
    ct = [int(i) for i in range(1, len(cols)) if cols[i] // bn != cols[i - 1] // bn] if bn else []
    return ErrorMap(case, path, r, cols, rt, ct, split, cfg)


def of_case(c, device, kernel=None) -> ErrorMap:
    """Run case `c` once (its path's kernel, or `kernel`) and map its error against the per-element
    bound, exactly as checks.evaluate computes it."""
    from .. import checks, registry, verdicts
    p = registry.get(c.path)
    inp = checks.Inputs(c, device)
    y, _ = checks.call(p, inp, kernel=kernel, guards=[])
    ref = inp.reference("dense" if inp.dense else p.reference)
    e = verdicts.element(p, inp.x.shape[1], y[:, inp.rows.to(y.device)].cpu(), ref, checks._abs_sum(p, inp),
                         checks.DTYPES[c.dtype])
    return from_arrays(c.id, c.path, e.y, e.ref, e.bound, inp.rows.numpy(), y.shape[1], c.k,
                       interpret=str(device) == "cpu")


def colours(ratio: np.ndarray) -> np.ndarray:
    """RGBA float [M, C, 4]: within the bound a blue whose depth is the share of it used (white
    at 0), outside it red (deeper the further out, saturating at 10x), a non-finite output or
    a NaN reference (outside, as the engine counts it) magenta."""
    out = np.ones(ratio.shape + (4,))
    inside = ratio <= 1.0
    outside = (ratio > 1.0) & np.isfinite(ratio)
    nonfinite = ~np.isfinite(ratio)
    t = np.clip(np.where(inside, ratio, 0.0), 0, 1)
    out[inside, 0] = 1 - 0.75 * t[inside]
    out[inside, 1] = 1 - 0.55 * t[inside]
    out[inside, 2] = 1.0
    s = np.clip(np.log10(np.where(outside, ratio, 1.0)), 0, 1)     # 1x .. 10x
    out[outside, 0] = 1.0 - 0.3 * s[outside]
    out[outside, 1] = 0.25 * (1 - s[outside])
    out[outside, 2] = 0.25 * (1 - s[outside])
    out[nonfinite, :3] = (0.85, 0.0, 0.85)
    return out


def figure(em: ErrorMap):
    """The matplotlib Figure of the map: cell (i, j) is output y[i, cols[j]]; dashed lines at
    tile boundaries. The caller saves or draws it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    m, n = em.ratio.shape
    fig = Figure(figsize=(min(12, 3 + n / 40), min(6, 1.6 + m / 6)), dpi=100)
    FigureCanvasAgg(fig)          # no pyplot: nothing global, no display needed
    ax = fig.add_subplot()
    ax.imshow(colours(em.ratio), interpolation="nearest", aspect="auto", extent=(0, n, m, 0))
    for c in em.col_tiles:
        ax.axvline(c, color="black", lw=0.8, ls="--")
    for r in em.row_tiles:
        ax.axhline(r, color="black", lw=0.8, ls="--")
    finite = em.ratio[np.isfinite(em.ratio)]
    out = int(np.sum(~(em.ratio <= 1.0)))
    tiles_ = ", ".join(f"{f}={em.config[f]}" for f in ("BM", "BN") if f in em.config) or "no tiles"
    ax.set_title(f"{em.path}: |y - ref| / bound (red: outside, {out} outputs; worst "
                 f"{finite.max() if finite.size else 0:.3g}x)\ntiles {tiles_}"
                 + (f"; {em.split}" if em.split else ""), fontsize=8)
    if len(em.cols) and not np.array_equal(em.cols, np.arange(len(em.cols))):
        ticks = np.linspace(0, len(em.cols) - 1, min(8, len(em.cols))).astype(int)
        ax.set_xticks(ticks + 0.5, [str(int(em.cols[t])) for t in ticks])
        ax.set_xlabel(f"output column n ({len(em.cols)} sampled columns, in order)")
    else:
        ax.set_xlabel("output column n")
    if m <= 24:
        ax.set_yticks(np.arange(m) + 0.5, [str(i) for i in range(m)])
    ax.set_ylabel("row m")
    fig.tight_layout()
    return fig


def write(em: ErrorMap, png) -> str:
    """Save the map as PNG at `png`; returns its path."""
    figure(em).savefig(png, format="png")
    return str(png)


def slug(case_id: str) -> str:
    """A file-name-safe form of a case id."""
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in case_id)[:120]
