"""Numerics checks generated from the registry: for each path x shape x M x dtype x layout,
relative RMS against the FP64 references, exact integer group dots, exactness claims against
the claimed counterpart, every output written, and determinism over reruns."""
import functools
import zlib
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from . import registry
from .inputs import ACTIVATION_KINDS, activations, dense_weight, ternary_weight

SHAPES = {
    "small": {"pq2": [("a", 200, 640), ("b", 64, 384)], "dense": [("ba", 96, 384)]},
    "bonsai27b": {
        "pq2": [("gate_up", 34816, 5120), ("down", 5120, 17408), ("in_proj", 16384, 5120),
                ("qkv", 14336, 5120), ("out", 5120, 6144), ("lm_head", 248320, 5120)],
        "dense": [("in_proj_ba", 96, 5120)],
    },
}
MS = {"small": (1, 2, 3, 16, 17, 33), "bonsai27b": (1, 2, 3, 4, 8, 16, 17, 128, 2048)}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
REF_ROWS = 256            # reference rows sampled on large shapes (all rows when N is smaller)


@dataclass(frozen=True)
class Case:
    path: str
    shape: str
    n: int
    k: int
    m: int
    dtype: str
    layout: str
    kind: str = "normal"
    strided: bool = False
    seed: int = 0

    @property
    def id(self) -> str:
        s = f"{self.path}:{self.shape}={self.n}x{self.k}:m{self.m}:{self.dtype}:{self.layout}:{self.kind}"
        return s + (":strided" if self.strided else "") + f":seed{self.seed}"

    def repro(self) -> str:
        return f"pq2verify check --case {self.id}"

    @classmethod
    def parse(cls, spec: str) -> "Case":
        """Inverse of `id`: path:shape=NxK:mM:dtype:layout:kind[:strided]:seedS."""
        try:
            parts = spec.split(":")
            path, shape = parts[0], parts[1]
            name, nk = shape.split("=")
            n, k = (int(v) for v in nk.split("x"))
            m = int(parts[2].removeprefix("m"))
            dtype, layout, kind = parts[3], parts[4], parts[5]
            strided = "strided" in parts[6:]
            seed = int(parts[-1].removeprefix("seed"))
        except (IndexError, ValueError):
            raise ValueError(f"--case {spec!r}: expected path:shape=NxK:mM:dtype:layout:kind[:strided]:seedS") from None
        registry.get(path)
        if dtype not in DTYPES:
            raise ValueError(f"--case: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        return cls(path, name, n, k, m, dtype, layout, kind, strided, seed)


def cases(shapes="small", paths=None, kset=None, ms=None, dtypes=None, layouts=None) -> list[Case]:
    """The case matrix. Activation kinds and strided rows rotate over the cases so every kind
    and the strided corner are reached without multiplying the matrix."""
    if shapes not in SHAPES:
        raise ValueError(f"--shapes: expected one of {', '.join(SHAPES)}, got {shapes!r}")
    sel = registry.PATHS if paths is None else [registry.get(p) for p in paths]
    if kset is not None:
        sel = [p for p in sel if kset == "exact" or p.kset == kset or (kset == "tuned" and p.kset == "legacy")]
    out = []
    for p in sel:
        for shape, n, k in SHAPES[shapes][p.weight]:
            for m in ms or MS[shapes]:
                if not p.serves(m):
                    continue
                for dt in dtypes or DTYPES:
                    if DTYPES[dt] not in p.dtypes:
                        continue
                    for lay in layouts or p.layouts:
                        if lay not in p.layouts:
                            continue
                        i = len(out)
                        c = Case(p.name, shape, n, k, m, dt, lay, ACTIVATION_KINDS[i % len(ACTIVATION_KINDS)],
                                 strided=(i % 3 == 1))
                        out.append(_seeded(c))
    return out


def _seeded(c: Case) -> Case:
    # Inputs depend on the shape, M, dtype, kind and strided flag, not on the path, so a path
    # and its counterpart see the same inputs; the layout changes bytes, never values.
    key = f"{c.n}x{c.k}:{c.m}:{c.dtype}:{c.kind}:{c.strided}"
    return Case(**{**asdict(c), "seed": zlib.crc32(key.encode()) % 100_000})


@dataclass
class Result:
    case: Case
    rel_rms_quantized: float | None = None
    tol_quantized: float | None = None
    rel_rms_dense: float | None = None
    tol_dense: float | None = None
    dots_exact: bool | None = None
    claim: str = ""
    claim_held: bool | None = None
    deterministic: bool | None = None
    written: bool | None = None
    failures: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def fail(self, what: str) -> None:
        self.failures.append(what)

    def message(self) -> str:
        return (f"{self.case.id}: " + "; ".join(self.failures) + f"\n  reproduce: {self.case.repro()}"
                + f"\n  seed: {self.case.seed}")

    def to_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "case"}
        d.update(case=self.case.id, repro=self.case.repro(), ok=self.ok, **asdict(self.case))
        return d


DOTS_MAX_BYTES = 2 << 30   # the group-dots buffer [M, N, G] int32 is skipped above this


def _weight(n: int, k: int, layout: str, device: str, dtype: str, dense: bool):
    return _weight_cached(n, k, layout, str(device), dtype if dense else "-", dense)


@functools.lru_cache(maxsize=3)
def _weight_cached(n: int, k: int, layout: str, device: str, dtype: str, dense: bool):
    # Seeded by the shape alone: every path, M and layout of a shape reads the same values,
    # so the FP64 references are shared and a GPU run generates each large weight once.
    seed = zlib.crc32(f"w{n}x{k}".encode()) % 100_000
    if dense:
        return dense_weight(n, k, seed, device, DTYPES[dtype])
    if layout == "raw":
        return _weight(n, k, "prepared", device, dtype, False).to_raw()
    return ternary_weight(n, k, seed, device, "prepared")


def _rows(n: int) -> torch.Tensor:
    if n <= REF_ROWS:
        return torch.arange(n)
    g = torch.Generator().manual_seed(n)
    return torch.cat([torch.tensor([0, n - 1]), torch.randperm(n - 2, generator=g)[: REF_ROWS - 2] + 1])


def _x(c: Case, device) -> torch.Tensor:
    return activations(c.m, c.k, c.seed, c.kind, DTYPES[c.dtype], device,
                       row_stride=2 * c.k if c.strided else None)


@functools.lru_cache(maxsize=4)
def _reference(c: Case, dense: bool, which: str, device: str):
    """FP64 reference on the CPU. `c` has path and layout blanked: references depend on values
    only, so every path and layout of the same inputs shares one. The weight comes from the
    device it was generated on (CPU and CUDA generators draw different numbers)."""
    from reference import projection
    x = _x(c, "cpu")
    rows = _rows(c.n)
    w = _weight(c.n, c.k, "prepared", device, c.dtype, dense)
    if dense:
        return projection.dense(x, w[rows.to(w.device)].cpu())
    w = w.to("cpu")
    fn = {"quantized": projection.quantized, "dots": projection.group_dots, "dense": projection.floating}[which]
    return fn(x, w, rows=rows.numpy())


class Inputs:
    """x and weight of one case on the device, plus its FP64 references (cached across cases
    that share them: same shape, M, dtype and input kind, whatever the path or layout)."""

    def __init__(self, c: Case, device):
        self.case, self.device = c, str(device)
        self.dense = registry.get(c.path).weight == "dense"
        self.x = _x(c, device)
        self.w = _weight(c.n, c.k, "prepared" if self.dense else c.layout, str(device), c.dtype, self.dense)
        self.rows = _rows(c.n)
        self._blank = replace(c, path="-", layout="-")

    def reference(self, which: str):
        """'quantized' or 'dense' FP64 reference, float64 [M, len(rows)]."""
        return _reference(self._blank, self.dense, "dense" if self.dense else which, self.device)

    def group_dots(self):
        return _reference(self._blank, self.dense, "dots", self.device)


def call(path: registry.Path, inp: Inputs, *, with_dots: bool = False):
    """Run one path on the case's inputs with outputs pre-filled with NaN."""
    x, w = inp.x, inp.w
    n = w.shape[0] if isinstance(w, torch.Tensor) else w.n
    out = torch.full((x.shape[0], n), float("nan"), dtype=x.dtype, device=x.device)
    dots = None
    if with_dots and path.has_dots and x.shape[0] * n * w.groups * 4 <= DOTS_MAX_BYTES:
        dots = torch.full((x.shape[0], n, w.groups), -2 ** 31, dtype=torch.int32, device=x.device)
    y = path.kernel()(x, w, out=out, dots=dots) if path.has_dots else path.kernel()(x, w, out=out)
    if y.data_ptr() != out.data_ptr():
        raise AssertionError(f"{path.name}.run ignored out=: it returned another tensor")
    return y, dots


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 1: torch.uint8}[t.element_size()])


def evaluate(c: Case, device="cpu", *, checks=("rms", "exact", "determinism"), reruns: int = 5,
             inp: Inputs | None = None) -> Result:
    from reference import metrics
    p = registry.get(c.path)
    inp = inp or Inputs(c, device)
    r = Result(c)
    y, dots = call(p, inp, with_dots="exact" in checks)
    finite_x = bool(torch.isfinite(inp.x.float()).all())
    r.written = not bool(torch.isnan(y).any()) if finite_x else None
    if r.written is False:
        bad = int(torch.isnan(y).any(1).sum())
        r.fail(f"output not written: NaN left in {bad} of {y.shape[0]} rows (outputs were pre-filled with NaN)")
    ys = y[:, inp.rows.to(y.device)].double().cpu().numpy()
    dt = DTYPES[c.dtype]
    if "rms" in checks:
        refs = ["dense"] + (["quantized"] if p.reference == "quantized" else [])
        for which in refs:
            err = metrics.relative_rms(ys, inp.reference(which))
            tol = p.tolerance(dt, which)
            setattr(r, f"rel_rms_{which}", err)
            setattr(r, f"tol_{which}", tol)
            if not err <= tol:
                r.fail(f"relative RMS vs {which} FP64 reference {err:.3g} > tolerance {tol:.3g}")
    if "exact" in checks:
        if dots is not None:
            got = dots[:, inp.rows.to(dots.device)].cpu().to(torch.int64).numpy()
            want = inp.group_dots()
            r.dots_exact = bool((got == want).all())
            if not r.dots_exact:
                m_, n_, g_ = (int(i) for i in np.argwhere(got != want)[0])
                r.fail(f"integer group dots differ from the exact reference (first at m={m_}, "
                       f"n={int(inp.rows[n_])}, group {g_}: {got[m_, n_, g_]} != {want[m_, n_, g_]})")
        other = p.bit_identical_to or p.dots_equal_to
        if other is not None and registry.get(other).serves(c.m):
            q = registry.get(other)
            y2, d2 = call(q, inp, with_dots=p.dots_equal_to is not None)
            if p.bit_identical_to:
                r.claim = f"bytes == {other}"
                r.claim_held = bool(torch.equal(_bits(y), _bits(y2)))
            else:
                r.claim = f"dots == {other}"
                r.claim_held = bool(torch.equal(dots, d2))
            if not r.claim_held:
                r.fail(f"exactness claim '{r.claim}' does not hold")
    if "determinism" in checks and p.deterministic:
        ref_bits = _bits(y)
        same = True
        for _ in range(reruns):
            y2, _ = call(p, inp)
            same &= bool(torch.equal(_bits(y2), ref_bits))
        r.deterministic = same
        if not same:
            r.fail(f"not deterministic: {reruns} reruns did not all give identical bytes "
                   "(the first run also wrote group dots)")
    return r
