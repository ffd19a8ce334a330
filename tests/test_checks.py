"""The check engine itself: each check fails on a deliberately broken kernel, with a message
that carries the one-line reproduction, and the CLI exits non-zero."""
import importlib
from dataclasses import replace

import numpy as np
import pytest
import torch

from pq2verify import checks, cli, registry
from reference import metrics

CASE = checks.cases("small", paths=["int_gemv"], ms=[3], dtypes=["bf16"], layouts=["prepared"])[0]


@pytest.fixture
def broken(monkeypatch):
    """Replace int_gemv's run with `make(real_run)`."""
    mod = importlib.import_module("kernels.int_gemv")
    real = mod.run

    def install(make):
        monkeypatch.setattr(mod, "run", make(real))
    return install


def test_case_id_round_trips():
    for c in checks.cases("small")[:40]:
        assert checks.Case.parse(c.id) == c


def test_bad_case_spec_is_a_clear_error():
    with pytest.raises(ValueError, match="expected path:shape=NxK"):
        checks.Case.parse("int_gemv:nonsense")
    with pytest.raises(ValueError, match="unknown path 'no_such_path'"):
        checks.Case.parse(CASE.id.replace("int_gemv", "no_such_path"))


def test_correct_kernel_passes(device):
    r = checks.evaluate(CASE, device)
    assert r.ok, r.message()
    assert r.dots_exact and r.deterministic and r.written


def test_wrong_values_fail_rms_with_a_reproduction(broken, device):
    def make(real):
        def run(x, w, *, out=None, dots=None, check=True):
            y = real(x, w, out=out, dots=dots, check=check)
            return y.mul_(1.01)
        return run
    broken(make)
    r = checks.evaluate(CASE, device, checks=("rms",))
    assert not r.ok
    assert "relative RMS vs quantized FP64 reference" in r.message()
    assert f"reproduce: ./pq2 check --case {CASE.id}" in r.message()
    assert f"seed: {CASE.seed}" in r.message()


def test_unwritten_row_fails(broken, device):
    def make(real):
        def run(x, w, *, out=None, dots=None, check=True):
            y = real(x, w, out=None, dots=dots, check=check)
            out[1:].copy_(y[1:])          # row 0 never written: still NaN
            return out
        return run
    broken(make)
    r = checks.evaluate(CASE, device, checks=("rms",))
    assert "output not written: NaN left in 1 of 3 rows" in r.message()


def test_wrong_group_dot_fails_exact(broken, device):
    def make(real):
        def run(x, w, *, out=None, dots=None, check=True):
            y = real(x, w, out=out, dots=dots, check=check)
            if dots is not None:
                dots[0, 0, 0] += 1
            return y
        return run
    broken(make)
    r = checks.evaluate(CASE, device, checks=("exact",))
    assert "integer group dots differ from the exact reference (first at m=0, n=0, group 0" in r.message()


def test_nondeterministic_kernel_fails(broken, device):
    calls = []

    def make(real):
        def run(x, w, *, out=None, dots=None, check=True):
            y = real(x, w, out=out, dots=dots, check=check)
            calls.append(1)
            if len(calls) == 4:           # one rerun in five flips one value
                y.view(torch.int16)[0, 0] ^= 1
            return y
        return run
    broken(make)
    r = checks.evaluate(CASE, device, checks=("determinism",))
    assert r.deterministic is False and "not deterministic" in r.message()


def test_broken_claim_fails(device, monkeypatch):
    c = checks.cases("small", paths=["mmq_planes"], ms=[17], dtypes=["bf16"], layouts=["prepared"])[0]
    mod = importlib.import_module("kernels.mmq")
    real = mod.run

    def run(x, w, *, out=None, dots=None, check=True):
        y = real(x, w, out=out, dots=dots, check=check)
        y.view(torch.int16)[0, 0] ^= 1          # one ulp off in one element
        return y
    monkeypatch.setattr(mod, "run", run)
    r = checks.evaluate(c, device, checks=("exact",))
    assert r.claim == "bytes == mmq" and r.claim_held is False
    assert "exactness claim 'bytes == mmq' does not hold" in r.message()


def test_cli_exit_codes_and_reproduction_line(broken, capsys):
    assert cli.main(["check", "--case", CASE.id, "--reruns", "1"]) == 0
    assert "PASS: 1 of 1 cases passed" in capsys.readouterr().out

    def make(real):
        def run(x, w, *, out=None, dots=None, check=True):
            return real(x, w, out=out, dots=dots, check=check).mul_(1.05)
        return run
    broken(make)
    assert cli.main(["check", "--case", CASE.id, "--reruns", "1"]) == 1
    text = capsys.readouterr().out
    assert f"reproduce: ./pq2 check --case {CASE.id}" in text and "FAIL: 0 of 1 cases passed" in text


def test_render_saved_results(tmp_path, capsys):
    js = tmp_path / "check.json"
    assert cli.main(["check", "--case", CASE.id, "--reruns", "1", "--json", str(js)]) == 0
    md = tmp_path / "check.md"
    assert cli.main(["check", "--render", str(js), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "**1 of 1 cases passed.**" in text and "| int_gemv |" in text
    assert "| int_gemv | 1 | 1 |" in text                  # the per-path summary row
    # the same run given twice is not one whole run: refused, naming both files
    js2 = tmp_path / "again.json"
    js2.write_text(js.read_text())
    assert cli.main(["check", "--render", str(js2), str(js), "--markdown", str(md)]) == 1
    assert f"the same unsharded run given 2 times: {js2}, {js}" in md.read_text()


def test_kernel_override_replaces_the_path_for_every_call(device):
    """evaluate(kernel=...) runs the given callable for the first call and every rerun; without
    it the registered kernel runs (the real one passes, a broken override fails)."""
    real = checks.registry.get(CASE.path).kernel()
    seen = []

    def wrapped(x, w, *, out=None, dots=None):
        seen.append(1)
        y = real(x, w, out=out, dots=dots)
        return y.mul_(1.01) if len(seen) == 1 else y
    r = checks.evaluate(CASE, device, checks=("rms", "determinism"), reruns=2, kernel=wrapped)
    assert len(seen) == 3 and not r.ok
    assert "relative RMS" in r.message() and r.deterministic is False
    assert checks.evaluate(CASE, device, checks=("rms",)).ok


# --- per-element verdict, tampering with one element ------------------------------------------
MMQ17 = checks.cases("small", paths=["mmq"], ms=[17], dtypes=["bf16"], layouts=["prepared"])[0]
# first, middle, last, and one in the ragged tail: row 16 of M=17 (tiles of 32 rows on the
# interpreter, 64 on a GPU) and column 195 of N=200 (tiles of 256 columns on the interpreter,
# 64 on a GPU: columns 192..199 are the tail)
POSITIONS = {"first": (0, 0), "middle": (8, 100), "last": (16, 199), "tail": (16, 195)}


def _nudge(c, ij, ulps, device, away=True):
    """A kernel= override: the real kernel, then output [i, j] moved by `ulps` ulps away from
    (or toward) the case's FP64 reference."""
    p = registry.get(c.path)
    real = p.kernel()
    inp = checks.Inputs(c, device)
    ref = inp.reference(p.reference)[ij]

    def run(x, w, *, out=None, dots=None):
        y = real(x, w, out=out, dots=dots)
        v = float(y[ij])
        up = (v <= ref) != away                      # which way is away from / toward ref
        step = 1 if (v >= 0) == up else -1           # on the integer view, magnitude up or down
        y.view(torch.int16)[ij] += step * ulps
        return y
    return run, inp


@pytest.mark.parametrize("pos", POSITIONS)
@pytest.mark.parametrize("ulps", (1, 8))
def test_one_element_off_is_caught_by_the_per_element_bound(pos, ulps, device):
    """One output moved by 1 or 8 ulps away from the FP64 reference, at the first, a middle,
    the last element and one in a tail shorter than a tile. The per-element bound catches it
    wherever the fold allowance F is under half a spacing and y is not a power of two stepping
    toward zero (both asserted here: F ~ 1e-6 relative on these inputs, a bf16 spacing ~ 4e-3). The relative RMS, the suite's only numeric verdict
    before, passes all of these: one element in 3400 hardly moves a norm."""
    ij = POSITIONS[pos]
    run, inp = _nudge(MMQ17, ij, ulps, device)
    clean = checks.evaluate(MMQ17, device, checks=("rms",), inp=inp)
    assert clean.ok, clean.message()
    # why detection is certain here: y' = y +- k spacings away from Y, so |y' - Y| >= k * s'
    # with s' >= s unless y is a power of two stepping toward zero; the bound is F + s/2
    p = registry.get("mmq")
    ref = inp.reference("quantized")[ij]
    f = p.fold_allowance(MMQ17.k // 128, checks._abs_sum(p, inp))[ij]
    y = float(checks.call(p, inp)[0][ij])
    assert f < metrics.spacing(abs(ref), torch.bfloat16) / 2 and np.frexp(y)[0] not in (0.5, -0.5)
    r = checks.evaluate(MMQ17, device, checks=("rms",), inp=inp, kernel=run)
    assert not r.ok and "per-element bound: 1 of" in r.message(), r.message()
    assert f"first y[{ij[0]}, {ij[1]}]" in r.message()
    assert r.rel_rms_quantized <= r.tol_quantized          # the hole this verdict closes


@pytest.mark.parametrize("pos", POSITIONS)
def test_one_ulp_toward_the_reference_is_caught_by_bit_identity(pos, device, monkeypatch):
    """A 1-ulp move TOWARD the reference is NOT guaranteed to fail the per-element bound: when
    the FP64 value lies within F of a rounding midpoint, both neighbours are valid roundings of
    an FP32 sum within F of it. What catches any 1-ulp change for certain is bit identity: the
    golden captures and the exactness claims. Here mmq_planes claims bytes == mmq, and mmq
    (its counterpart) is tampered."""
    c = checks.cases("small", paths=["mmq_planes"], ms=[17], dtypes=["bf16"], layouts=["prepared"])[0]
    run, _ = _nudge(replace(c, path="mmq"), POSITIONS[pos], 1, device, away=False)
    monkeypatch.setattr(importlib.import_module("kernels.mmq"), "run",
                        lambda x, w, *, out=None, dots=None, check=True: run(x, w, out=out, dots=dots))
    r = checks.evaluate(c, device, checks=("exact",))
    assert r.claim_held is False and "exactness claim 'bytes == mmq' does not hold" in r.message()


@pytest.mark.parametrize("dtype", ("bf16", "fp16"))
def test_every_element_off_by_1e3_relative_fails(dtype, device):
    """A kernel whose FP32 result is 1e-3 relative too large before the cast to the output
    dtype (emulated from the FP64 reference: the int paths' FP32 sum is not visible from
    outside). Within the relative-RMS tolerance for bf16 (2^-8 + 1e-5); caught by the
    per-element bound wherever it flips a rounding (for bf16 about a quarter of the outputs:
    1e-3 is a quarter of a bf16 spacing)."""
    c = checks.cases("small", paths=["int_gemv"], ms=[3], dtypes=[dtype], layouts=["prepared"])[0]
    inp = checks.Inputs(c, device)
    off = torch.from_numpy(inp.reference("quantized") * (1 + 1e-3))

    def run(x, w, *, out=None, dots=None):
        return out.copy_(off.to(out.dtype))
    r = checks.evaluate(c, device, checks=("rms",), inp=inp, kernel=run)
    assert "per-element bound" in r.message(), r.message()
    if dtype == "bf16":
        assert r.rel_rms_quantized <= r.tol_quantized
    exact = torch.from_numpy(inp.reference("quantized"))
    assert checks.evaluate(c, device, checks=("rms",), inp=inp,
                           kernel=lambda x, w, *, out=None, dots=None: out.copy_(exact.to(out.dtype))).ok


def test_one_fp16_element_off_by_1e3_relative_fails(device):
    """fp16 spacing is 2^-11..2^-10 relative, so 1e-3 moves an output at least one spacing;
    away from the reference that is always outside the bound."""
    c = checks.cases("small", paths=["int_gemv"], ms=[3], dtypes=["fp16"], layouts=["prepared"])[0]
    real = registry.get("int_gemv").kernel()
    inp = checks.Inputs(c, device)
    ref = inp.reference("quantized")[1, 57]

    def run(x, w, *, out=None, dots=None):
        y = real(x, w, out=out, dots=dots)
        v = y[1, 57].float()
        y[1, 57] = v + 1e-3 * v.abs() * (1 if float(v) >= ref else -1)
        return y
    r = checks.evaluate(c, device, checks=("rms",), inp=inp, kernel=run)
    assert "per-element bound: 1 of" in r.message() and "first y[1, 57]" in r.message(), r.message()


def test_an_elem_factor_needs_a_reason():
    for p in registry.PATHS:
        assert p.elem_factor == 1.0 or p.elem_reason, f"{p.name}: elem_factor without elem_reason"
        assert p.elem_bound_reason()


# --- guard bands, batch invariance, NaN propagation -------------------------------------------
def _past(t, offset, value):
    """Write `value` at `offset` elements from t's first element, in t's storage (a store
    outside t's extent, as a missing mask does on a GPU)."""
    torch.as_strided(t, (1,), (1,), t.storage_offset() + offset).fill_(value)


@pytest.mark.parametrize("where,offset", [("after", "end"), ("after", "end+100"), ("before", -1)])
def test_store_outside_out_is_caught(where, offset, device):
    real = registry.get(CASE.path).kernel()

    def run(x, w, *, out=None, dots=None):
        y = real(x, w, out=out, dots=dots)
        at = {"end": y.numel(), "end+100": y.numel() + 100}.get(offset, offset)
        _past(y, at, 0.0)
        return y
    r = checks.evaluate(CASE, device, checks=("rms",), kernel=run)
    assert r.guards_intact is False
    near = {"end": 1, "end+100": 101}.get(offset, 1)
    assert (f"int_gemv: out written outside its extent: 1 of 3200 elements of the guard band {where} it "
            f"changed (nearest {near} element(s) {where} it)") in r.message(), r.message()
    assert checks.evaluate(CASE, device, checks=("rms",)).guards_intact is True


def test_store_past_dots_is_caught(device):
    real = registry.get(CASE.path).kernel()

    def run(x, w, *, out=None, dots=None):
        y = real(x, w, out=out, dots=dots)
        if dots is not None:
            _past(dots, dots.numel() + 5, 7)
        return y
    r = checks.evaluate(CASE, device, checks=("exact",), kernel=run)
    assert "int_gemv: dots written outside its extent: 1 of" in r.message() and "(nearest 6 element(s) after it)" in r.message()


def test_guard_band_covers_a_tile_of_rows():
    # 16 rows of 200 bf16 outputs = 6400 bytes > 4 KiB: a band of 3200 elements (a multiple of 64)
    out, buf, band = checks._guarded((3, 200), torch.bfloat16, "cpu", float("nan"))
    assert band == 3200 and out.is_contiguous() and (out.data_ptr() - buf.data_ptr()) % 128 == 0
    assert buf.numel() == 2 * band + 600 and torch.isnan(out).all()
    assert not checks._band_damage("x", buf, band)


def test_row_depending_on_other_rows_fails_batch_invariance(device):
    """A kernel whose row i reads its last group from row i+1 (rows shifted by one tile edge)."""
    real = registry.get(CASE.path).kernel()

    def run(x, w, *, out=None, dots=None):
        x2 = x.clone()
        x2[:, -128:] = x.roll(-1, 0)[:, -128:]
        return real(x2, w, out=out, dots=dots)
    r = checks.evaluate(CASE, device, checks=("batch",), kernel=run)
    i = CASE.seed % CASE.m
    assert r.batch_invariant is False
    assert (f"not batch invariant: row {i} changed in" in r.message()
            and f"when the other 2 rows were replaced by {CASE.kind} activations of seed {CASE.seed + 1}" in r.message())
    assert checks.evaluate(CASE, device, checks=("batch",)).batch_invariant is True


def _nan_fault(fault):
    real = registry.get(CASE.path).kernel()

    def run(x, w, *, out=None, dots=None):
        bad = torch.isnan(x).any(1)
        y = real(torch.nan_to_num(x) if fault == "nan_to_zero" else x, w, out=out, dots=dots)
        if fault == "inf" and bad.any():
            y[bad] = float("inf")
        if fault == "spread" and bad.any():
            y[~bad] = float("nan")
        return y
    return run


@pytest.mark.parametrize("fault,want", [
    ("nan_to_zero", "outputs of row {i} disagree with the FP64 reference on NaN"),
    ("inf", "outputs of row {i} disagree with the FP64 reference on NaN"),
    ("spread", "changed 2 other row(s)")])
def test_nan_propagation_fault_fails(fault, want, device):
    """A NaN group turned finite, NaN reported as Inf, NaN leaking into other rows."""
    r = checks.evaluate(CASE, device, checks=("nan",), kernel=_nan_fault(fault))
    rng = np.random.default_rng(CASE.seed)
    i, j = int(rng.integers(CASE.m)), int(rng.integers(CASE.k))
    assert r.nan_exact is False and f"NaN propagation: a NaN at x[{i}, {j}]" in r.message()
    assert want.format(i=i) in r.message(), r.message()
    assert checks.evaluate(CASE, device, checks=("nan",)).nan_exact is True


def test_an_input_beyond_the_q8_budget_judges_the_kernel_not_the_input(device):
    """Outlier channels can put the exact Q8 arithmetic itself past registry.Q8_BUDGET against
    the dense reference (this seeded case: 0.033): the dense check then bounds the kernel by the
    exact Q8 error plus its own tolerance, so a correct kernel passes and a 1% error still fails."""
    from kernels import int_gemv
    from pq2verify import cases, checks, registry
    from reference import metrics
    c = cases.Case.parse("int_gemv:forced=16x2048:m1:fp16:prepared:outliers:seed86563")
    inp = checks.Inputs(c, "cpu")      # the seed's values are the CPU generator's (CUDA draws others)
    inp.x, inp.w = inp.x.to(device), inp.w.to(device)
    e_q = metrics.relative_rms(inp.reference("quantized"), inp.reference("dense"))
    assert e_q > registry.Q8_BUDGET
    r = checks.evaluate(c, device, checks=("rms",), inp=inp)
    assert r.ok, r.message()
    assert r.tol_dense > registry.Q8_BUDGET and r.rel_rms_dense <= r.tol_dense

    def off(x, w, **kw):
        return int_gemv.run(x, w, **kw).mul_(1.01)
    bad = checks.evaluate(c, device, checks=("rms",), inp=inp, kernel=off)
    assert not bad.ok and "relative RMS vs quantized" in bad.message()


def test_guard_band_rounds_up_to_whole_64_element_blocks():
    """16 rows of 201 bf16 outputs = 6432 bytes = 3216 elements, not a multiple of 64: the band
    grows to 3264 (51 blocks of 64), never shrinks below a tile of rows."""
    out, buf, band = checks._guarded((3, 201), torch.bfloat16, "cpu", float("nan"))
    assert band == 3264, band
    assert (out.data_ptr() - buf.data_ptr()) % 128 == 0 and buf.numel() == 2 * band + 603


def test_batch_invariance_is_checked_from_two_rows(device):
    """M = 2 already has another row to replace: a kernel whose checked row i reads the other
    row (column 5 of its output only) fails there, and the message names that column."""
    c = checks.cases("small", paths=["int_gemv"], ms=[2], dtypes=["bf16"], layouts=["prepared"])[0]
    real = registry.get(c.path).kernel()
    i = c.seed % c.m

    def run(x, w, *, out=None, dots=None):
        y = real(x, w, out=out, dots=dots)
        y[i, 5] = y[i, 5] + x[1 - i, 0].to(y.dtype) * 4
        return y
    r = checks.evaluate(c, device, checks=("batch",), kernel=run)
    assert r.batch_invariant is False and f"row {i} changed in 1 of" in r.message() \
        and "first at n=5:" in r.message(), r.message()
    assert checks.evaluate(c, device, checks=("batch",)).batch_invariant is True


def test_determinism_reruns_five_times_by_default(device):
    """Reruns: five by default. A kernel that drifts by one ulp on its fifth call after the first
    is caught with the default and not with reruns=3."""
    real = registry.get(CASE.path).kernel()
    calls = {"n": 0}

    def run(x, w, *, out=None, dots=None):
        y = real(x, w, out=out, dots=dots)
        calls["n"] += 1
        if calls["n"] == 6:
            y.view(torch.int16)[0, 0] += 1
        return y
    r = checks.evaluate(CASE, device, checks=("determinism",), kernel=run)
    assert "not deterministic: 5 reruns" in r.message(), r.message()
    calls["n"] = 0
    assert checks.evaluate(CASE, device, checks=("determinism",), reruns=3, kernel=run).ok


def test_a_nan_row_missing_one_nan_is_named_at_that_column(device):
    """x gets one NaN in row i: the dense reference's row i is NaN everywhere, so a kernel that
    writes 0 at one column of that row fails, naming the column."""
    real = registry.get(CASE.path).kernel()
    col = int(checks.Inputs(checks.resolve(CASE), device).rows[1])

    def run(x, w, *, out=None, dots=None):
        y = real(x, w, out=out, dots=dots)
        bad = torch.isnan(x).any(1)
        if bad.any():
            y[bad.nonzero()[0, 0], col] = 0
        return y
    r = checks.evaluate(CASE, device, checks=("nan",), kernel=run)
    assert r.nan_exact is False and "1 of" in r.message() and f"first n={col}: 0.0" in r.message(), r.message()


def test_the_declared_fold_check_takes_a_prepared_only_path_as_it_is(device):
    """mmq_wgmma serves the prepared layout alone: its declared-fold check runs on prepared
    weights and passes (its twin on the interpreter keeps mmq's order)."""
    if device == "cuda":
        pytest.skip("the declared-fold check runs on the interpreter")
    c = checks.cases("small", paths=["mmq_wgmma"], ms=[17], dtypes=["bf16"], layouts=["prepared"])[0]
    r = checks.evaluate(c, device, checks=("fold",))
    assert r.fold_exact is True, r.message()


def test_the_declared_fold_message_names_the_first_differing_output(device):
    """Two outputs changed, the later one in the earlier row: the count is 2 and the first one
    named is row-major first, with the kernel's value against the unchanged one."""
    if device == "cuda":
        pytest.skip("the declared-fold check runs on the interpreter")
    real = importlib.import_module("kernels.int_gemv").run
    seen = {}

    def run(x, w, *, out=None, dots=None):
        y = real(x, w, out=out, dots=dots)
        seen.update(orig=float(y[0, 70]), n=y.numel())
        y[2, 5] = y[2, 5] + 1.0
        y[0, 70] = y[0, 70] * 2.0 + 1.0
        seen["new"] = float(y[0, 70])
        return y
    assert checks.evaluate(CASE, device, checks=("fold",)).fold_exact is True   # the unchanged kernel's order
    r = checks.evaluate(CASE, device, checks=("fold",), kernel=run)
    msg = r.message()
    assert r.fold_exact is False and f"declared fold: 2 of {seen['n']} outputs differ" in msg, msg
    assert f"first y[0, 70] = {seen['new']!r} vs {seen['orig']!r}" in msg, msg


def test_inputs_of_another_path_are_judged_as_the_case_asked(device):
    """Inputs built for one path's case serve another path's case of the same data: the result
    is the asked case's, run by its own path (the inputs' case is not taken over)."""
    other = replace(CASE, path="small_mma")
    inp = checks.Inputs(CASE, device)
    r = checks.evaluate(other, device, checks=("rms",), inp=inp)
    assert r.case == other and r.ok, r.message()


def test_the_declared_fold_is_the_interpreters_own(device):
    """gemv at M = 1 folds in another order on the interpreter (2 lanes, 2 splits) than on a GPU
    (8 lanes, 1 split): the check emulates the interpreter's order, so the unchanged kernel
    passes, and a changed output's message names that order, not the GPU's."""
    if device == "cuda":
        pytest.skip("the declared-fold check runs on the interpreter")
    c = checks.cases("small", paths=["gemv"], ms=[1], dtypes=["bf16"], layouts=["prepared"])[0]
    p = registry.get("gemv")
    mine, gpu = (p.fold(checks.FOLD_N, checks.FOLD_K, 1, interpret=i) for i in (True, False))
    assert mine != gpu, "precondition: the two orders differ at the fold check's shape"
    assert checks.evaluate(c, device, checks=("fold",)).fold_exact is True
    real = importlib.import_module("kernels.gemv").run

    def run(x, w, **kw):
        y = real(x, w, **kw)
        y[0, 3] = y[0, 3] * 2.0 + 1.0
        return y
    msg = checks.evaluate(c, device, checks=("fold",), kernel=run).message()
    assert f"declared FP32 order {mine}" in msg and f"{gpu}" not in msg, msg
