"""Every bound the suite applies, tested at its edge: an error planted at about 0.9x the bound
must pass and one at about 1.1x must fail, per arithmetic and dtype. The expected bound is
derived here, from SPEC §3/§4/§7 and the formulas documented beside numerics.UNIT_ROUNDOFF,
FOLD_UNIT and q8_allowance, never read from the code under test. Each "loosened" test patches
one bound of the judge 2x or 4x looser and shows that the 1.1x plant then passes, so the edge
tests above it would catch that slip.

Plants go into real kernel outputs through evaluate's `kernel=` wrapper: the path's own run,
then its output replaced by the planted values (computed from that same output and the FP64
references here)."""
import functools
import math
import statistics
from fractions import Fraction

import numpy as np
import pytest
import torch

from pq2verify import cases, checks, golden, numerics, registry, replay
from pq2verify.bits import bits
from pq2verify.gsm8k import floor
from reference import metrics, pq2, projection, q8

HERE = "pytest -p no:randomly tests/test_bound_edges.py"

# --- the bounds, derived here -------------------------------------------------------------
DT = {"bf16": torch.bfloat16, "fp16": torch.float16}
U = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}   # unit roundoff 2^-p: p = 8 (bf16), 11 (fp16) bits
FP32_FOLD = 1e-5                              # SPEC §7: an FP32 fold adds ~1e-6 relative; 1e-5 kept
Q8_BUDGET = 0.03                              # SPEC §7: the gate earlier work applied to Q8
FOLD_U = {"integer": 2.0 ** -24, "floating": 2.0 ** -23}   # FP32 u; tensor cores may truncate
PREC = {"bf16": (8, -126), "fp16": (11, -14)}              # (significant bits, emin)
PATHS = {"integer": "int_gemv", "floating": "native"}
LO, HI = (0.85, 0.95), (1.05, 1.15)           # the windows a plant at ~0.9x / ~1.1x must land in


def spacing(v, dt):
    """Distance between adjacent `dt` values at |v| (the subnormal spacing below the normal
    range): 2^(e - p + 1) with |v| in [2^e, 2^(e+1))."""
    p, emin = PREC[dt]
    _, e = np.frexp(np.abs(np.asarray(v, dtype=np.float64)))
    return np.ldexp(1.0, np.maximum(e - 1, emin) - (p - 1))


def rel(y, r) -> float:
    y, r = np.asarray(y, dtype=np.float64), np.asarray(r, dtype=np.float64)
    return float(np.linalg.norm(y - r) / np.linalg.norm(r))


def sub_floor(dt, ref) -> float:
    """Below the normal range an output rounds within half the subnormal spacing h, absolute:
    ||y - Y|| <= u ||Y|| + h sqrt(n), i.e. h sqrt(n) / ||Y|| more than u relative."""
    if ref is None:
        return 0.0
    ref = np.asarray(ref, dtype=np.float64)
    p, emin = PREC[dt]
    h = 2.0 ** (emin - (p - 1)) / 2            # the subnormal spacing 2^(emin - p + 1), halved
    return h * np.sqrt(ref.size) / float(np.linalg.norm(ref))


def tol_quantized(dt, Q=None) -> float:
    return U[dt] + FP32_FOLD + sub_floor(dt, Q)


def tol_dense(arith, dt, Q=None, D=None) -> float:
    """Floating: the output rounding plus the fold. Integer: the Q8 budget, or where the exact Q8
    arithmetic's own error is larger, what an output within tol_quantized of Q meets by the
    triangle inequality: relRMS(Q, D) + tol_q |Q| / |D|."""
    if arith == "floating":
        return U[dt] + FP32_FOLD + sub_floor(dt, D)
    return max(Q8_BUDGET, rel(Q, D) + tol_quantized(dt, Q) * np.linalg.norm(Q) / np.linalg.norm(D))


def element_bound(arith, k, S, Y, dt):
    """(bound, F, half): |y - Y| <= F + spacing(|Y| + F) / 2, F = u (T + 2) S + (T + 2) 2^-126,
    T = the number of terms an FP32 fold adds (K/128 group terms, or K products)."""
    t = k // 128 if arith == "integer" else k
    f = FOLD_U[arith] * (t + 2) * S + (t + 2) * 2.0 ** -126
    half = spacing(np.abs(Y) + f, dt) / 2
    return f + half, f, half


def abs_sum(p, x, w):
    """S: the path's FP64 sum over absolute terms. Integer: sum_g |dot_g| xs_g |ws_g| from the
    Q8 codes and the weight codes; floating: |x| @ |W|^T."""
    if p.weight == "dense":
        return np.abs(x.double().numpy()) @ np.abs(w.double().numpy()).T
    if p.arithmetic == "floating":
        return np.abs(x.double().numpy()) @ np.abs(pq2.decode(w.data, layout=w.layout, n=w.n, k=w.k)).T
    qz = q8.quantize_q8(x)
    codes, ws = pq2.read(w.data, layout=w.layout, n=w.n, k=w.k)
    m, k = qz.q.shape
    g = k // 128
    qg = qz.q.astype(np.int64).reshape(m, g, 128)
    cg = (codes.astype(np.int64) - 1).reshape(-1, g, 128)
    dots = np.einsum("mgk,ngk->mng", qg, cg)
    return np.einsum("mng,mg,ng->mn", np.abs(dots).astype(np.float64), qz.scales.astype(np.float64),
                     np.abs(ws.astype(np.float64)))


# --- one small case per (arithmetic, dtype, input kind), its real output and references ---
OUTLIER = "channel20"     # normal activations with channel 5 of every group at 20, its weights 0


class OutlierInputs(checks.Inputs):
    """The case's inputs with channel 5 of every group set to 20 and its weight codes to 0: Q8
    steps of 20/127 then lose the other channels' low bits (relRMS(Q, D) ~ 0.045, past
    Q8_BUDGET) while the outlier adds nothing to the product, so q8_allowance sets the bound."""

    def __init__(self, c, device):
        super().__init__(c, device)
        from kernels.format import PQ2Weight
        codes, scales = pq2.read(self.w.data, layout=self.w.layout, n=self.w.n, k=self.w.k)
        codes[:, 5::128] = 1
        self.w = PQ2Weight.from_raw(torch.from_numpy(pq2.encode(codes, scales))).to_prepared().to(device)
        x = self.x.clone()
        x[:, 5::128] = 20
        self.x = x
        xc, wc = x.cpu(), self.w.to("cpu")
        wb = dict(weight=wc.data, layout=wc.layout, n=wc.n, k=wc.k)
        self._refs = {"quantized": projection.quantized(xc, **wb), "dense": projection.floating(xc, **wb),
                      "dots": projection.group_dots(xc, **wb)}

    def reference(self, which):
        return self._refs[which]

    def group_dots(self):
        return self._refs["dots"]


@functools.lru_cache(maxsize=None)
def data(arith: str, dt: str, kind: str = "normal", *, device: str):
    """The case's inputs drawn on the CPU (a CUDA generator draws other numbers: the cases
    stay the same on every device), moved to `device` for the kernel; FP64 references on the
    CPU. y0: the path's own output there."""
    p = registry.get(PATHS[arith])
    c = cases.seeded(cases.Case(p.name, "b", 64, 384, 2, dt, "prepared", "normal" if kind == OUTLIER else kind))
    inp = OutlierInputs(c, "cpu") if kind == OUTLIER else checks.Inputs(c, "cpu")
    x, w = inp.x, inp.w
    inp.x, inp.w = x.to(device), w.to(device)     # inp.device stays "cpu": its references are these values'
    y0, _ = checks.call(p, inp)
    D = projection.floating(x, w.data, layout=w.layout, n=w.n, k=w.k)
    Q = projection.quantized(x, w.data, layout=w.layout, n=w.n, k=w.k) if arith == "integer" else None
    S = abs_sum(p, x, w)
    return dict(p=p, c=c, inp=inp, y0=y0.cpu(), D=D, Q=Q, Y=Q if arith == "integer" else D, S=S, arith=arith,
                device=device)


class Plant:
    """The path's own run, then its output replaced by `planted` (same shape and dtype)."""

    def __init__(self, p, y0, planted):
        self.run, self.y0, self.planted = p.kernel(), y0, planted

    def __call__(self, x, w, *, out=None, dots=None):
        y = self.run(x, w, out=out, dots=dots) if dots is not None else self.run(x, w, out=out)
        assert torch.equal(bits(y.cpu()), bits(self.y0)), "the real path changed under the test"
        y.copy_(self.planted.to(y.device))
        return y


def judge(d, planted):
    return checks.evaluate(d["c"], d["device"], checks=("rms",), inp=d["inp"],
                           kernel=Plant(d["p"], d["y0"], planted))


def settle(y: torch.Tensor, R, target: float) -> torch.Tensor:
    """y with outputs moved one representable step at a time, each move the one that brings
    relRMS(y, R) closest to `target`, while a move does. The bisection alone lands just past
    whichever output's step crosses the target: on 128 outputs one step is a few % of the
    error, and where it falls depends on the path's own bits (a GPU's are not the interpreter's)."""
    y = y.clone()
    goal = (target * np.linalg.norm(R)) ** 2
    for _ in range(4 * y.numel()):
        e2 = (y.double().numpy() - R) ** 2
        ss = float(e2.sum())
        cand = neighbours(y, [-1, 1])
        with np.errstate(invalid="ignore"):
            gap = np.where(np.isfinite(cand), np.abs(ss - e2[None] + (cand - R[None]) ** 2 - goal), np.inf)
        k, i, j = np.unravel_index(int(np.argmin(gap)), gap.shape)
        if not gap[k, i, j] < abs(ss - goal):
            break
        y[i, j] = float(cand[k, i, j])
    return y


def rms_plant(d, R, target: float, seed: int):
    """y0 + t * s * |R| (s a seeded sign per element), rounded to the output dtype, with t set
    by bisection so that relRMS(y, R) is `target`; where y0 is already farther from R than
    that (an integer path against D), y0 + t (R - y0) instead; then settled (settle).
    -> (y, relRMS measured here)."""
    y0 = d["y0"].double().numpy()
    dt = d["y0"].dtype
    inward = rel(y0, R) > target
    s = (R - y0) if inward else np.random.default_rng(seed).choice([-1.0, 1.0], size=R.shape) * np.abs(R)

    def err(t):
        return rel(torch.from_numpy(y0 + t * s).to(dt).double(), R) * (-1 if inward else 1)

    lo, hi = 0.0, 1.0 if inward else 1e-4
    while not inward and err(hi) < target:
        hi *= 2
    goal = -target if inward else target
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if err(mid) < goal else (lo, mid)
    y = settle(torch.from_numpy(y0 + hi * s).to(dt), R, target)
    return y, rel(y.double(), R)


ARITH_DT = [(a, t) for a in PATHS for t in DT]


# --- relative RMS: quantized and dense ----------------------------------------------------
# a floating path has no quantized reference: it is judged against the dense one only
@pytest.mark.parametrize("arith, dt, which", [(a, t, w) for a, t in ARITH_DT for w in ("quantized", "dense")
                                              if (a, w) != ("floating", "quantized")])
def test_relative_rms_at_its_edge(arith, dt, which, device):
    d = data(arith, dt, device=device)
    R = d["Q"] if which == "quantized" else d["D"]
    tol = tol_quantized(dt, d["Q"]) if which == "quantized" else tol_dense(arith, dt, d["Q"], d["D"])
    name = checks.RMS_QUANTIZED if which == "quantized" else checks.RMS_DENSE
    for (a, b), seed in ((LO, 1), (HI, 2)):
        y, got = rms_plant(d, R, (a + b) / 2 * tol, seed)
        assert a <= got / tol <= b, f"plant landed at {got / tol:.3f}x"
        r = judge(d, y)
        where = f"{d['c'].id}, plant {got / tol:.3f}x of {tol:.4g}; reproduce: {HERE} -k '{arith} and {dt} and {which}'"
        assert getattr(r, f"tol_{which}") == pytest.approx(tol, rel=1e-12), f"the judge's bound differs: {where}"
        assert (name in r.failed) == (a > 1), f"{r.failed} {r.failures}: {where}"


def q8_kinds(dt, device):
    """An input kind where the Q8 budget binds the dense bound, and one where the allowance does."""
    out = {}
    for kind in ("normal", "outliers", OUTLIER):
        d = data("integer", dt, kind, device=device)
        allow = rel(d["Q"], d["D"]) + tol_quantized(dt, d["Q"]) * np.linalg.norm(d["Q"]) / np.linalg.norm(d["D"])
        out.setdefault("budget" if allow < Q8_BUDGET else "allowance", kind)
    return out


@pytest.mark.parametrize("dt", DT)
def test_q8_allowance_and_budget_both_bind_somewhere(dt, device):
    """The dense bound of an integer path has two branches (Q8_BUDGET, q8_allowance); the edge
    tests need a case on each."""
    assert set(q8_kinds(dt, device)) == {"budget", "allowance"}, q8_kinds(dt, device)


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("branch", ["budget", "allowance"])
def test_dense_bound_of_an_integer_path_at_its_edge(dt, branch, device):
    kind = q8_kinds(dt, device).get(branch)
    assert kind, f"no small input kind where the {branch} binds"
    d = data("integer", dt, kind, device=device)
    tol = tol_dense("integer", dt, d["Q"], d["D"])
    for (a, b), seed in ((LO, 3), (HI, 4)):
        y, got = rms_plant(d, d["D"], (a + b) / 2 * tol, seed)
        assert a <= got / tol <= b
        r = judge(d, y)
        assert r.tol_dense == pytest.approx(tol, rel=1e-12), f"{d['c'].id}: judge {r.tol_dense} vs {tol}"
        assert (checks.RMS_DENSE in r.failed) == (a > 1), (
            f"{d['c'].id} ({branch}) plant {got / tol:.3f}x: {r.failures}; reproduce: {HERE} -k '{dt} and {branch}'")


# --- the per-element bound: the fold allowance F and the half spacing ----------------------
def neighbours(y0: torch.Tensor, ks=range(-6, 7)):
    """[len(ks), M, N] float64: the values ks representable steps from each y0 (same sign only,
    finite), NaN where the step would cross zero or leave the finite range."""
    ints = bits(y0).to(torch.int32)
    out = []
    for k in ks:
        v = (ints + k).to(torch.int16).view(y0.dtype)
        ok = (torch.sign(v.float()) == torch.sign(y0.float())) & torch.isfinite(v) & (y0 != 0)
        out.append(torch.where(ok, v.double(), torch.full_like(v.double(), float("nan"))).numpy())
    return np.stack(out)


def element_plant(d, window, part):
    """y0 with one element moved to a representable value whose distance from Y is in
    `window` x its bound (derived here), on an element where F (part 'fold') or the half
    spacing (part 'half') makes up most of the bound; None if the case has no such element."""
    dt = str(d["y0"].dtype).replace("torch.", "").replace("bfloat16", "bf16").replace("float16", "fp16")
    Y = d["Y"]
    bound, f, half = element_bound(d["arith"], d["c"].k, d["S"], Y, dt)
    y0 = d["y0"].double().numpy()
    assert (np.abs(y0 - Y) / bound).max() <= 1.0, "the real path is outside the bound derived here"
    share = f / bound
    mask = share > 0.6 if part == "fold" else share < 0.1
    cand = neighbours(d["y0"])
    with np.errstate(invalid="ignore"):
        ratio = np.abs(cand - Y) / bound
        ok = (ratio >= window[0]) & (ratio <= window[1]) & mask[None]
    if not ok.any():
        return None
    mid = (window[0] + window[1]) / 2
    kk, i, j = np.unravel_index(int(np.argmin(np.where(ok, np.abs(ratio - mid), np.inf))), ratio.shape)
    y = d["y0"].clone()
    y[i, j] = float(cand[kk, i, j])
    return y, float(ratio[kk, i, j]), (int(i), int(j)), float(share[i, j])


# An integer path's F (G + 2 = 5 FP32 roundings) is far below a spacing on these outputs, a
# floating path's (K + 2 = 386) above it on almost all: the other parts are planted in
# test_element_bound_at_its_edge_constructed.
@pytest.mark.parametrize("arith, part", [("integer", "half"), ("floating", "fold")])
@pytest.mark.parametrize("dt", DT)
def test_element_bound_at_its_edge_in_a_real_output(arith, dt, part, device):
    """One element of the path's own output moved to ~0.9x / ~1.1x of its bound. Where the
    bound is mostly the half spacing that is the other rounding of a near-tie; where it is
    mostly F (floating paths: K = 384 terms) a few ulps away."""
    d = data(arith, dt, device=device)
    for window in (LO, HI):
        found = element_plant(d, window, part)
        assert found is not None, f"{d['c'].id}: no {part}-bound element near {window}"
        y, ratio, (i, j), share = found
        worst = float((np.abs(y.double().numpy() - d["Y"]) / element_bound(arith, 384, d["S"], d["Y"], dt)[0]).max())
        r = judge(d, y)
        where = (f"{d['c'].id}: y[{i}, {j}] at {ratio:.3f}x its bound (F {share:.0%} of it); "
                 f"reproduce: {HERE} -k 'real_output and {arith} and {dt} and {part}'")
        assert r.elem_ratio == pytest.approx(worst, rel=1e-9), f"the judge's worst ratio {r.elem_ratio}: {where}"
        assert (checks.PER_ELEMENT in r.failed) == (window is HI), f"{r.failures}: {where}"


class Synthetic:
    """An Inputs stand-in for checks._elementwise: FP64 reference Y and absolute sum S chosen
    by the test, on K = 384."""

    def __init__(self, p, Y, S, k=384):
        self.dense, self.rows, self.x = p.weight == "dense", torch.arange(Y.shape[1]), torch.empty(Y.shape[0], k)
        self._Y = Y
        self._abs_sums = {"dense" if self.dense else p.reference: S}

    def reference(self, which):
        return self._Y


def synthetic(arith, dt, part, ratio):
    """(p, inputs, y, ratio measured here): all outputs Y rounded once, except one at `ratio`
    times its bound. 'fold': S = 1e6 |Y|, so F is ~99% of the bound; 'half': S = 0 and Y put
    0.45 spacing above a representable value, so that value is 0.9x away, the next one 1.1x."""
    p = registry.get(PATHS[arith])
    rng = np.random.default_rng(7)
    g = torch.from_numpy(rng.standard_normal((2, 64))).to(DT[dt]).double().numpy()
    if part == "fold":
        Y = g * (1 + 1e-3 * rng.standard_normal(g.shape))
        S = 1e6 * np.abs(Y)
    else:
        Y = g + 0.45 * np.sign(g) * spacing(g, dt)    # away from zero: Y stays in g's binade
        S = np.zeros_like(Y)
    bound, f, half = element_bound(arith, 384, S, Y, dt)
    y = torch.from_numpy(Y).to(DT[dt])
    if part == "fold":
        y[1, 5] = float(Y[1, 5] + ratio * bound[1, 5])
    else:
        y = torch.from_numpy(g).to(DT[dt])
        if ratio > 1:
            y[1, 5] = float(g[1, 5] + np.sign(g[1, 5]) * spacing(g[1, 5], dt))
    ratios = np.abs(y.double().numpy() - Y) / bound
    assert ratios.max() <= ratios[1, 5] * (1 + 1e-9), "the plant must be the worst element"
    return p, Synthetic(p, Y, S), y, float(ratios[1, 5])


def run_elementwise(p, inp, y, dt):
    r = checks.Result(cases.Case(p.name, "b", 64, 384, 2, dt, "prepared"))
    checks._elementwise(r, p, inp, y, DT[dt])
    return r


@pytest.mark.parametrize("arith, dt", ARITH_DT)
@pytest.mark.parametrize("part", ["fold", "half"])
def test_element_bound_at_its_edge_constructed(arith, dt, part):
    for window in (LO, HI):
        p, inp, y, got = synthetic(arith, dt, part, (window[0] + window[1]) / 2)
        assert window[0] <= got <= window[1], f"plant at {got:.3f}x"
        r = run_elementwise(p, inp, y, dt)
        assert r.elem_ratio == pytest.approx(got, rel=1e-9)
        assert (checks.PER_ELEMENT in r.failed) == (window is HI), (
            f"{arith} {dt} {part}: plant at {got:.3f}x: {r.failures}; reproduce: {HERE} -k 'constructed and {arith} "
            f"and {dt} and {part}'")


# --- a comparison against the wrong reference ----------------------------------------------
@pytest.mark.parametrize("dt", DT)
def test_an_integer_path_returning_the_dense_reference_fails(dt, device):
    """Q and D differ by more than the quantized tolerance on this case: a kernel that computes
    the dense product (no Q8) must fail the quantized check, whatever the dense one says."""
    d = data("integer", dt, device=device)
    y = torch.from_numpy(d["D"]).to(DT[dt])
    assert rel(y.double(), d["Q"]) > 1.5 * tol_quantized(dt, d["Q"]), "precondition: Q and D differ enough here"
    r = judge(d, y)
    assert checks.RMS_QUANTIZED in r.failed and checks.RMS_DENSE not in r.failed, (
        f"{d['c'].id}: {r.failures}; reproduce: {HERE} -k 'returning_the_dense and {dt}'")


@pytest.mark.parametrize("dt", DT)
def test_a_floating_path_returning_the_quantized_reference_fails(dt, device):
    d = data("floating", dt, device=device)
    w = d["inp"].w
    Q = projection.quantized(d["inp"].x.cpu(), w.data.cpu(), layout=w.layout, n=w.n, k=w.k)
    y = torch.from_numpy(Q).to(DT[dt])
    assert rel(y.double(), d["D"]) > 1.5 * tol_dense("floating", dt, D=d["D"]), "precondition: Q and D differ enough here"
    r = judge(d, y)
    assert checks.RMS_DENSE in r.failed and checks.PER_ELEMENT in r.failed, (
        f"{d['c'].id}: {r.failures}; reproduce: {HERE} -k 'returning_the_quantized and {dt}'")


# --- NaN never passes -----------------------------------------------------------------------
@pytest.mark.parametrize("arith, dt", ARITH_DT)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_output_fails_every_numeric_verdict(arith, dt, value, device):
    d = data(arith, dt, device=device)
    y = d["y0"].clone()
    y[1, 7] = value
    r = judge(d, y)
    want = {checks.RMS_DENSE, checks.PER_ELEMENT} | ({checks.RMS_QUANTIZED} if arith == "integer" else set())
    want |= {checks.WRITTEN} if math.isnan(value) else set()
    assert want <= set(r.failed), f"{d['c'].id} with y[1, 7] = {value}: {r.failed}; reproduce: {HERE} -k non_finite"


@pytest.mark.parametrize("metric", ["relative_rms", "bound"])
def test_nan_in_a_metric_fails(metric, monkeypatch, device):
    """A NaN where the judge expects a number (an RMS, a per-element bound) is a failure: each
    comparison is written `not x <= tol`, which NaN never satisfies."""
    d = data("integer", "bf16", device=device)
    if metric == "relative_rms":
        monkeypatch.setattr(metrics, "relative_rms", lambda y, ref: float("nan"))
        want = {checks.RMS_QUANTIZED, checks.RMS_DENSE}
    else:
        real = numerics.element_bound

        def nan_bound(self, *a):
            b, f, h = real(self, *a)
            return b * np.nan, f, h
        monkeypatch.setattr(numerics, "element_bound", nan_bound)
        want = {checks.PER_ELEMENT}
    r = judge(d, d["y0"])
    assert want <= set(r.failed), f"{metric} NaN: {r.failed}; reproduce: {HERE} -k nan_in_a_metric"


# --- the judge loosened: the 1.1x plants then pass (what the edge tests above would catch) --
def _scaled(monkeypatch, obj, name, factor):
    old = getattr(obj, name)
    monkeypatch.setattr(obj, name, {k: v * factor for k, v in old.items()} if isinstance(old, dict) else old * factor)


@pytest.mark.parametrize("factor", [2, 4])
def test_loosened_unit_roundoff_lets_the_rms_plant_pass(factor, monkeypatch, device):
    d = data("integer", "bf16", device=device)
    tol = tol_quantized("bf16", d["Q"])
    y, got = rms_plant(d, d["Q"], 1.1 * tol, 2)
    assert checks.RMS_QUANTIZED in judge(d, y).failed
    _scaled(monkeypatch, numerics, "UNIT_ROUNDOFF", factor)
    r = judge(d, y)
    assert checks.RMS_QUANTIZED not in r.failed and r.tol_quantized != pytest.approx(tol, rel=1e-12)


@pytest.mark.parametrize("factor", [2, 4])
def test_loosened_q8_budget_or_allowance_lets_the_dense_plant_pass(factor, monkeypatch, device):
    kinds = q8_kinds("bf16", device)
    for branch in ("budget", "allowance"):
        d = data("integer", "bf16", kinds[branch], device=device)
        tol = tol_dense("integer", "bf16", d["Q"], d["D"])
        y, got = rms_plant(d, d["D"], 1.1 * tol, 4)
        assert checks.RMS_DENSE in judge(d, y).failed
        with monkeypatch.context() as mp:
            if branch == "budget":
                _scaled(mp, numerics, "Q8_BUDGET", factor)
            else:
                real = numerics.q8_allowance
                mp.setattr(numerics, "q8_allowance", lambda *a: tuple(v * factor for v in real(*a)))
            r = judge(d, y)
            assert checks.RMS_DENSE not in r.failed, (branch, r.failures)


def test_a_loosened_fp32_fold_term_is_seen_in_the_bound(monkeypatch, device):
    """FP32_FOLD is 0.3% of the bf16 bound: no plant at 1.1x can show it 4x looser, the bound's
    own value can (the edge tests compare it with the one derived here)."""
    d = data("integer", "fp16", device=device)
    _scaled(monkeypatch, numerics, "FP32_FOLD", 4)
    r = judge(d, d["y0"])
    assert r.tol_quantized != pytest.approx(tol_quantized("fp16"), rel=1e-12)


@pytest.mark.parametrize("arith", PATHS)
@pytest.mark.parametrize("factor", [2, 4])
def test_loosened_fold_unit_lets_the_fold_plant_pass(arith, factor, monkeypatch):
    p, inp, y, got = synthetic(arith, "bf16", "fold", 1.1)
    assert checks.PER_ELEMENT in run_elementwise(p, inp, y, "bf16").failed
    _scaled(monkeypatch, numerics, "FOLD_UNIT", factor)
    assert checks.PER_ELEMENT not in run_elementwise(p, inp, y, "bf16").failed


@pytest.mark.parametrize("route", ["real integer", "constructed floating"])
@pytest.mark.parametrize("factor", [2, 4])
def test_loosened_half_spacing_lets_the_rounding_plant_pass(route, factor, monkeypatch, device):
    if route == "real integer":
        d = data("integer", "fp16", device=device)
        y, ratio, _, _ = element_plant(d, HI, "half")

        def verdict():
            return judge(d, y).failed
    else:
        p, inp, y, got = synthetic("floating", "fp16", "half", 1.1)

        def verdict():
            return run_elementwise(p, inp, y, "fp16").failed
    assert checks.PER_ELEMENT in verdict()
    real = metrics.spacing
    monkeypatch.setattr(metrics, "spacing", lambda v, dtype: real(v, dtype) * factor)
    assert checks.PER_ELEMENT not in verdict()


def test_the_wrong_reference_in_the_judge_lets_the_dense_kernel_pass(monkeypatch, device):
    """A judge that reads the dense reference where the quantized one is required passes an
    integer path that skips Q8: what the wrong-reference tests above catch."""
    d = data("integer", "bf16", device=device)
    y = torch.from_numpy(d["D"]).to(torch.bfloat16)
    real = checks.Inputs.reference
    monkeypatch.setattr(checks.Inputs, "reference", lambda self, which: real(self, "dense"))
    assert checks.RMS_QUANTIZED not in judge(d, y).failed


# --- golden: floating paths whose CPU bits depend on the ISA, compared within a bound ------
def golden_case(name, dt, k):
    """(p, case, x, w, E) on K = k: F grows with K faster than the outputs (K S vs sqrt(K)), so
    K picks which part of the bound dominates."""
    from pq2verify import inputs
    p = registry.get(name)
    c = cases.seeded(cases.Case(name, "ga", 256, k, 2, dt, p.layouts[-1]))
    x = inputs.activations(2, k, c.seed, "normal", DT[dt], "cpu")
    if p.weight == "dense":
        w = inputs.dense_weight(256, k, 11, "cpu", DT[dt])
        E = projection.dense(x, w)
    else:
        w = inputs.ternary_weight(256, k, 11, "cpu", "prepared")
        E = projection.floating(x, w.data, layout=w.layout, n=w.n, k=w.k)
    return p, c, x, w, E


def golden_bound(x, w, dense, y, want, dt, S=None):
    """2 F + spacing(max(|y|, |golden|)): two FP32 folds of the same exact products, each
    within F = (K + 2)(2^-24 S + 2^-126) of the exact sum (the CPU rounds to nearest), each
    rounded once (half a spacing each)."""
    if S is None:
        wd = w.double().numpy() if dense else pq2.decode(w.data, layout=w.layout, n=w.n, k=w.k)
        S = np.abs(x.double().numpy()) @ np.abs(wd).T
    f = (x.shape[1] + 2) * (2.0 ** -24 * S + 2.0 ** -126)
    mag = np.maximum(np.abs(y.double().numpy()), np.abs(want.double().numpy()))
    return 2 * f + spacing(mag, dt), 2 * f


@functools.lru_cache(maxsize=None)
def golden_plant(name, dt, window, part):
    """(y, want, args of fold_bound, ratio): the golden is E rounded once; y equals it but for
    one element some representable steps away, at `window` x the bound derived here, on an
    element where 2F ('fold') or the spacing ('spacing') is most of the bound."""
    p, c, x, w, E = golden_case(name, dt, 256 if (dt, part) == ("fp16", "spacing") else 1024)
    dense = p.weight == "dense"
    S = np.abs(x.double().numpy()) @ np.abs(w.double().numpy() if dense else pq2.decode(w.data, layout=w.layout, n=w.n, k=w.k)).T
    want = torch.from_numpy(E).to(DT[dt])
    wd = want.double().numpy()
    ks = [k for k in range(-12, 13) if k]
    cands = neighbours(want, ks)
    mid = sum(window) / 2
    best = None
    for cand in cands:
        ct = torch.from_numpy(np.nan_to_num(cand)).to(DT[dt])
        b, f2 = golden_bound(x, w, dense, ct, want, dt, S)
        with np.errstate(invalid="ignore"):
            ratio = np.abs(cand - wd) / b
        ok = (ratio >= window[0]) & (ratio <= window[1]) & ((f2 / b > 0.5) if part == "fold" else (f2 / b < 0.3))
        if ok.any():
            score = np.where(ok, np.abs(ratio - mid), np.inf)
            i, j = np.unravel_index(int(np.argmin(score)), score.shape)
            if best is None or score[i, j] < best[0]:
                best = (score[i, j], i, j, float(cand[i, j]), float(ratio[i, j]))
    assert best, f"{name} {dt}: no element with a representable value at {window} x its bound ({part})"
    _, i, j, v, ratio = best
    y = want.clone()
    y[i, j] = v
    return y, want, (p, c, x, w), ratio


@pytest.mark.parametrize("name", ["native", "small_gemm", "cublas"])
@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("part", ["fold", "spacing"])
def test_golden_cross_isa_bound_at_its_edge(name, dt, part):
    assert golden.bits_class("interpreter", registry.get(name))[0] == "isa-dependent"
    for window, want_status in ((LO, "within bound"), (HI, "different")):
        y, want, (p, c, x, w), ratio = golden_plant(name, dt, window, part)
        y = y.clone()
        bound = golden.fold_bound(p, c, x, w, y, want)
        own = golden_bound(x, w, p.weight == "dense", y, want, dt)[0]
        assert np.allclose(bound, own, rtol=1e-12, atol=0), f"{name} {dt}: fold_bound differs from the derivation"
        status, detail = golden.compare_bound(y, want, bound)
        assert status == want_status, (f"{name} {dt} plant at {ratio:.3f}x ({part}): {status} {detail}; "
                                       f"reproduce: {HERE} -k 'golden_cross_isa and {name} and {dt} and {part}'")


@pytest.mark.parametrize("part, patch", [("fold", "CPU_FP32_U"), ("spacing", "spacing")])
@pytest.mark.parametrize("factor", [2, 4])
def test_golden_bound_loosened_lets_the_plant_pass(part, patch, factor, monkeypatch):
    y, want, args, ratio = golden_plant("native", "fp16", HI, part)
    assert golden.compare_bound(y, want, golden.fold_bound(*args, y, want))[0] == "different"
    if patch == "spacing":
        real = metrics.spacing
        monkeypatch.setattr(metrics, "spacing", lambda v, dtype: real(v, dtype) * factor)
    else:
        _scaled(monkeypatch, numerics, "CPU_FP32_U", factor)
    assert golden.compare_bound(y, want, golden.fold_bound(*args, y, want))[0] == "within bound"


@pytest.mark.parametrize("name", ["int_gemv", "mmq", "single"])
def test_golden_integer_paths_are_exact_one_step_fails(name):
    """Integer paths keep their bits on every CPU: compared exactly, so one step is a failure."""
    assert golden.bits_class("interpreter", registry.get(name))[0] == "exact"
    want = torch.from_numpy(np.random.default_rng(3).standard_normal((2, 64))).to(torch.bfloat16)
    assert golden.compare(want.clone(), want)[0] == "identical"
    y = want.clone()
    y[1, 3] = float(neighbours(want, [1])[0][1, 3])
    assert golden.compare(y, want)[0] == "different"


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_golden_bound_never_passes_a_non_finite_value(value):
    want = torch.from_numpy(np.random.default_rng(4).standard_normal((2, 64))).to(torch.bfloat16)
    y = want.clone()
    y[0, 9] = value
    assert golden.compare_bound(y, want, np.full((2, 64), np.inf))[0] == "different"
    assert golden.compare_bound(want, want, np.full((2, 64), np.nan))[0] == "identical"
    y2 = want.clone()
    y2[0, 9] = float(neighbours(want, [1])[0][0, 9])
    assert golden.compare_bound(y2, want, np.full((2, 64), np.nan))[0] == "different"   # NaN bound: no pass


# --- replay: side_metrics' bounds and the signed-bias test ---------------------------------
@functools.lru_cache(maxsize=None)
def replay_data(dt, arith="integer", *, device):
    """One captured-like call (M = 1, N = 2048, K = 256) of a PQ2 weight, its References, and
    the real output of int_gemv (integer) or native (floating) on `device` (inputs drawn on the
    CPU, references there)."""
    from pq2verify import inputs
    w = inputs.ternary_weight(2048, 256, 5, "cpu", "prepared")
    x = inputs.activations(1, 256, 6, "normal", DT[dt], "cpu")
    layer = "model.layers.0.mlp.down_proj"
    call = replay.Call(f"{layer}/1", layer, replay.kind_of(layer), 1, x)
    refs = replay.References([call], {layer: w})
    p = registry.get(PATHS[arith])
    y0 = p.kernel()(x.to(device), w.to(device), out=torch.empty(1, 2048, dtype=DT[dt], device=device)).cpu()
    Q, D = refs.get(call, "quantized"), refs.get(call, "dense")
    c = cases.Case(p.name, "r", 2048, 256, 1, dt, "prepared")
    return dict(p=p, c=c, call=call, refs=refs, y0=y0, Q=Q, D=D, Y=Q if arith == "integer" else D,
                S=abs_sum(p, x, w), arith=arith)


def side(d, y):
    return replay.side_metrics(d["call"], replay.Out(d["p"].name, y, None), d["refs"])


@pytest.mark.parametrize("arith, dt, which", [(a, t, w) for a, t in ARITH_DT for w in ("quantized", "dense")
                                              if (a, w) != ("floating", "quantized")])
def test_replay_relative_rms_at_its_edge(arith, dt, which, device):
    d = replay_data(dt, arith, device=device)
    R = d["Q"] if which == "quantized" else d["D"]
    tol = tol_quantized(dt, d["Q"]) if which == "quantized" else tol_dense(arith, dt, d["Q"], d["D"])
    for (a, b), seed in ((LO, 5), (HI, 6)):
        y, got = rms_plant(d, R, (a + b) / 2 * tol, seed)
        assert a <= got / tol <= b
        r = side(d, y)
        assert r[f"tol_{which}"] == pytest.approx(tol, rel=1e-12)
        assert any(f"relative RMS vs {which}" in f for f in r["failures"]) == (a > 1), (
            f"replay {arith} {dt} plant {got / tol:.3f}x: {r['failures']}; reproduce: {HERE} -k 'replay_relative'")


@pytest.mark.parametrize("arith, part", [("integer", "half"), ("floating", "fold")])
@pytest.mark.parametrize("dt", DT)
def test_replay_element_bound_at_its_edge(arith, part, dt, device):
    d = replay_data(dt, arith, device=device)
    for window in (LO, HI):
        y, ratio, _, _ = element_plant(d, window, part)
        bound = element_bound(arith, 256, d["S"], d["Y"], dt)[0]
        worst = float((np.abs(y.double().numpy() - d["Y"]) / bound).max())
        r = side(d, y)
        assert r["elem_ratio"] == pytest.approx(worst, rel=1e-9)
        assert any("per-element bound" in f for f in r["failures"]) == (window is HI), r["failures"]


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_replay_never_passes_a_non_finite_output(value, device):
    d = replay_data("bf16", device=device)
    y = d["y0"].clone()
    y[0, 3] = value
    r = side(d, y)
    for what in ("relative RMS vs quantized", "relative RMS vs dense", "per-element bound"):
        assert any(what in f for f in r["failures"]), (what, r["failures"])
    assert not abs(r["t_scale"]) <= 1e300 and not abs(r["t_offset"]) <= 1e300


@pytest.mark.parametrize("factor", [2, 4])
def test_replay_loosened_bounds_let_the_plants_pass(factor, monkeypatch, device):
    d = replay_data("bf16", device=device)
    y_rms, _ = rms_plant(d, d["Q"], 1.1 * tol_quantized("bf16", d["Q"]), 6)
    y_el = element_plant(d, HI, "half")[0]
    assert any("relative RMS vs quantized" in f for f in side(d, y_rms)["failures"])
    assert any("per-element bound" in f for f in side(d, y_el)["failures"])
    _scaled(monkeypatch, numerics, "UNIT_ROUNDOFF", factor)
    real = metrics.spacing
    monkeypatch.setattr(metrics, "spacing", lambda v, dtype: real(v, dtype) * factor)
    assert not any("relative RMS vs quantized" in f for f in side(d, y_rms)["failures"])
    assert not any("per-element bound" in f for f in side(d, y_el)["failures"])


def test_replay_a_nan_bound_is_outside(monkeypatch, device):
    """A NaN per-element bound (a NaN in S or the reference) must count as outside: the count
    of outputs outside was `ratio > 1`, which NaN never is, so such a call passed."""
    d = replay_data("bf16", device=device)
    real = numerics.element_bound

    def nan_bound(self, *a):
        b, f, h = real(self, *a)
        return b * np.nan, f, h
    monkeypatch.setattr(numerics, "element_bound", nan_bound)
    r = side(d, d["y0"])
    assert any("per-element bound" in f for f in r["failures"]), f"{r['failures']}; reproduce: {HERE} -k nan_bound"


def bias_z(calls: int, kinds: int) -> float:
    """Two statistics (scale, offset) per call and per kind, each a two-sided test; Bonferroni
    at a family-wise 1e-3: z = Phi^-1(1 - 1e-3 / (2 tests))."""
    return statistics.NormalDist().inv_cdf(1 - 1e-3 / (2 * 2 * (calls + kinds)))


def own_t(y, Y, dt):
    """(t of mean u*sign(Y), t of mean u), u = (y - Y) / spacing(Y) clipped to +-1 (BIAS_WHY)."""
    u = np.clip((y - Y) / spacing(Y, dt), -1.0, 1.0)
    nz = Y != 0

    def t(v):
        return float(v.mean() / (v.std(ddof=1) / math.sqrt(v.size)))
    return t((u[nz] * np.sign(Y[nz])).ravel()), t(u.ravel())


def bias_plant(d, dt, stat, target):
    """y0 scaled by (1 + e r) ('t_scale') or moved by e r output spacings ('t_offset'), r a
    seeded factor in [0, 2) per output (so the outputs' roundings flip one at a time as e
    grows), e found by bisection so that this statistic (computed here) is `target`."""
    y0, Y = d["y0"].double().numpy(), d["Y"]
    sp = spacing(Y, dt)
    r = np.random.default_rng(8).uniform(0, 2, size=Y.shape)

    def make(e):
        return torch.from_numpy(y0 * (1 + e * r) if stat == "t_scale" else y0 + e * r * sp).to(DT[dt])

    def t(e):
        return own_t(make(e).double().numpy(), Y, dt)[0 if stat == "t_scale" else 1]
    sign = 1 if target > 0 else -1
    lo, hi = 0.0, sign * (0.02 if stat == "t_scale" else 2.0)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sign * t(mid) < abs(target) else (lo, mid)
    return make(hi), t(hi)


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("stat, sign", [("t_scale", 1), ("t_scale", -1), ("t_offset", 1), ("t_offset", -1)])
def test_replay_bias_threshold_at_its_edge(dt, stat, sign, device):
    d = replay_data(dt, device=device)
    z = bias_z(1, 1)
    a_out = replay.Out("int_gemv", d["y0"], None)
    for window in (LO, HI):
        y, t = bias_plant(d, dt, stat, sign * sum(window) / 2 * z)
        assert window[0] <= sign * t / z <= window[1], f"plant at {t / z:.3f}x"
        res = replay.evaluate([d["call"]], d["refs"], [a_out], [replay.Out("gemv", y, None)])
        assert res["bias_threshold"] == pytest.approx(z, rel=1e-12), "the judge's threshold differs"
        row = res["calls"][0]
        assert row["b"][stat] == pytest.approx(t, rel=1e-9)
        flagged = any(f.startswith("B") and "biased" in f and stat in f for f in row["failures"])
        pooled = [f for f in res["kinds"][d["call"].kind]["failures"] if f.startswith("B") and stat in f]
        assert flagged == bool(pooled) == (window is HI), (
            f"{dt} {stat} at {t / z:.3f}x of z={z:.3f}: {row['failures']} {pooled}; "
            f"reproduce: {HERE} -k 'bias and {dt}'")


def test_replay_bias_threshold_loosened_lets_the_plant_pass(monkeypatch, device):
    d = replay_data("fp16", device=device)
    y, t = bias_plant(d, "fp16", "t_scale", 1.1 * bias_z(1, 1))
    outs = ([replay.Out("int_gemv", d["y0"], None)], [replay.Out("gemv", y, None)])
    assert res_biased(replay.evaluate([d["call"]], d["refs"], *outs))
    real = replay.bias_threshold
    monkeypatch.setattr(replay, "bias_threshold", lambda n: 2 * real(n))
    assert not res_biased(replay.evaluate([d["call"]], d["refs"], *outs))


def res_biased(res) -> bool:
    return any("biased" in f for r in res["calls"] for f in r["failures"])


# --- GSM8K: the floor's sign test -----------------------------------------------------------
def tail(n: int, up: int) -> Fraction:
    """P(X >= up), X ~ Binomial(n, 1/2): the one-sided exact sign test's p."""
    return Fraction(sum(math.comb(n, k) for k in range(up, n + 1)), 2 ** n)


def sign_plant(window, alpha=0.01):
    """(n, up) whose p lies in window x alpha: the closest one to its middle, n <= 400."""
    best = None
    for n in range(8, 401):
        for up in range(n // 2, n + 1):
            r = float(tail(n, up)) / alpha
            if window[0] <= r <= window[1] and (best is None or abs(r - sum(window) / 2) < best[0]):
                best = (abs(r - sum(window) / 2), n, up, r)
            if r < window[0]:
                break
        if best and best[0] < 0.005:
            break
    return best[1], best[2], best[3]


def tf(kls: dict):
    return {"mean_kl": sum(kls.values()) / len(kls), "per_question": {q: {"kl": v} for q, v in kls.items()}}


def sign_records(n, up, ties=3):
    """Per-question KLs: B above F on `up` questions, below on n - up, equal on `ties`."""
    kf = {q: 0.01 for q in range(n + ties)}
    kb = {q: (0.02 if q < up else 0.005 if q < n else 0.01) for q in range(n + ties)}
    return tf(kb), tf(kf)


@pytest.mark.parametrize("window, want", [(LO, "beyond arithmetic noise"), (HI, "within arithmetic noise")])
def test_gsm8k_sign_test_at_its_edge(window, want):
    n, up, ratio = sign_plant(window)
    v = floor.verdict(*sign_records(n, up))
    assert v["p"] == pytest.approx(ratio * 0.01, rel=1e-12) and v["ties"] == 3
    assert v["verdict"] == want, (f"n={n} up={up} p={v['p']:.4g} ({ratio:.3f}x alpha): {v}; "
                                  f"reproduce: {HERE} -k sign_test")


@pytest.mark.parametrize("factor", [2, 4])
def test_gsm8k_alpha_loosened_lets_the_plant_pass(factor, monkeypatch):
    n, up, _ = sign_plant(LO)
    assert floor.verdict(*sign_records(n, up))["verdict"] == "beyond arithmetic noise"
    monkeypatch.setattr(floor.verdict, "__defaults__", (floor.ALPHA / factor,))
    assert floor.verdict(*sign_records(n, up))["verdict"] != "beyond arithmetic noise"


@pytest.mark.parametrize("where", ["b", "f"])
@pytest.mark.parametrize("share", ["one", "all"])
def test_gsm8k_a_non_finite_kl_is_never_within_noise(where, share):
    """A NaN KL compares false both ways: the sign test dropped it as a tie, so a B (or a floor)
    whose KL is NaN on some questions, or all, was 'within arithmetic noise'."""
    n, up, _ = sign_plant(HI)
    tb, tf_ = sign_records(n, up)
    t = tb if where == "b" else tf_
    for q in ([0] if share == "one" else list(t["per_question"])):
        t["per_question"][q]["kl"] = float("nan")
    v = floor.verdict(tb, tf_)
    assert v["verdict"] != "within arithmetic noise", f"{where} NaN on {share}: {v}; reproduce: {HERE} -k non_finite_kl"


@pytest.mark.parametrize("ratio, want", [(0.9, "within floor drift"), (1.1, "beyond floor drift")])
def test_gsm8k_flip_against_the_floor_drift_at_its_edge(ratio, want):
    from pq2verify.gsm8k import report
    drift = 0.4
    margin = ratio * drift
    top_a = [[[1, -0.1], [2, -3.0]], [[7, -0.5], [8, -0.5 - margin]]]
    lpk = [[-0.1, -3.0], [-0.5 - drift / 2, -0.5 - margin + drift / 2]]
    a = {"tokens": [1, 7], "topk": top_a, "answer": "1", "correct": False, "invalid": False, "strict_invalid": False,
         "decode_m": [], "teacher": {"f": {"kl": [0, 0], "top1": [True, True], "lpk": lpk}}}
    b = dict(a, tokens=[1, 8], topk=[[[1, -0.1], [2, -3.0]], [[8, -0.6], [7, -0.7]]], answer="2")
    b.pop("teacher")
    c = report.compare({0: a}, {0: b})
    floor.classify(c, {0: a}, "f")
    row = c["diffs"][0]
    assert row["margin_a"] == pytest.approx(margin) and row["floor_drift"] == pytest.approx(drift)
    assert row["vs_floor"] == want
