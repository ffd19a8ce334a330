"""The judging code at its edges, on hand-built inputs whose right verdict follows from first
principles (never from the code under test): the per-element bound's underflow term and its
elem_factor, a NaN reference among finite ones, the bias statistics on non-finite or degenerate
samples, the exact comparisons (dots, golden bytes, bits) on -0.0, NaN payloads, dtypes, shapes
and the last element, and reference.metrics on the same. Each test here was written against a
fault planted in that code (a mutant) that the rest of the suite let pass."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from pq2verify import numerics, registry, verdicts
from pq2verify.bits import bits, ndiff, same_bits
from reference import metrics

HERE = ".venv/bin/python -m pytest -q -p no:randomly 'tests/test_judging_edges.py::{}'"
TINY = 2.0 ** -126                        # FP32's smallest normal: the underflow unit of F


def repro(name: str) -> str:
    return "reproduce: " + HERE.format(name)


# --- the per-element bound ------------------------------------------------------------------
# (path, K, T terms, half): |Y| + F lies in [2^-123, 2^-122) for int_gemv (F = 5 2^-126), so a
# bf16 spacing of 2^-130 there; in [2^-117, 2^-116) for native (F = 386 2^-126), spacing 2^-124
@pytest.mark.parametrize("path, k, terms, half", [("int_gemv", 384, 3, 2.0 ** -131), ("native", 384, 384, 2.0 ** -125)],
                         ids=["int_gemv", "native"])
def test_underflow_term_of_the_fold_allowance(path, k, terms, half):
    """An FP32 fold may flush subnormal partial sums to zero, (T + 2) 2^-126 at most (T terms:
    K/128 groups, or K products). With S = 0 (all terms ~0) the bound on bf16 is that plus half
    a spacing at |Y| + F: y = 0 against Y = 0.9 of it passes, against 1.1 of it fails."""
    p = registry.get(path)
    edge = (terms + 2) * TINY + half
    for share, want_ok in ((0.9, True), (1.1, False)):
        ref = np.full((1, 4), share * edge)
        y = torch.zeros(1, 4, dtype=torch.bfloat16)
        e = verdicts.element(p, k, y, ref, np.zeros((1, 4)), torch.bfloat16)
        assert e.ok == want_ok, (f"{path}: y = 0 vs Y = {share} x ((T+2) 2^-126 + half a spacing), T = {terms}: "
                                 f"ratio {e.ratio:.3g}; {repro('test_underflow_term_of_the_fold_allowance')}")
        assert e.ratio == pytest.approx(share, rel=1e-6), repro("test_underflow_term_of_the_fold_allowance")


def test_elem_factor_scales_the_fold_allowance():
    """A path declaring elem_factor 2 has twice the F: an error at 1.5x the unscaled F (S large,
    so the half spacing is negligible) passes it and fails the same path at elem_factor 1."""
    base = registry.get("int_gemv")
    wide = dataclasses.replace(base, elem_factor=2.0, elem_reason="test: twice the fold allowance")
    k, terms = 384, 3
    S = np.full((1, 2), 2.0 ** 20)
    f1 = 2.0 ** -24 * (terms + 2) * S[0, 0] + (terms + 2) * TINY       # F of elem_factor 1
    ref = np.array([[1.0, 1.0]])
    y = torch.tensor([[1.0 + 1.5 * f1, 1.0]], dtype=torch.float16)    # f1 = 0.3125: 1.46875 in fp16
    err = float(y[0, 0]) - 1.0
    assert 1.4 * f1 < err < 1.6 * f1, "precondition: the fp16 value lies near 1.5 F"
    for p, want_ok in ((base, False), (wide, True)):
        e = verdicts.element(p, k, y, ref, S, torch.float16)
        assert e.ok == want_ok, (f"elem_factor {p.elem_factor}: |y - Y| = {err / f1:.3f} F: ratio {e.ratio:.3g}; "
                                 f"{repro('test_elem_factor_scales_the_fold_allowance')}")


def test_one_nan_reference_among_finite_ones_fails_the_element_bound():
    """A NaN in the FP64 reference (a NaN input the kernel ignored, writing 0 there) with every
    output finite and the rest exact: no bound holds there, so the verdict fails and counts it."""
    p = registry.get("int_gemv")
    ref = np.array([[1.0, 2.0, 0.0, 4.0]])
    y = torch.tensor(ref, dtype=torch.bfloat16)
    ref[0, 2] = np.nan
    e = verdicts.element(p, 384, y, ref, np.abs(np.nan_to_num(ref)), torch.bfloat16)
    where = repro("test_one_nan_reference_among_finite_ones_fails_the_element_bound")
    assert not e.ok, f"a NaN reference passed: ratio {e.ratio}; {where}"
    assert e.outside == 1 and e.first == (0, 2), f"outside {e.outside}, first {e.first}; {where}"


def test_the_first_output_outside_is_the_first_in_order():
    """Two outputs far outside, at [0, 1] and [1, 3]: the failure names [0, 1], the first in
    row-major order (the message and the failure's `where` point there)."""
    p = registry.get("int_gemv")
    ref = np.arange(1.0, 9.0).reshape(2, 4)
    y = torch.tensor(ref, dtype=torch.bfloat16)
    y[0, 1] += 1.0
    y[1, 3] += 1.0
    e = verdicts.element(p, 384, y, ref, np.abs(ref), torch.bfloat16)
    assert (e.outside, e.first) == (2, (0, 1)), (f"outside {e.outside}, first {e.first}; "
                                                 f"{repro('test_the_first_output_outside_is_the_first_in_order')}")


# --- exact integer group dots -----------------------------------------------------------------
def test_dots_differing_only_in_the_last_row_or_group_are_found():
    want = np.arange(2 * 3 * 4, dtype=np.int64).reshape(2, 3, 4)
    for where in ((1, 2, 3), (1, 0, 0), (0, 2, 3)):
        got = want.copy()
        got[where] += 1
        assert verdicts.dots(got, want) == where, (f"one dot off by 1 at {where}: {verdicts.dots(got, want)}; "
                                                    f"{repro('test_dots_differing_only_in_the_last_row_or_group_are_found')}")
    assert verdicts.dots(want.copy(), want) is None


def test_dots_of_another_shape_never_pass():
    """Dots for fewer groups (or rows) than the case has cover only part of it: a failure, even
    where every dot they hold is right and they broadcast onto the exact ones (equal rows)."""
    want = np.tile(np.arange(3 * 4, dtype=np.int64).reshape(1, 3, 4), (2, 1, 1))
    for got in (want[:, :, :3], want[:1], want[:, :1], want.reshape(2, 12)):
        assert verdicts.dots(got, want) is not None, (f"dots of shape {got.shape} vs {want.shape} passed; "
                                                      f"{repro('test_dots_of_another_shape_never_pass')}")


# --- golden: bit for bit, or within the cross-ISA bound ---------------------------------------
def _golden_want():
    return torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.25, 4.0, -1.5, 8.0]], dtype=torch.bfloat16)


def test_golden_bytes_tell_signed_zeros_and_nan_payloads_apart():
    """Bit for bit: -0.0 is not +0.0, and an output that is NaN in the capture and NaN now, with
    the same bits, is identical (a float == would say the opposite of both)."""
    name = "test_golden_bytes_tell_signed_zeros_and_nan_payloads_apart"
    want = _golden_want()
    want[0, 2] = 0.0
    y = want.clone()
    y[0, 2] = -0.0
    assert verdicts.compare(y, want)[0] == "different", f"-0.0 vs captured +0.0 passed; {repro(name)}"
    want[1, 1] = float("nan")
    assert verdicts.compare(want.clone(), want)[0] == "identical", f"same NaN bits called different; {repro(name)}"
    other = want.clone()
    other.view(torch.int16)[1, 1] ^= 1                     # another NaN payload
    assert verdicts.compare(other, want)[0] == "different", f"another NaN payload passed; {repro(name)}"


def test_golden_bytes_find_one_ulp_in_the_last_element():
    want = _golden_want()
    y = want.clone()
    y.view(torch.int16)[1, 3] += 1
    status, detail = verdicts.compare(y, want)
    assert status == "different" and "[1, 3]" in detail, (
        f"{status} {detail}; {repro('test_golden_bytes_find_one_ulp_in_the_last_element')}")


def test_golden_bound_judges_the_last_row_too():
    """Within the bound everywhere but the last element, which is 2 ulps off with a bound of
    one ulp: 'different', naming it."""
    want = _golden_want()
    ulp = torch.from_numpy(metrics.spacing(want.double().numpy(), torch.bfloat16)).double().numpy()
    y = want.clone()
    y.view(torch.int16)[0, 0] += 1                        # one ulp: inside
    y.view(torch.int16)[1, 3] += 2                        # two ulps: outside
    status, detail = verdicts.compare_bound(y, want, 1.0 * ulp)
    assert status == "different" and "[1, 3]" in detail, (
        f"{status} {detail}; {repro('test_golden_bound_judges_the_last_row_too')}")


def test_golden_bound_accepts_a_nan_with_the_captured_bits():
    """A NaN the capture holds too, bit for bit, is the same output; the other differences lie
    within their bound, so the whole is 'within bound'."""
    want = _golden_want()
    want[0, 1] = float("nan")
    ulp = metrics.spacing(np.nan_to_num(want.double().numpy()), torch.bfloat16)
    y = want.clone()
    y.view(torch.int16)[1, 0] += 1
    status, detail = verdicts.compare_bound(y, want, ulp)
    assert status == "within bound", f"{status} {detail}; {repro('test_golden_bound_accepts_a_nan_with_the_captured_bits')}"


# --- bits of tensors -------------------------------------------------------------------------
def test_same_bits_needs_the_same_dtype_shape_and_bits():
    name = "test_same_bits_needs_the_same_dtype_shape_and_bits"
    a = torch.tensor([1.0, 0.0, -2.0, 3.0, 0.5, 6.0], dtype=torch.bfloat16)
    as_fp16 = a.view(torch.int16).view(torch.float16)           # the same 16-bit patterns, read as fp16
    assert not same_bits(a, as_fp16), f"bf16 and fp16 with equal bit patterns called the same; {repro(name)}"
    assert not same_bits(a.view(2, 3), a.view(3, 2)), f"[2, 3] and [3, 2] called the same; {repro(name)}"
    z = a.clone()
    z[1] = -0.0
    assert not same_bits(a, z), f"-0.0 and +0.0 called the same; {repro(name)}"
    n = a.clone()
    n[2] = float("nan")
    assert same_bits(n, n.clone()), f"equal NaN bits called different; {repro(name)}"
    assert ndiff(a, z) == 1 and ndiff(a.view(2, 3), a.view(3, 2)) == -1, repro(name)


# --- reference.metrics ---------------------------------------------------------------------------
def test_relative_rms_is_relative_at_any_scale():
    """||y - ref|| / ||ref||: 1% off is 0.01 whether ||ref|| is 5e-3 or 5e3."""
    for scale in (1e-3, 1e3):
        ref = np.array([3.0, -4.0]) * scale
        got = metrics.relative_rms(ref * 1.01, ref)
        assert got == pytest.approx(0.01, rel=1e-9), (
            f"||ref|| = {5 * scale:g}: {got}; {repro('test_relative_rms_is_relative_at_any_scale')}")


def test_max_abs_is_the_largest_difference_wherever_it_lies():
    ref = np.zeros((2, 3))
    for where in ((0, 0), (1, 1), (0, 2)):
        y = ref.copy() + 0.125
        y[where] = -2.0
        assert metrics.max_abs(y, ref) == 2.0, (
            f"largest at {where}: {metrics.max_abs(y, ref)}; {repro('test_max_abs_is_the_largest_difference_wherever_it_lies')}")


def test_max_ulp_is_the_largest_distance_wherever_it_lies():
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.bfloat16)
    b = a.clone()
    b.view(torch.int16)[0, 0] += 1
    b.view(torch.int16)[1, 1] += 5
    assert metrics.max_ulp(b, a) == 5, f"{metrics.max_ulp(b, a)}; {repro('test_max_ulp_is_the_largest_distance_wherever_it_lies')}"


def test_ulp_distance_to_a_nan_reference_is_far():
    """A finite output against a NaN reference is no number of ulps away: FAR, whichever side
    holds the NaN."""
    y = np.array([1.0, 2.0], np.float16)
    r = np.array([1.0, np.nan], np.float16)
    name = "test_ulp_distance_to_a_nan_reference_is_far"
    assert metrics.ulp_distance(y, r).tolist() == [0, metrics.FAR], f"{metrics.ulp_distance(y, r)}; {repro(name)}"
    assert metrics.ulp_distance(r, y).tolist() == [0, metrics.FAR], f"{metrics.ulp_distance(r, y)}; {repro(name)}"


def test_spacing_below_the_normal_range_is_the_subnormal_step():
    """bf16 (8 significant bits, emin -126): 2^-133 below 2^-126; fp16 (11 bits, emin -14): 2^-24
    below 2^-14; at the smallest normal itself the same; one binade up, twice it."""
    name = "test_spacing_below_the_normal_range_is_the_subnormal_step"
    for dt, emin, p in ((torch.bfloat16, -126, 8), (torch.float16, -14, 11)):
        step = 2.0 ** (emin - p + 1)
        got = metrics.spacing(np.array([0.0, 2.0 ** (emin - 3), 2.0 ** emin, 2.0 ** (emin + 1)]), dt)
        assert got.tolist() == [step, step, step, 2 * step], f"{dt}: {got}; {repro(name)}"


def test_round_once_keeps_the_largest_finite_value():
    """65504 is fp16's largest finite value: it rounds to itself; past the halfway point to the
    next binade (65520) it overflows to inf."""
    got = metrics.round_once(np.array([65504.0, 65519.0, 65520.0, -65504.0]), torch.float16)
    assert got.tolist() == [65504.0, 65504.0, math.inf, -65504.0], (
        f"{got}; {repro('test_round_once_keeps_the_largest_finite_value')}")


# --- the signed-bias statistics ----------------------------------------------------------------
def test_bias_of_a_nan_reference_never_passes():
    """A NaN reference gives no evidence of an unbiased error: both statistics must lie beyond
    every threshold, however few outputs carry a nonzero reference (here one, a NaN)."""
    y = np.array([1.0, 0.0, 0.0, 0.0])
    ref = np.array([np.nan, 0.0, 0.0, 0.0])
    t_scale, t_offset = numerics.bias(y, ref, torch.bfloat16)
    assert not abs(t_scale) <= 1e300 and not abs(t_offset) <= 1e300, (
        f"t_scale {t_scale}, t_offset {t_offset}; {repro('test_bias_of_a_nan_reference_never_passes')}")


# --- the check engine: faults confined to the last row, output, group or rerun ----------------
def _case(path, m):
    from pq2verify import checks
    return checks.cases("small", paths=[path], ms=[m], dtypes=["bf16"], layouts=["prepared"])[0]


def _evaluate(path, m, wrap, checks_=("rms",)):
    from pq2verify import checks
    real = registry.get(path).kernel()

    def run(x, w, *, out=None, dots=None):
        y = real(x, w, out=out, dots=dots) if registry.get(path).has_dots else real(x, w, out=out)
        wrap(x, y, dots)
        return y
    c = _case(path, m)
    return c, checks.evaluate(c, "cpu", checks=checks_, kernel=run)


def test_an_unwritten_last_row_fails(cpu_only):
    """out is pre-filled with NaN: a kernel that never stores its last row leaves NaN there."""
    def wrap(x, y, dots):
        y[-1] = float("nan")
    c, r = _evaluate("int_gemv", 3, wrap)
    assert r.written is False and verdicts.WRITTEN in r.failed, (
        f"{c.id}: {r.failed}; {repro('test_an_unwritten_last_row_fails')}")


def test_a_last_output_that_reads_other_rows_fails_batch_invariance(cpu_only):
    """Each row's last output replaced by the sum of the whole batch's x: row i's other outputs
    keep their bits when the other rows change, its last one does not."""
    def wrap(x, y, dots):
        y[:, -1] = x.float().sum()
    c, r = _evaluate("int_gemv", 3, wrap, ("batch",))
    assert r.batch_invariant is False and verdicts.BATCH in r.failed, (
        f"{c.id}: {r.failed}; {repro('test_a_last_output_that_reads_other_rows_fails_batch_invariance')}")


def test_a_nan_leaking_into_the_last_other_row_fails(cpu_only):
    """One NaN planted in x: a kernel that also makes the last row without it NaN changed a row
    the NaN never reached."""
    def wrap(x, y, dots):
        bad = torch.isnan(x).any(1)
        if bad.any():
            y[[i for i in range(x.shape[0]) if not bad[i]][-1]] = float("nan")
    c, r = _evaluate("int_gemv", 3, wrap, ("nan",))
    assert r.nan_exact is False and verdicts.NAN in r.failed, (
        f"{c.id}: {r.failed}; {repro('test_a_nan_leaking_into_the_last_other_row_fails')}")


def test_a_wrong_dot_in_the_last_group_fails(cpu_only):
    def wrap(x, y, dots):
        if dots is not None:
            dots[-1, -1, -1] += 1
    c, r = _evaluate("int_gemv", 3, wrap, ("exact",))
    assert r.dots_exact is False and verdicts.DOTS in r.failed, (
        f"{c.id}: {r.failed}; {repro('test_a_wrong_dot_in_the_last_group_fails')}")


@pytest.mark.parametrize("path, m", [("gemv", 1), ("small_mma", 3)])
def test_a_dots_claim_broken_in_the_last_dot_fails(path, m, cpu_only):
    """gemv and small_mma claim int_gemv's group dots: one dot off in the last row, output and
    group breaks the claim (and the exact dots)."""
    def wrap(x, y, dots):
        if dots is not None:
            dots[-1, -1, -1] += 1
    c, r = _evaluate(path, m, wrap, ("exact",))
    assert r.claim.startswith("dots ==") and r.claim_held is False and verdicts.CLAIM in r.failed, (
        f"{c.id}: {r.claim} {r.claim_held} {r.failed}; {repro('test_a_dots_claim_broken_in_the_last_dot_fails')}")


def test_a_bytes_claim_tells_signed_zeros_apart(monkeypatch, cpu_only):
    """mmq_planes claims mmq's bytes: where mmq writes -0.0 and mmq_planes +0.0 the values are
    equal and the bytes are not, so the claim fails."""
    import importlib
    mod = importlib.import_module("kernels.mmq")
    real_mmq = mod.run

    def mmq_neg_zero(x, w, *, out=None, dots=None, **kw):
        y = real_mmq(x, w, out=out, dots=dots, **kw)
        y[0, 0] = -0.0
        return y
    monkeypatch.setattr(mod, "run", mmq_neg_zero)

    def wrap(x, y, dots):
        y[0, 0] = 0.0
    c, r = _evaluate("mmq_planes", 17, wrap, ("exact",))
    assert r.claim.startswith("bytes ==") and r.claim_held is False and verdicts.CLAIM in r.failed, (
        f"{c.id}: {r.claim} {r.claim_held} {r.failed}; {repro('test_a_bytes_claim_tells_signed_zeros_apart')}")


# --- golden: a stored tensor must be the case's whole tensor -----------------------------------
def test_a_stored_tensor_of_another_dtype_or_shape_is_integrity():
    """A [2, 6] bf16 case: the same 12 elements stored as [3, 4] or [12], or as fp16 bits, are
    not the case's tensor (a comparison of them would read other elements or other values)."""
    from pq2verify.golden import verifying
    from pq2verify.golden.store import GoldenIntegrityError
    name = "test_a_stored_tensor_of_another_dtype_or_shape_is_integrity"
    t = torch.arange(12, dtype=torch.bfloat16).reshape(2, 6)
    verifying._whole(t, (2, 6), "bf16", "y")                  # the whole tensor: accepted
    for bad in (t.reshape(3, 4), t.reshape(12), t.view(torch.int16).view(torch.float16)):
        with pytest.raises(GoldenIntegrityError):
            verifying._whole(bad, (2, 6), "bf16", "y")
            pytest.fail(f"{tuple(bad.shape)} {bad.dtype} accepted as [2, 6] bf16; {repro(name)}")


# --- golden: a damaged manifest is refused when loaded ----------------------------------------
def _manifest_dir(tmp_path, **changes):
    """A folder holding only a hand-written format-2 manifest of one case and no tensor files
    (files: {}), with `changes` applied to the manifest (a key set to None is removed)."""
    import json
    from pq2verify import checks
    from pq2verify.golden import store
    case = {k: 0 for k in checks.Case.__dataclass_fields__}
    case.update(id="c0", file="y.safetensors", x="x0", weight="w0", y_sha256="0" * 64)
    man = {"format": 2, "backend_key": "interpreter", "files": {}, "cases": [case], "paths": {}, "weights": {}}
    man.update(changes)
    man = {k: v for k, v in man.items() if v is not None}
    d = tmp_path / "interpreter"
    d.mkdir()
    (d / store.MANIFEST).write_text(json.dumps(man))
    return d


def test_a_case_naming_a_file_its_manifest_does_not_list_is_refused(tmp_path):
    from pq2verify.golden import store
    d = _manifest_dir(tmp_path)
    with pytest.raises(store.GoldenIntegrityError, match="y.safetensors"):
        store.load(d)
        pytest.fail(f"case c0's unlisted file passed load; "
                    f"{repro('test_a_case_naming_a_file_its_manifest_does_not_list_is_refused')}")


@pytest.mark.parametrize("fmt", [0, 3, "2", None])
def test_a_manifest_of_an_unknown_format_is_refused(fmt, tmp_path):
    """Formats 1 and 2 are read; any other (or none) is a manifest this code cannot vouch for."""
    from pq2verify.golden import store
    d = _manifest_dir(tmp_path, format=fmt, files={}, cases=[])
    with pytest.raises(store.GoldenIntegrityError, match="format"):
        store.load(d)
        pytest.fail(f"format {fmt!r} loaded; {repro('test_a_manifest_of_an_unknown_format_is_refused')}")


def test_an_isa_key_the_capture_lacks_is_a_difference():
    """A capture that recorded fewer ISA fields than this machine's key (say, before numpy's
    BLAS core was recorded) does not show the same kernels: the keys differ, naming the field;
    and the other way round."""
    from pq2verify.golden import isakey
    now = {"machine": "x86_64", "cpu": "GenuineIntel", "numpy_blas": "scipy-openblas 0.3.27 core Haswell"}
    old = {k: v for k, v in now.items() if k != "numpy_blas"}
    name = "test_an_isa_key_the_capture_lacks_is_a_difference"
    assert isakey.isa_difference(dict(now), now) == "", repro(name)
    for cap, cur in ((old, now), (now, old)):
        why = isakey.isa_difference(cap, cur)
        assert "numpy_blas" in why, f"captured {cap} vs now {cur}: {why!r}; {repro(name)}"


# --- closed by a second round of planted faults (each names the mutant it kills) -------------
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.bfloat16, torch.float16, torch.float32,
                                   torch.int32, torch.float64, torch.int64], ids=str)
def test_bits_views_every_element_size(dtype):
    """bits() has a same-size integer view for 1-, 2-, 4- and 8-byte elements (packed uint8
    codes, fp16/bf16 outputs, fp32/int32 dots and scales, int64 dots): one element changed in
    the last of 3 positions is one difference, equal copies are none. For a float dtype the
    change is +0.0 -> -0.0 (equal as numbers, not as bits). Kills bits.py `_INT`'s key
    1 -> 2, 4 -> 5 and 8 -> 9 (that element size then has no view)."""
    t = "test_bits_views_every_element_size"
    a = torch.zeros(3, dtype=dtype)
    b = a.clone()
    b[2] = -0.0 if dtype.is_floating_point else 1
    v = bits(a)
    assert v.element_size() == a.element_size() and not v.is_floating_point(), (v.dtype, repro(t))
    assert same_bits(a, a.clone()) and ndiff(a, a.clone()) == 0, repro(t)
    assert not same_bits(a, b) and ndiff(a, b) == 1, (ndiff(a, b), repro(t))


def test_an_error_exactly_at_the_element_bound_passes():
    """|y - Y| equal to the bound is inside it (<= 1, the same as `outside`): int_gemv, K = 384
    (T = 3 groups), S = 0, bf16: F = 5 2^-126 and, |Y| + F lying in [2^-123, 2^-122), half a
    spacing 2^-131 (test_underflow_term_of_the_fold_allowance). y = 0 against Y = F + 2^-131
    is an error of exactly the bound (every term a power of two: exact in float64), ratio 1.0.
    Kills verdicts.py Element.ok `ratio <= 1.0` -> `ratio < 1.0`."""
    t = "test_an_error_exactly_at_the_element_bound_passes"
    p = registry.get("int_gemv")
    ref = np.full((1, 4), 5 * TINY + 2.0 ** -131)
    e = verdicts.element(p, 384, torch.zeros(1, 4, dtype=torch.bfloat16), ref, np.zeros((1, 4)), torch.bfloat16)
    assert e.ratio == 1.0, (e.ratio, repro(t))
    assert e.ok and e.outside == 0 and e.first is None, (e.ok, e.outside, repro(t))


def test_the_bias_t_of_two_samples_is_computed_not_zero():
    """Two bf16 outputs at Y = 1 (spacing 2^-7) off by 0.25 and 0.5 ulp: u = (0.25, 0.5), mean
    0.375, sd (ddof 1) 0.125 sqrt 2, standard error sd / sqrt 2 = 0.125: t = 3.0 for the scale
    (Y > 0, so z = u) and the offset alike. Only fewer than two samples have no t (0.0).
    Kills numerics.py `v.size < 2` -> `v.size <= 2`."""
    t = "test_the_bias_t_of_two_samples_is_computed_not_zero"
    ref = np.array([[1.0, 1.0]])
    y64 = ref + np.array([[0.25, 0.5]]) * 2.0 ** -7
    ts, to = numerics.bias(y64, ref, torch.bfloat16)
    assert ts == pytest.approx(3.0, rel=1e-12) and to == pytest.approx(3.0, rel=1e-12), ((ts, to), repro(t))
    assert numerics.bias(y64[:, :1], ref[:, :1], torch.bfloat16) == (0.0, 0.0), repro(t)


def test_within_bound_names_the_element_closest_to_its_bound_either_sign():
    """fp16, captured [1, 1, 1], recomputed [1, 1 + 2^-10, 1 - 3 2^-11], bound 0.01 each: [0, 0]
    is identical, the other two differ and lie within; |diff| / bound is 0.098 at [0, 1] and
    0.146 at [0, 2] (a diff below the capture): the message names [0, 2]. Kills
    verdicts.py `np.abs(yd - wd) / bound` -> `(yd - wd) / bound` (the signed ratio names
    [0, 1]) and its `np.where(same, 0.0, ...)` -> `1` (an identical element would be named)."""
    t = "test_within_bound_names_the_element_closest_to_its_bound_either_sign"
    want = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float16)
    y = torch.tensor([[1.0, 1.0 + 2.0 ** -10, 1.0 - 3 * 2.0 ** -11]], dtype=torch.float16)
    assert float(y[0, 2]) == 1.0 - 3 * 2.0 ** -11, "precondition: exact in fp16 (spacing 2^-11 below 1)"
    status, detail = verdicts.compare_bound(y, want, np.full((1, 3), 0.01))
    assert status == "within bound", (status, detail, repro(t))
    assert "2 of 3 elements differ" in detail and "closest to its bound at [0, 2]" in detail, (detail, repro(t))


def test_the_element_bound_reason_names_a_scale_only_where_there_is_one():
    """int_gemv's elem_factor is 1: its reason is the integer fold's alone; a copy at factor 2
    appends the scale and its reason. Kills numerics.py `p.elem_factor == 1.0` -> `!=`."""
    t = "test_the_element_bound_reason_names_a_scale_only_where_there_is_one"
    base = registry.get("int_gemv")
    assert base.elem_factor == 1.0, repro(t)
    assert numerics.elem_bound_reason(base) == numerics.FOLD_REASON["integer"], repro(t)
    wide = dataclasses.replace(base, elem_factor=2.0, elem_reason="test: twice")
    assert numerics.elem_bound_reason(wide) == numerics.FOLD_REASON["integer"] + "; scaled by 2.0: test: twice", \
        repro(t)


def test_a_relative_rms_exactly_at_its_tolerance_passes():
    """A relative RMS equal to its tolerance is within it (err <= tol); just above is not, and
    a NaN error never is. Kills verdicts.py `err <= tol` -> `err < tol`."""
    t = "test_a_relative_rms_exactly_at_its_tolerance_passes"
    tol = 2.0 ** -8 + 1e-5
    assert verdicts.Rms("dense", tol, tol, None).ok, repro(t)
    assert not verdicts.Rms("dense", math.nextafter(tol, 1.0), tol, None).ok, repro(t)
    assert not verdicts.Rms("dense", math.nan, tol, None).ok, repro(t)


def test_exact_outputs_have_no_bias():
    """Outputs equal to their references: every error u is 0, so both means are 0 with no
    spread: t = 0 (no evidence either way), not a number the test would read as bias. Kills
    numerics.py `0.0 if m == 0.0` -> `1 if m == 0.0`."""
    t = "test_exact_outputs_have_no_bias"
    ref = np.array([[1.0, -2.0, 0.5, 3.0]])
    assert numerics.bias(ref.copy(), ref, torch.bfloat16) == (0.0, 0.0), repro(t)


def test_dots_of_another_shape_fail_at_the_origin():
    """Group dots of another shape than the exact ones never pass, and the first difference
    reported is (0, 0, 0), as documented. Kills verdicts.dots's `(0, 0, 0)` -> a 1 anywhere."""
    t = "test_dots_of_another_shape_fail_at_the_origin"
    want = np.zeros((2, 3, 4), dtype=np.int64)
    assert verdicts.dots(np.zeros((2, 3, 3), dtype=np.int64), want) == (0, 0, 0), repro(t)
    assert verdicts.dots(want.copy(), want) is None, repro(t)


def test_no_outputs_have_ratio_zero():
    """An empty output (N = 0) has no element outside any bound: ratio 0.0, as documented (no
    output is near its bound). Kills verdicts.py `... if ratio.size else 0.0` -> `1`."""
    t = "test_no_outputs_have_ratio_zero"
    p = registry.get("int_gemv")
    e = verdicts.element(p, 384, torch.zeros(1, 0, dtype=torch.bfloat16), np.zeros((1, 0)), np.zeros((1, 0)),
                         torch.bfloat16)
    assert e.ok and e.ratio == 0.0 and e.outside == 0 and e.size == 0, (e.ratio, repro(t))
