"""The bad-input contract (kernels.validate): every public entry point (pq2_matmul, the kernel
wrappers through validate.kernel_args, PQ2Weight loading, the FP64 reference, the CLI) answers
bad input with an exception that names the argument and what was expected, before any kernel
runs. One test per case, each asserting the exception type and message. Also the NaN/Inf
policy: a non-finite activation makes its output row non-finite on every path, never finite."""
import dataclasses

import numpy as np
import pytest
import torch

from kernels import backend, dispatch, validate
from kernels.dispatch import pq2_matmul
from kernels.format import PQ2FormatError, PQ2Weight
from pq2verify import cli, graphs, registry
from pq2verify.inputs import activations, dense_weight, ternary_weight

BF = torch.bfloat16
DEV = "cuda" if backend.device() == "cuda" else "cpu"


def _w(n=8, k=128, layout="prepared", seed=1):
    return ternary_weight(n, k, seed, device=DEV, layout=layout)


def _wb(w=None):
    """A weight as the FP64 reference takes it: its bytes and layout facts."""
    w = _w() if w is None else w
    return dict(weight=w.data, layout=w.layout, n=w.n, k=w.k)


def _x(m=2, k=128, dtype=BF):
    return activations(m, k, 3, dtype=dtype, device=DEV)


@pytest.fixture
def no_launch(monkeypatch):
    """Fails the test if any kernel is reached: errors must come before a launch."""
    def boom(self):
        raise AssertionError(f"kernel {self.name} was reached")
    monkeypatch.setattr(registry.Path, "kernel", boom)


def _with_code3(layout):
    w = _w(layout=layout)
    data = w.data.clone()
    if layout == "raw":
        data.view(8, 1, 34)[3, 0, 2 + 5] = 0b11 << 4      # row 3, block 0, byte 5: code 3
    else:
        data[3 * 32 + 5] = 0b11 << 4
    return data


# --- pq2_matmul: activations -------------------------------------------------------------
def test_x_not_a_tensor(no_launch):
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor, got list$"):
        pq2_matmul([[1.0] * 128], _w())


def test_x_float32(no_launch):
    with pytest.raises(TypeError, match=r"^x: expected dtype bfloat16 or float16, got float32$"):
        pq2_matmul(torch.zeros(2, 128), _w())


def test_x_integer(no_launch):
    with pytest.raises(TypeError, match=r"^x: expected dtype bfloat16 or float16, got int8$"):
        pq2_matmul(torch.zeros(2, 128, dtype=torch.int8), _w())


def test_x_scalar(no_launch):
    with pytest.raises(ValueError, match=r"^x: expected shape \[\.\.\., K\], got a scalar"):
        pq2_matmul(torch.tensor(1.0, dtype=BF), _w())


def test_k_not_a_multiple_of_128(no_launch):
    with pytest.raises(ValueError, match=r"^x: K=100 is not a multiple of 128"):
        pq2_matmul(torch.zeros(2, 100, dtype=BF), _w())


def test_k_does_not_match_the_weight(no_launch):
    with pytest.raises(ValueError, match=r"^x: last dimension K=256 does not match the weight's K=128$"):
        pq2_matmul(_x(k=256), _w())


def test_x_on_another_device(no_launch):
    with pytest.raises(ValueError, match=r"^x: on meta but the weight is on (cpu|cuda:0); move one of them$"):
        pq2_matmul(torch.zeros(2, 128, dtype=BF, device="meta"), _w())


# --- pq2_matmul: weights -----------------------------------------------------------------
def test_w_wrong_type(no_launch):
    with pytest.raises(TypeError, match=r"^w: expected a PQ2Weight or a dense torch.Tensor, got ndarray$"):
        pq2_matmul(_x(), np.zeros((8, 34), np.uint8))


def test_dense_w_wrong_rank(no_launch):
    with pytest.raises(ValueError, match=r"^w: a dense weight must be \[N, K\] \(rank 2\), got rank 3$"):
        pq2_matmul(_x(), torch.zeros(1, 8, 128, dtype=BF))


def test_dense_w_wrong_dtype(no_launch):
    with pytest.raises(TypeError, match=r"^w: dense weight dtype float16 differs from x dtype bfloat16$"):
        pq2_matmul(_x(), torch.zeros(8, 128, dtype=torch.float16))


def test_misaligned_weight_is_refused(no_launch):
    w = _w()
    buf = torch.zeros(w.nbytes + 1, dtype=torch.uint8, device=DEV)
    buf[1:].copy_(w.data)
    built = PQ2Weight(buf[1:], w.n, w.k, "prepared")   # built by hand: copied once, aligned
    assert built.data.data_ptr() % 16 == 0 and torch.equal(built.data, w.data)
    odd = PQ2Weight(w.data.clone(), w.n, w.k, "prepared")
    odd.data = buf[1:]                                   # bytes swapped in afterwards: refused
    with pytest.raises(ValueError, match=r"^w: data at address 0x[0-9a-f]+ is not 16-byte aligned; load it with "
                                         r"PQ2Weight.from_raw/from_prepared"):
        pq2_matmul(_x(), odd)


def test_misaligned_weight_is_copied_at_load():
    w = _w()
    buf = torch.zeros(w.nbytes + 1, dtype=torch.uint8, device=DEV)
    buf[1:].copy_(w.data)
    loaded = PQ2Weight.from_prepared(buf[1:], w.n, w.k)
    assert loaded.data.data_ptr() % 16 == 0 and torch.equal(loaded.data, w.data)
    x = _x()
    assert graphs.same_bits(pq2_matmul(x, loaded), pq2_matmul(x, w))


def test_code3_is_rejected_at_load_raw():
    with pytest.raises(PQ2FormatError, match=r"^weight: code 3 in row 3, block 0 \(byte 5 of the block\)"):
        PQ2Weight.from_raw(_with_code3("raw").view(8, 34))


def test_code3_is_rejected_at_load_prepared():
    with pytest.raises(PQ2FormatError, match=r"^weight: code 3 in row 3, block 0 \(byte 5 of the block\)"):
        PQ2Weight.from_prepared(_with_code3("prepared"), 8, 128)


def test_code3_in_a_hand_built_weight_is_rejected_once_not_per_call(monkeypatch):
    """A weight built without validation (PQ2Weight(...), kernels.prepare.raw_to_prepared) is
    checked at its first call, once; later calls do not read the weight again."""
    bad = PQ2Weight(_with_code3("prepared"), 8, 128, "prepared")
    with pytest.raises(PQ2FormatError, match=r"^weight: code 3 in row 3, block 0"):
        pq2_matmul(_x(), bad)
    good = _w()
    calls = []
    orig = PQ2Weight.validate
    monkeypatch.setattr(PQ2Weight, "validate", lambda self: (calls.append(1), orig(self)))
    pq2_matmul(_x(), good)
    pq2_matmul(_x(), good)
    assert len(calls) == 1


def test_raw_bytes_not_a_multiple_of_34():
    with pytest.raises(PQ2FormatError, match=r"^weight: row of 100 bytes is not a multiple of 34"):
        PQ2Weight.from_raw(torch.zeros(8, 100, dtype=torch.uint8))


def test_raw_weight_wrong_dtype():
    with pytest.raises(PQ2FormatError, match=r"^weight: expected dtype uint8, got torch.int8$"):
        PQ2Weight.from_raw(torch.zeros(8, 34, dtype=torch.int8))


def test_raw_weight_wrong_rank():
    with pytest.raises(PQ2FormatError, match=r"^weight: expected a raw matrix \[N, K/128\*34\] \(rank 2\), got rank 1$"):
        PQ2Weight.from_raw(torch.zeros(34, dtype=torch.uint8))


def test_raw_weight_not_a_tensor():
    with pytest.raises(TypeError, match=r"^weight: expected a torch.Tensor of uint8, got ndarray$"):
        PQ2Weight.from_raw(np.zeros((8, 34), np.uint8))


def test_prepared_k_not_a_multiple_of_128():
    with pytest.raises(PQ2FormatError, match=r"^weight: K=100 is not a positive multiple of 128$"):
        PQ2Weight.from_prepared(torch.zeros(8 * 34, dtype=torch.uint8), 8, 100)


def test_prepared_wrong_byte_count():
    with pytest.raises(PQ2FormatError, match=r"^weight: prepared buffer must be flat with N\*K/128\*34 = 272 bytes"):
        PQ2Weight.from_prepared(torch.zeros(270, dtype=torch.uint8), 8, 128)


def test_hand_built_weight_wrong_byte_count():
    with pytest.raises(PQ2FormatError, match=r"^weight: 270 bytes, expected N\*K/128\*34 = 272 for N=8, K=128$"):
        PQ2Weight(torch.zeros(270, dtype=torch.uint8), 8, 128, "prepared")


def test_non_finite_scale():
    data = _w(layout="raw").data.clone()
    data.view(8, 1, 34)[2, 0, :2].copy_(torch.tensor([float("inf")], dtype=torch.float16).view(torch.uint8))
    with pytest.raises(PQ2FormatError, match=r"^weight: non-finite fp16 scale in row 2, block 0$"):
        PQ2Weight.from_raw(data)


# --- pq2_matmul: strides, alignment, M = 0, forced paths ------------------------------------
def test_x_strided_along_k_is_copied():
    x = _x(k=256)
    y = pq2_matmul(x[:, ::2], _w())
    assert graphs.same_bits(y, pq2_matmul(x[:, ::2].contiguous(), _w()))


@pytest.mark.parametrize("m", (1, 2, 17))
def test_x_misaligned_is_read_correctly(m):
    """x one element past an aligned address: Triton specializes on alignment, never assumes it."""
    x = _x(m=m)
    buf = torch.empty(x.numel() + 1, dtype=BF, device=DEV)
    buf[1:].copy_(x.reshape(-1))
    odd = buf[1:].view(m, 128)
    assert odd.data_ptr() % 16 != 0
    assert graphs.same_bits(pq2_matmul(odd, _w(n=32)), pq2_matmul(x, _w(n=32)))


def test_m_zero_is_an_empty_result(no_launch):
    assert pq2_matmul(torch.zeros(0, 128, dtype=BF, device=DEV), _w()).shape == (0, 8)
    assert pq2_matmul(torch.zeros(2, 0, 128, dtype=BF, device=DEV), _w()).shape == (2, 0, 8)
    assert pq2_matmul(torch.zeros(0, 128, dtype=BF, device=DEV), _w(), path="mmq").shape == (0, 8)


def test_forced_path_m_outside_its_range(no_launch):
    with pytest.raises(ValueError, match=r"^path='small_mma' serves M in 2-16, got M=17$"):
        pq2_matmul(_x(m=17), _w(), path="small_mma")


def test_forced_path_wrong_weight_kind(no_launch):
    with pytest.raises(TypeError, match=r"^path='small_gemm': takes dense weights, got a pq2 weight$"):
        pq2_matmul(_x(), _w(), path="small_gemm")


def test_forced_path_stricter_k_multiple(no_launch, monkeypatch):
    monkeypatch.setitem(registry.BY_NAME, "single", dataclasses.replace(registry.get("single"), k_multiple=256))
    with pytest.raises(ValueError, match=r"^path='single' needs K a multiple of 256, got K=384$"):
        pq2_matmul(_x(m=1, k=384), _w(k=384), path="single")


def test_forced_path_dtype(no_launch, monkeypatch):
    monkeypatch.setitem(registry.BY_NAME, "single", dataclasses.replace(registry.get("single"), dtypes=(BF,)))
    with pytest.raises(TypeError, match=r"^path='single': x dtype float16 is not one of bfloat16$"):
        pq2_matmul(_x(m=1, dtype=torch.float16), _w(), path="single")


def test_forced_path_layout(no_launch, monkeypatch):
    monkeypatch.setitem(registry.BY_NAME, "single", dataclasses.replace(registry.get("single"), layouts=("prepared",)))
    with pytest.raises(ValueError, match=r"^path='single': weight layout 'raw' is not one of \('prepared',\)$"):
        pq2_matmul(_x(m=1), _w(layout="raw"), path="single")


def test_unknown_path(no_launch):
    with pytest.raises(ValueError, match=r"^unknown path 'fast'; known paths: native, "):
        pq2_matmul(_x(), _w(), path="fast")


def test_unknown_kernel_set(no_launch):
    with pytest.raises(ValueError, match=r"^kernels='fast': unknown kernel set; expected one of legacy, exact, tuned$"):
        pq2_matmul(_x(), _w(), kernels="fast")


# --- kernel wrappers, through the shared helper -------------------------------------------
def test_wrapper_x_rank3():
    with pytest.raises(ValueError, match=r"^x: expected a matrix \[M, K\] \(rank 2\), got rank 3"):
        validate.kernel_args("single", torch.zeros(1, 1, 128, dtype=BF, device=DEV), _w())


def test_wrapper_x_strided_along_k_is_refused():
    with pytest.raises(ValueError, match=r"^x: small_mma needs unit stride along K, got strides \(256, 2\)"):
        validate.kernel_args("small_mma", _x(k=256)[:, ::2], _w())


def test_wrapper_m_outside_its_range():
    with pytest.raises(ValueError, match=r"^small_mma serves M in 2-16, got M=17$"):
        validate.kernel_args("small_mma", _x(m=17), _w())


def test_wrapper_dense_path_given_a_pq2_weight():
    with pytest.raises(TypeError, match=r"^w: this path takes a dense \[N, K\] matrix, got a PQ2Weight$"):
        validate.kernel_args("small_gemm", _x(), _w())


def test_wrapper_pq2_path_given_a_dense_weight():
    with pytest.raises(TypeError, match=r"^w: this path takes a PQ2Weight, got a dense tensor$"):
        validate.kernel_args("single", _x(m=1), torch.zeros(8, 128, dtype=BF, device=DEV))


def test_wrapper_out_wrong_shape():
    with pytest.raises(ValueError, match=r"^out: expected shape \(2, 8\) = \[M, N\], got \(2, 9\)$"):
        validate.kernel_args("int_gemv", _x(), _w(), out=torch.empty(2, 9, dtype=BF, device=DEV))


def test_wrapper_out_wrong_dtype():
    with pytest.raises(TypeError, match=r"^out: expected dtype bfloat16 \(x's\), got float32$"):
        validate.kernel_args("int_gemv", _x(), _w(), out=torch.empty(2, 8, device=DEV))


def test_wrapper_out_strided():
    with pytest.raises(ValueError, match=r"^out: needs unit stride along N, got strides \(1, 2\)$"):
        validate.kernel_args("int_gemv", _x(), _w(), out=torch.empty(8, 2, dtype=BF, device=DEV).t())


def test_wrapper_dots_on_a_floating_path():
    with pytest.raises(ValueError, match=r"^dots: this path is floating and has no integer group dots"):
        validate.kernel_args("native", _x(), _w(), dots=torch.empty(2, 8, 1, dtype=torch.int32, device=DEV))


def test_wrapper_dots_wrong_shape():
    with pytest.raises(ValueError, match=r"^dots: expected shape \(2, 8, 1\) = \[M, N, K/128\], got \(2, 8, 2\)$"):
        validate.kernel_args("int_gemv", _x(), _w(), dots=torch.empty(2, 8, 2, dtype=torch.int32, device=DEV))


def test_wrapper_dots_wrong_dtype():
    with pytest.raises(TypeError, match=r"^dots: expected an int32 tensor, got torch.int64$"):
        validate.kernel_args("int_gemv", _x(), _w(), dots=torch.empty(2, 8, 1, dtype=torch.int64, device=DEV))


def test_wrapper_good_arguments_pass():
    for p in registry.PATHS:
        m = 17 if p.m_min > 16 else p.m_min
        w = dense_weight(8, 128, 1, DEV) if p.weight == "dense" else _w()
        out = torch.empty(m, 8, dtype=BF, device=DEV)
        validate.kernel_args(p.name, _x(m=m), w, out=out)


def _wrapper_bad_calls():
    """(path, what, (x, w, out), exception, message) that each path's own run() must refuse:
    every registry path, so a wrapper that skips validate.kernel_out fails here."""
    for p in registry.PATHS:
        m = 17 if p.m_min > 16 else p.m_min
        dense = p.weight == "dense"
        w = dense_weight(8, 128, 1, DEV) if dense else _w(layout=p.layouts[-1])
        yield p.name, "x float32", (torch.zeros(m, 128, device=DEV), w, None), TypeError, r"^x: expected dtype"
        yield p.name, "x K", (_x(m=m, k=256), w, None), ValueError, r"^x: last dimension K=256 does not match"
        yield p.name, "out shape", (_x(m=m), w, torch.empty(m, 9, dtype=BF, device=DEV)), ValueError, r"^out: expected shape"
        bad_m = p.m_max + 1 if p.m_max else p.m_min - 1
        if bad_m >= 1:
            yield p.name, f"M={bad_m}", (_x(m=bad_m), w, None), ValueError, rf"^{p.name} serves M in .*, got M={bad_m}$"
        if not dense:
            bad = PQ2Weight(_with_code3("prepared"), 8, 128, "prepared")
            yield p.name, "code 3", (_x(m=m), bad, None), PQ2FormatError, r"^weight: code 3 in row 3"


@pytest.mark.parametrize("name,what,args,exc,msg", [pytest.param(*c, id=f"{c[0]}-{c[1]}") for c in _wrapper_bad_calls()])
def test_every_path_wrapper_refuses_bad_input(name, what, args, exc, msg):
    x, w, out = args
    with pytest.raises(exc, match=msg):
        registry.get(name).kernel()(x, w, out=out)


# --- the FP64 reference ------------------------------------------------------------------
def test_reference_refuses_nan_activations():
    from reference import projection
    x = _x()
    x[1, 7] = float("nan")
    with pytest.raises(ValueError, match=r"^activations: non-finite value nan at row 1, group 0"):
        projection.quantized(x, **_wb())


def test_reference_x_wrong_rank():
    from reference import projection
    with pytest.raises(ValueError, match=r"^activations: expected a matrix \[M, K\] \(rank 2\), got rank 3$"):
        projection.quantized(torch.zeros(1, 2, 128, dtype=BF), **_wb())


def test_reference_x_integer():
    from reference import projection
    with pytest.raises(TypeError, match=r"^activations: expected a float dtype \(bf16, fp16, fp32\), got int8$"):
        projection.quantized(torch.zeros(2, 128, dtype=torch.int8), **_wb())


def test_reference_k_mismatch():
    from reference import projection
    with pytest.raises(ValueError, match=r"^x: K=256 does not match the weight's K=128$"):
        projection.floating(_x(k=256), **_wb())


def test_reference_code3():
    from reference import projection
    with pytest.raises(projection.pq2.PQ2FormatError, match=r"^weight: code 3 at row 3, block 0"):
        projection.quantized(_x(), _with_code3("raw").view(8, 34))


def test_reference_dense_propagates_nan():
    from reference import projection
    x = _x()
    x[1, 7] = float("nan")
    y = projection.floating(x, **_wb())
    assert np.isnan(y[1]).all() and np.isfinite(y[0]).all()


# --- the CLI -----------------------------------------------------------------------------
def test_cli_cuda_without_a_gpu(capsys, device):
    if device == "cuda":
        pytest.skip("this machine has a GPU")
    assert cli.main(["--device", "cuda", "golden", "verify"]) == 2
    assert "device: cuda was asked for but torch sees no CUDA GPU" in capsys.readouterr().err


def test_cli_unknown_kernel_set(capsys):
    assert cli.main(["golden", "capture", "--kernels", "fast", "--out", "/nonexistent"]) == 2
    assert "--kernels 'fast': unknown kernel set; expected one of legacy, exact, tuned" in capsys.readouterr().err


def test_cli_unknown_path(capsys):
    assert cli.main(["golden", "verify", "--paths", "nosuch"]) == 2
    assert "--paths: unknown 'nosuch'" in capsys.readouterr().err


def test_cli_bad_choice_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--device", "tpu", "golden", "verify"])
    assert e.value.code == 2 and "argument --device: invalid choice: 'tpu'" in capsys.readouterr().err


# --- Inf activations: affected rows non-finite, the others unchanged --------------------------
# NaN has one rule, the check engine's (checks._nan: NaN exactly where the FP64 reference is,
# other rows' bits kept), run per path by tests/test_paths.py (the `nan` cases).
def _nan_cases():
    for p in registry.PATHS:
        for bad in ("inf", "-inf"):
            yield pytest.param(p.name, bad, id=f"{p.name}-{bad}")


@pytest.mark.parametrize("name,bad", list(_nan_cases()))
def test_non_finite_activation_row_is_non_finite(name, bad, device):
    """An Inf in one activation of row r: every output of row r is non-finite, the other rows
    are bit-identical to the call without it. (Q8 must propagate it, e.g. through the group's
    scale: a kernel that maps Inf to a finite code and scale returns a plausible wrong row.)"""
    p = registry.get(name)
    dev = "cuda" if device == "cuda" else "cpu"
    m = 17 if p.m_min > 16 else min(3, p.m_max or 3)   # rows on both sides of r where the path serves them
    n, k = 32, 256
    x, w = graphs.make_inputs(p, m, n, k, seed=5, device=dev)
    f = graphs.kernel_fn(p)
    clean = f(x, w)
    r = m // 2
    x[r, 130] = float(bad)                 # group 1 of row r
    y = f(x, w)
    finite = torch.isfinite(y[r])
    assert not bool(finite.any()), (f"{name}: {bad} in x[{r}, 130] left {int(finite.sum())} of {n} outputs of row "
                                    f"{r} finite, e.g. {y[r][finite][:3].tolist()}")
    others = [i for i in range(m) if i != r]
    assert graphs.same_bits(y[others], clean[others]), f"{name}: {bad} in row {r} changed other rows"


@pytest.mark.parametrize("kset", registry.KERNEL_SETS)
def test_non_finite_activation_through_pq2_matmul(kset, device):
    dev = "cuda" if device == "cuda" else "cpu"
    from reference import projection
    x, w = graphs.make_inputs("native", 2, 32, 256, seed=6, device=dev)
    x[1, 3] = float("nan")
    y = pq2_matmul(x, w, kernels=kset)
    # the engine's rule: NaN exactly where the FP64 reference of the row is NaN
    want = np.isnan(projection.floating(x[1:2].cpu(), **_wb(w.to("cpu")))[0])
    got = torch.isnan(y[1]).cpu().numpy()
    assert (got == want).all(), (f"pq2_matmul[{kset}] (served by {dispatch.resolve(2, w, x, kset).name}): a NaN in "
                                 f"row 1 gave NaN at {int(got.sum())} of 32 outputs, the FP64 reference at "
                                 f"{int(want.sum())}")
    assert bool(torch.isfinite(y[0]).all()), f"pq2_matmul[{kset}]: a NaN in row 1 made row 0 non-finite"


# --- code 3 in every 2-bit field of a byte, at the edges of blocks and rows ----------------
C3_N, C3_K = 5, 384                       # 3 blocks per row
C3_SPOTS = [(row, blk, byte) for row in (0, C3_N - 1) for blk in (0, 2) for byte in (0, 15, 31)]


def _code3_at(layout, row, blk, byte, s):
    """A valid weight with field s of code byte `byte` of block `blk` of `row` set to 3 (the
    byte's other three fields keep their valid codes)."""
    w = ternary_weight(C3_N, C3_K, 4, device=DEV, layout=layout)
    data = w.data.clone()
    if layout == "raw":
        at = data.view(C3_N, 3, 34)[row, blk, 2:]
    else:
        at = data[: C3_N * C3_K // 4].view(C3_N, 3, 32)[row, blk]
    assert (int(at[byte]) >> 2 * s) & 3 != 3
    at[byte] |= 3 << 2 * s
    return data


@pytest.mark.parametrize("layout", ("raw", "prepared"))
@pytest.mark.parametrize("s", range(4))
def test_code3_in_every_field_is_rejected_at_load(layout, s):
    for row, blk, byte in C3_SPOTS:
        data = _code3_at(layout, row, blk, byte, s)
        want = rf"^weight: code 3 in row {row}, block {blk} \(byte {byte} of the block\)"
        with pytest.raises(PQ2FormatError, match=want):
            if layout == "raw":
                PQ2Weight.from_raw(data)
            else:
                PQ2Weight.from_prepared(data, C3_N, C3_K)


@pytest.mark.parametrize("layout", ("raw", "prepared"))
@pytest.mark.parametrize("s", range(4))
def test_code3_in_every_field_is_rejected_by_the_reference(layout, s):
    from reference import pq2
    for row, blk, byte in C3_SPOTS:
        data = _code3_at(layout, row, blk, byte, s)
        want = rf"^weight: code 3 at row {row}, block {blk} \(weight {4 * byte + s} of the block\)"
        with pytest.raises(pq2.PQ2FormatError, match=want):
            pq2.validate(data, layout=layout, n=None if layout == "raw" else C3_N, k=None if layout == "raw" else C3_K)
    w = ternary_weight(C3_N, C3_K, 4, device=DEV, layout=layout)
    assert pq2.validate(w.data, layout=layout, n=w.n, k=w.k) == (C3_N, C3_K)
