"""Numerics checks generated from the registry: for each path x shape x M x dtype x layout,
relative RMS and a per-element bound against the FP64 references, exact integer group dots,
exactness claims against the claimed counterpart, every output written, no write outside out
or dots (guard bands), determinism over reruns, batch invariance, and NaN propagation."""
import math
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from . import numerics, registry, verdicts
from .bits import bits
from .inputs import activations

# The case model lives in pq2verify.cases; these names are the check engine's view of it.
from .cases import DTYPES, MS, SHAPES, Case, seeded, weight_seed  # noqa: F401
from .cases import check_cases as cases  # noqa: F401
_seeded = seeded

# The typed name of each check (pq2verify.verdicts), recorded with every failure so a reader (the
# selftest's table, a test) learns which verdict fell without parsing its English message.
from .verdicts import (BATCH, CLAIM, DETERMINISM, DOTS, ERROR, FOLD, GUARD, NAN, PER_ELEMENT,  # noqa: E402,F401
                       RMS_DENSE, RMS_QUANTIZED, WRITTEN)
CHECK_NAMES = verdicts.ENGINE_CHECKS


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
    elem_ratio: float | None = None     # max over outputs of |y - Y| / per-element bound (<= 1 passes)
    fold_used: float | None = None      # max (|y - Y| - half a spacing) / F: the share of F used
    max_ulp: int | None = None          # max ulp distance to the FP64 reference rounded once
    guards_intact: bool | None = None   # no write landed in the bands around out and dots
    batch_invariant: bool | None = None
    nan_exact: bool | None = None       # a planted NaN made exactly the reference's NaN outputs
    fold_exact: bool | None = None      # bytes equal the emulation of the declared fold (cancelling input)
    records: list = field(default_factory=list)   # verdicts.Failure of each failed check, in order

    @property
    def failures(self) -> list[str]:
        return verdicts.messages(self.records)

    @property
    def failed(self) -> list[str]:
        """The CHECK_NAMES entry of each failure, same order as failures."""
        return verdicts.names(self.records)

    @property
    def ok(self) -> bool:
        return not self.records

    def fail(self, what: str, check: str = ERROR, where: str = "") -> None:
        if check not in CHECK_NAMES:
            raise ValueError(f"unknown check {check!r}; expected one of {', '.join(CHECK_NAMES)}")
        self.records.append(verdicts.failure(check, what, where or self.case.id))

    def message(self) -> str:
        return (f"{self.case.id}: " + "; ".join(self.failures) + f"\n  reproduce: {self.case.repro()}"
                + f"\n  seed: {self.case.seed}")

    def to_json(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("case", "records")}
        d.update(failures=self.failures, failed=self.failed)
        d.update(case=self.case.id, repro=self.case.repro(), ok=self.ok, **asdict(self.case))
        return d


DOTS_MAX_BYTES = 2 << 30   # the group-dots buffer [M, N, G] int32 is skipped above this


# The case's data (x, weight, FP64 references, absolute sums) has one builder, shared with golden
# capture and verify: pq2verify.casedata. Its names stay readable here.
from .casedata import (REF_ROWS, CaseData, Resolved, _reference, _rows, _weight,  # noqa: E402,F401
                       _weight_cached, _x, resolve)
Inputs = CaseData


# Guard bands around out and dots: a store past either end (a missing mask, a wrong row
# stride) is silent on a GPU; it lands in a band and changes its sentinel bits. A band is 16 of
# the buffer's rows (a tile of rows stored past M), at least 4 KiB, at most 16 MiB.
GUARD_ROWS, GUARD_MIN_BYTES, GUARD_MAX_BYTES = 16, 4096, 16 << 20
_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
_SENTINEL = {2: 0x7FA5, 4: 0x7FA5A5A5}   # a NaN with a payload (bf16 and fp16) / no int32 dot


def _guarded(shape, dtype, device, fill):
    """A contiguous tensor of `shape` filled with `fill`, inside a buffer whose bands before
    and after it hold the sentinel. -> (tensor, buffer, band length in elements)."""
    es = torch.empty((), dtype=dtype).element_size()
    numel, row = math.prod(shape), math.prod(shape[1:])
    band = min(max(GUARD_ROWS * row * es, GUARD_MIN_BYTES), GUARD_MAX_BYTES) // es
    band = -(-band // 64) * 64            # 64 elements: out keeps the buffer's own alignment
    buf = torch.full((2 * band + numel,), _SENTINEL[es], dtype=_INT[es], device=device).view(dtype)
    t = buf[band:band + numel].view(shape)
    t.fill_(fill)
    return t, buf, band


def _band_damage(what: str, buf, band: int) -> list[str]:
    bits = buf.view(_INT[buf.element_size()])
    sentinel = _SENTINEL[buf.element_size()]
    out = []
    for where, seg in (("before", bits[:band]), ("after", bits[bits.numel() - band:])):
        hit = torch.nonzero(seg != sentinel).flatten().cpu()
        if hit.numel():
            near = band - int(hit.max()) if where == "before" else int(hit.min()) + 1
            out.append(f"{what} written outside its extent: {hit.numel()} of {band} elements of the "
                       f"guard band {where} it changed (nearest {near} element(s) {where} it)")
    return out


def call(path: registry.Path, inp: Inputs, *, with_dots: bool = False, kernel=None, x=None,
         guards: list | None = None):
    """Run one path on the case's inputs (or on `x`) with out pre-filled with NaN and dots with
    -2^31, each inside poisoned guard bands. `kernel`, if given, replaces path.kernel() (same
    signature as run(x, w, *, out=None, dots=None)): fault injection runs the checks against a
    broken variant of the path. A changed band is appended to `guards`, or raised without it."""
    x = inp.x if x is None else x
    w = inp.w
    n = w.shape[0] if isinstance(w, torch.Tensor) else w.n
    out, obuf, oband = _guarded((x.shape[0], n), x.dtype, x.device, float("nan"))
    dots = None
    if with_dots and path.has_dots and x.shape[0] * n * w.groups * 4 <= DOTS_MAX_BYTES:
        dots, dbuf, dband = _guarded((x.shape[0], n, w.groups), torch.int32, x.device, -2 ** 31)
    run = kernel or path.kernel()
    y = run(x, w, out=out, dots=dots) if path.has_dots else run(x, w, out=out)
    if y.data_ptr() != out.data_ptr():
        raise AssertionError(f"{path.name}.run ignored out=: it returned another tensor")
    damage = _band_damage(f"{path.name}: out", obuf, oband)
    if dots is not None:
        damage += _band_damage(f"{path.name}: dots", dbuf, dband)
    if damage and guards is None:
        raise AssertionError("; ".join(damage))
    if guards is not None:
        guards.extend(d for d in damage if d not in guards)
    return y, dots




def _like(x: torch.Tensor) -> torch.Tensor:
    """An empty tensor with x's shape, strides and dtype (a strided x stays strided)."""
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)


def _abs_sum(p: registry.Path, inp) -> np.ndarray:
    """S of the per-element bound (casedata.CaseData.abs_sum), cached on `inp` per reference."""
    return CaseData.abs_sum(inp, p)


def _elementwise(r: Result, p: registry.Path, inp, y: torch.Tensor, dt) -> None:
    """Per element: |y - Y| <= F + spacing(|Y| + F) / 2 (verdicts.element; numerics.FOLD_REASON
    says why)."""
    ref = inp.reference("dense" if inp.dense else p.reference)
    yt = y[:, inp.rows.to(y.device)].cpu()
    e = verdicts.element(p, inp.x.shape[1], yt, ref, _abs_sum(p, inp), dt)
    r.elem_ratio, r.fold_used, r.max_ulp = e.ratio, e.fold_used, e.max_ulp
    if not e.ok:
        i, j = e.first
        n = int(inp.rows[j])
        r.fail(f"per-element bound: {e.outside} of {e.size} outputs outside it (worst "
               f"{r.elem_ratio:.3g}x); first y[{i}, {n}] = {float(e.y[i, j])!r} vs FP64 {float(e.ref[i, j])!r}, "
               f"off by {e.err[i, j]:.3g} > {e.bound[i, j]:.3g} (fold allowance {e.f[i, j]:.3g} + half a "
               f"{str(dt).replace('torch.', '')} spacing); max {r.max_ulp} ulp from the reference rounded once",
               PER_ELEMENT, f"{r.case.id} y[{i}, {n}]")


def _batch(r: Result, c: Case, p, inp, y, kernel, guards) -> None:
    """Row i of the call must keep its bits when every other row is replaced."""
    m, k = inp.x.shape
    i, seed2 = c.seed % m, c.seed + 1
    x2 = _like(inp.x)
    x2.copy_(activations(m, k, seed2, c.kind, inp.x.dtype, inp.x.device))
    x2[i] = inp.x[i]
    y2, _ = call(p, inp, x=x2, kernel=kernel, guards=guards)
    diff = torch.nonzero(bits(y2[i]) != bits(y[i])).flatten().cpu()
    r.batch_invariant = diff.numel() == 0
    if not r.batch_invariant:
        j = int(diff[0])
        r.fail(f"not batch invariant: row {i} changed in {diff.numel()} of {y.shape[1]} outputs when the "
               f"other {m - 1} rows were replaced by {c.kind} activations of seed {seed2}; first at "
               f"n={j}: {float(y2[i, j])!r} vs {float(y[i, j])!r}", BATCH)


def _nan(r: Result, c: Case, p, inp, y, kernel, guards) -> None:
    """One NaN planted in x (seeded): the outputs must be NaN exactly where the FP64 reference
    is (the dense one: Q8 of NaN is undefined; NaN times any weight is NaN), and every other
    row must keep its bits."""
    from reference import projection
    m, k = inp.x.shape
    rng = np.random.default_rng(c.seed)
    i, j = int(rng.integers(m)), int(rng.integers(k))
    xn = _like(inp.x)
    xn.copy_(inp.x)
    xn[i, j] = float("nan")
    y2, _ = call(p, inp, x=xn, kernel=kernel, guards=guards)
    rows = inp.rows
    xi = xn[i:i + 1].cpu()
    ref = (projection.dense(xi, inp.w[rows.to(inp.w.device)].cpu()) if inp.dense
           else projection.floating(xi, inp.w.data, layout=inp.w.layout, n=inp.w.n, k=inp.w.k,
                                    rows=rows.numpy()))[0]
    got = torch.isnan(y2[i, rows.to(y2.device)]).cpu().numpy()
    wrong = np.flatnonzero(got != np.isnan(ref))
    others = [v for v in range(m) if v != i]
    moved = torch.nonzero((bits(y2[others]) != bits(y[others])).any(1)).flatten().cpu()
    r.nan_exact = wrong.size == 0 and moved.numel() == 0
    where = f"a NaN at x[{i}, {j}] (group {j // 128}, from seed {c.seed})"
    if wrong.size:
        n = int(rows[wrong[0]])
        r.fail(f"NaN propagation: {where}: {wrong.size} of {rows.numel()} outputs of row {i} disagree with "
               f"the FP64 reference on NaN; first n={n}: {float(y2[i, n])!r}, reference {float(ref[wrong[0]])!r}", NAN)
    if moved.numel():
        r.fail(f"NaN propagation: {where} changed {moved.numel()} other row(s), first row "
               f"{others[int(moved[0])]}", NAN)


# The declared-fold check's input (pq2verify.adversarial, its 'cancel' rows only): K = 1024 with
# the special groups in 0-2 and 6-7, where the paths' splits and lanes begin and end, so each
# FP32 order of the integer paths gives other bytes than int_gemv's sequential one somewhere.
FOLD_K, FOLD_SPAN, FOLD_N = 1024, 5, 120


def _declared_fold(r: Result, c: Case, p: registry.Path, device, kernel) -> None:
    """The output bytes equal the emulation of the FP32 order the path declares (registry.Path.fold,
    kernels.emulation) on inputs whose group terms cancel, where another order gives other
    bytes: a path that computes another path's order (its counterpart's, say) fails. The
    interpreter only: a GPU compiler may contract the fold into an FMA, the emulation never does."""
    from kernels import emulation
    from . import adversarial
    w = adversarial.weight(FOLD_K, device, span=FOLD_SPAN, n=FOLD_N)
    w = w.to_raw() if c.layout == "raw" else w
    x = adversarial.activations(c.m, FOLD_K, DTYPES[c.dtype], device)
    out = torch.full((c.m, w.n), float("nan"), dtype=x.dtype, device=x.device)
    y = (kernel or p.kernel())(x, w, out=out).cpu()
    want = emulation.emulate(p.name, x.cpu(), w.to("cpu"), interpret=True)
    diff = torch.nonzero(bits(y) != bits(want))
    r.fold_exact = diff.numel() == 0
    if not r.fold_exact:
        i, n = (int(v) for v in diff[0])
        fold = p.fold(w.n, FOLD_K, c.m, interpret=True)
        r.fail(f"declared fold: {diff.shape[0]} of {y.numel()} outputs differ from the emulation of its "
               f"declared FP32 order {fold} on inputs whose group terms cancel; first y[{i}, {n}] = "
               f"{float(y[i, n])!r} vs {float(want[i, n])!r} ({adversarial.describe(FOLD_K, n, FOLD_SPAN)})", FOLD)


def evaluate(c: "Case | Resolved", device="cpu", *, checks=("rms", "exact", "determinism", "batch", "nan"),
             reruns: int = 5, inp: Inputs | None = None, kernel=None) -> Result:
    """Run the checks on one case. `kernel` replaces the path's run for every call of this
    path (first call, reruns, batch and NaN calls); a claimed counterpart runs its own kernel.
    "rms" holds both numeric verdicts: relative RMS and the per-element bound. Every call's
    out and dots sit in guard bands, checked whatever `checks` says. "fold" (not a default: it
    costs a K = 1024 call) checks an integer path's bytes against the emulation of its declared
    fold order, on the interpreter only (fold_exact stays None elsewhere)."""
    rc = getattr(inp, "rc", None)       # the case as its inputs resolved it: no second lookup
    if rc is None or rc.case != (c.case if isinstance(c, Resolved) else c):
        rc = resolve(c)
    c, p = rc.case, rc.path
    inp = inp or Inputs(rc, device)
    r = Result(c)
    guards = []
    y, dots = call(p, inp, with_dots="exact" in checks, kernel=kernel, guards=guards)
    finite_x = bool(torch.isfinite(inp.x.float()).all())
    r.written = not bool(torch.isnan(y).any()) if finite_x else None
    if r.written is False:
        bad = int(torch.isnan(y).any(1).sum())
        r.fail(f"output not written: NaN left in {bad} of {y.shape[0]} rows (outputs were pre-filled with NaN)",
               WRITTEN)
    ys = y[:, inp.rows.to(y.device)].double().cpu().numpy()
    dt = DTYPES[c.dtype]
    if "rms" in checks:
        for v in verdicts.rms(p, ys, inp.reference, dt):
            setattr(r, f"rel_rms_{v.which}", v.err)
            setattr(r, f"tol_{v.which}", v.tol)
            if not v.ok:
                r.fail(f"relative RMS vs {v.which} FP64 reference {v.err:.3g} > tolerance {v.tol:.3g}", v.check)
        if finite_x:
            _elementwise(r, p, inp, y, dt)
    if "exact" in checks:
        if dots is not None:
            got = dots[:, inp.rows.to(dots.device)].cpu().to(torch.int64).numpy()
            want = inp.group_dots()
            first = verdicts.dots(got, want)
            r.dots_exact = first is None
            if not r.dots_exact:
                m_, n_, g_ = first
                n = int(inp.rows[n_])
                r.fail(f"integer group dots differ from the exact reference (first at m={m_}, "
                       f"n={n}, group {g_}: {got[m_, n_, g_]} != {want[m_, n_, g_]})", DOTS,
                       f"{c.id} dots[{m_}, {n}, {g_}]")
        q = rc.counterpart
        if q is not None and q.serves(c.m):
            other = q.name
            y2, d2 = call(q, inp, with_dots=p.dots_equal_to is not None, guards=guards)
            if p.bit_identical_to:
                r.claim = f"bytes == {other}"
                r.claim_held = bool(torch.equal(bits(y), bits(y2)))
            else:
                r.claim = f"dots == {other}"
                r.claim_held = bool(torch.equal(dots, d2))
            if not r.claim_held:
                r.fail(f"exactness claim '{r.claim}' does not hold", CLAIM)
    if "determinism" in checks and p.deterministic:
        ref_bits = bits(y)
        same = True
        for _ in range(reruns):
            y2, _ = call(p, inp, kernel=kernel, guards=guards)
            same &= bool(torch.equal(bits(y2), ref_bits))
        r.deterministic = same
        if not same:
            r.fail(f"not deterministic: {reruns} reruns did not all give identical bytes "
                   "(the first run also wrote group dots)", DETERMINISM)
    if "batch" in checks and p.batch_invariant and c.m >= 2:
        _batch(r, c, p, inp, y, kernel, guards)
    if "nan" in checks and finite_x:
        _nan(r, c, p, inp, y, kernel, guards)
    if "fold" in checks and p.arithmetic == "integer" and p.weight == "pq2" and torch.device(device).type == "cpu":
        _declared_fold(r, c, p, device, kernel)
    r.guards_intact = not guards
    for g in guards:
        r.fail(g, GUARD)
    return r
