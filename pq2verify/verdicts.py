"""The one verdict library: relative RMS against the quantized and the dense FP64 references
(with the Q8 allowance), the per-element bound (fold allowance F plus half a spacing), exact
integer group dots, and golden's cross-ISA bound, each implemented once over the bounds of
pq2verify.numerics. check (checks.evaluate), replay (side_metrics), golden capture and verify,
and the selftest call these and record what fails as a typed Failure.

A reader learns which check failed from Failure.check, a name of CHECKS, never from the
message: every message is worded through `wording`, one hook a test can replace."""
from dataclasses import dataclass

import numpy as np
import torch

from . import numerics
from .bits import bits, same_bits

# --- check names --------------------------------------------------------------------------------
# the check engine's (pq2verify check)
WRITTEN, RMS_QUANTIZED, RMS_DENSE, PER_ELEMENT = "written", "rms quantized", "rms dense", "per-element"
DOTS, CLAIM, DETERMINISM, BATCH, NAN, GUARD = ("dots", "exactness claim", "determinism", "batch invariance",
                                              "nan propagation", "guard band")
FOLD = "declared fold"
ERROR = "error"          # the case raised: no verdict on the kernel
# replay's A/B: its own checks beside the engine's per-call ones
DOTS_CALL = "dots= call"              # a path's output with dots= differs from the dispatched call's
DOTS_AB = "dots A=B"                  # A's and B's integer group dots differ
CLAIM_AB = "bytes A=B"                # B's bytes differ from A's where the registry claims them equal
BIAS = "bias"
TRACE = "dispatch trace"              # a side ran another path than dispatch chose before the run
SAME = "same path and fold"           # A and B ran the same path in the same fold order
VOID_CONTROL = "void control"
# golden (verify, capture) and the selftest's other detectors
GOLDEN_BYTES, GOLDEN_BOUND, GOLDEN_NUMERICS = "golden bytes", "golden bound", "golden numerics"
INPLACE, GRAPH = "in-place update", "graph mutation"

ENGINE_CHECKS = (WRITTEN, RMS_QUANTIZED, RMS_DENSE, PER_ELEMENT, DOTS, CLAIM, DETERMINISM, BATCH, NAN, GUARD,
                 FOLD, ERROR)
REPLAY_CHECKS = (DOTS_CALL, DOTS_AB, CLAIM_AB, BIAS, TRACE, SAME, VOID_CONTROL)
CHECKS = ENGINE_CHECKS + REPLAY_CHECKS + (GOLDEN_BYTES, GOLDEN_BOUND, GOLDEN_NUMERICS, INPLACE, GRAPH)


def rms_check(which: str) -> str:
    return RMS_QUANTIZED if which == "quantized" else RMS_DENSE


@dataclass(frozen=True)
class Failure:
    check: str          # a name of CHECKS
    message: str        # for a person; never parsed
    where: str = ""     # the case or call, and the element or row where there is one

    def __post_init__(self):
        if self.check not in CHECKS:
            raise ValueError(f"unknown check {self.check!r}; expected one of {', '.join(CHECKS)}")


def wording(check: str, text: str) -> str:
    """The message a failure of `check` shows: its text as composed (the hook a test replaces
    to show that no reader depends on the words)."""
    return text


def failure(check: str, text: str, where: str = "") -> Failure:
    return Failure(check, wording(check, text), where)


def names(failures) -> list[str]:
    return [f.check for f in failures]


def messages(failures) -> list[str]:
    return [f.message for f in failures]


# --- relative RMS -------------------------------------------------------------------------------
@dataclass
class Rms:
    which: str              # 'quantized' | 'dense'
    err: float
    tol: float
    q8_error: float | None  # the exact Q8 arithmetic's own error, where the allowance was computed

    @property
    def ok(self) -> bool:
        return err_within(self.err, self.tol)

    @property
    def check(self) -> str:
        return rms_check(self.which)


def err_within(err: float, tol: float) -> bool:
    return err <= tol            # written so, a NaN error fails


def rms(p, y64: np.ndarray, reference, dtype, only: tuple | None = None) -> list[Rms]:
    """Relative RMS of y64 against each FP64 reference path p is judged on (numerics.
    rms_tolerances), or only those named in `only`. reference(which) -> float64 array."""
    from reference import metrics
    out = []
    for which, tol, e_q in numerics.rms_tolerances(p, dtype, reference):
        if only is not None and which not in only:
            continue
        out.append(Rms(which, metrics.relative_rms(y64, reference(which)), tol, e_q))
    return out


# --- the per-element bound ----------------------------------------------------------------------
@dataclass
class Element:
    ratio: float            # max |y - Y| / bound (<= 1 passes); 0 where there are no outputs
    fold_used: float        # max (|y - Y| - half) / F
    outside: int            # outputs outside their bound (a NaN ratio is outside)
    size: int
    max_ulp: int
    first: tuple | None     # (i, j) of the first output outside, in the arrays given
    y: np.ndarray           # float64 outputs, the reference, |y - Y|, bound and F
    ref: np.ndarray
    err: np.ndarray
    bound: np.ndarray
    f: np.ndarray

    @property
    def ok(self) -> bool:
        return self.ratio <= 1.0


def element(p, k: int, y: torch.Tensor, ref: np.ndarray, abs_sum: np.ndarray, dtype) -> Element:
    """|y - ref| <= F + spacing(|ref| + F) / 2 per output (numerics.element_bound) for y, the
    outputs judged (a torch tensor of the path's dtype, on the CPU)."""
    from reference import metrics
    ys = y.double().numpy()
    bound, f, half = numerics.element_bound(p, k, abs_sum, ref, dtype)
    err = np.abs(ys - ref)
    with np.errstate(invalid="ignore"):
        ratio = np.where(np.isfinite(ys), err / bound, np.inf)
        used = np.where(np.isfinite(ys), (err - half) / f, np.inf)
    outside = ~(ratio <= 1.0)          # a NaN ratio (NaN reference or bound) is outside too
    first = tuple(int(v) for v in np.argwhere(outside)[0]) if outside.any() else None
    return Element(float(ratio.max()) if ratio.size else 0.0, float(used.max()) if used.size else 0.0,
                   int(outside.sum()), int(ratio.size),
                   metrics.max_ulp(y, torch.from_numpy(metrics.round_once(ref, dtype)).to(dtype)), first,
                   ys, ref, err, bound, f)


# --- exact integer group dots -------------------------------------------------------------------
def dots(got: np.ndarray, want: np.ndarray) -> tuple | None:
    """None where the integer group dots equal the exact ones, else (m, n, g) of the first
    difference (indices into the arrays given; (0, 0, 0) where the shapes differ: dots of part of
    the case never pass, even where they broadcast onto the exact ones)."""
    if got.shape != want.shape:
        return (0, 0, 0)
    if np.array_equal(got, want):
        return None
    return tuple(int(v) for v in np.argwhere(got != want)[0])


# --- golden: bit for bit, or within the cross-ISA bound -------------------------------------------
def compare(y: torch.Tensor, want: torch.Tensor) -> tuple[str, str]:
    """('identical', '') or ('different', the first difference and the max ulp)."""
    if same_bits(y, want):
        return "identical", ""
    if y.shape != want.shape or y.dtype != want.dtype:
        return "different", f"shape/dtype {tuple(y.shape)} {y.dtype} vs captured {tuple(want.shape)} {want.dtype}"
    diff = bits(y) != bits(want)
    m, n = (int(v) for v in torch.nonzero(diff)[0])
    ulps = (bits(y).int() - bits(want).int()).abs().max().item()
    return "different", (f"{int(diff.sum())} of {y.numel()} elements differ, first at [{m}, {n}]: "
                         f"{y[m, n].item()} vs captured {want[m, n].item()}; max {ulps} ulp")


def compare_bound(y: torch.Tensor, want: torch.Tensor, bound: np.ndarray) -> tuple[str, str]:
    """'identical', 'within bound' (every differing element within its bound; non-finite
    elements must have the same bits) or 'different', with the worst element."""
    from reference import metrics, to_float64
    if same_bits(y, want) or y.shape != want.shape or y.dtype != want.dtype:
        return compare(y, want)
    yd, wd = to_float64(y), to_float64(want)
    same = (bits(y) == bits(want)).numpy()
    with np.errstate(invalid="ignore"):
        ok = same | (np.isfinite(yd) & np.isfinite(wd) & (np.abs(yd - wd) <= bound))
    ulps = metrics.ulp_distance(y, want)
    n_diff = int((~same).sum())
    if ok.all():
        ratio = np.where(same, 0.0, np.abs(yd - wd) / bound)
        m, n = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        return "within bound", (f"{n_diff} of {y.numel()} elements differ, max {int(ulps.max())} ulp; the "
                                f"closest to its bound at [{m}, {n}]: |diff| {abs(yd[m, n] - wd[m, n]):.3g} "
                                f"<= {bound[m, n]:.3g}")
    m, n = (int(v) for v in np.argwhere(~ok)[0])
    return "different", (f"{int((~ok).sum())} of {y.numel()} elements outside the bound ({n_diff} differ), first "
                         f"at [{m}, {n}]: {float(yd[m, n])!r} vs captured {float(wd[m, n])!r}, |diff| "
                         f"{abs(yd[m, n] - wd[m, n]):.3g} > bound {bound[m, n]:.3g} ({int(ulps[m, n])} ulp)")
