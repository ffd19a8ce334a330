"""Output rounding FP32 -> bf16 / fp16 (kernels.prepare.to_out, the cast every path stores
with) against torch's round-to-nearest-even conversion, bit for bit, on the backend under test:
every exact tie between adjacent values of the output type, one FP32 ulp either side of it,
every representable value itself, subnormals, the overflow threshold, max finite, inf and NaN.
Also reference.metrics.round_once / spacing, which the per-element verdict rounds with."""
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from kernels.common import INTERPRET
from kernels.prepare import to_out
from reference import metrics

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
BLOCK = 4096


@triton.jit
def _cast_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr, INTERP: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(src_ptr + o, mask=o < n)
    tl.store(dst_ptr + o, to_out(v, dst_ptr.dtype.element_ty, INTERP), mask=o < n)


def _cast(v: torch.Tensor, dtype, device) -> torch.Tensor:
    src = v.to("cuda" if device == "cuda" else "cpu")
    dst = torch.empty(src.shape, dtype=dtype, device=src.device)
    _cast_kernel[(triton.cdiv(src.numel(), BLOCK),)](src, dst, src.numel(), BLOCK=BLOCK, INTERP=INTERPRET)
    return dst.cpu()


def _f32(bits) -> torch.Tensor:
    return torch.tensor(np.asarray(bits, dtype=np.uint32).view(np.int32)).view(torch.float32)


def _cases(dtype) -> torch.Tensor:
    """FP32 inputs: every finite value of `dtype`, the midpoint between each pair of adjacent
    ones (exact in FP32: one bit more than the type), one FP32 ulp either side of it; and FP32
    specials: subnormals, max finite, inf, NaN with payloads high and low."""
    every = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).float()
    every = every[torch.isfinite(every)]
    v = torch.sort(torch.unique(every)).values.double()
    mid = ((v[:-1] + v[1:]) / 2).float()
    assert torch.equal(mid.double(), (v[:-1] + v[1:]) / 2), "a midpoint is not exact in FP32"
    big = float(torch.finfo(dtype).max)
    over = big + float(metrics.spacing(big, dtype)) / 2              # rounds to inf (even)
    special = torch.cat([_f32([0x00000001, 0x00007FFF, 0x00008000, 0x00008001, 0x00018000, 0x007FFFFF,
                               0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x80000001, 0x80000000]),
                         torch.tensor([over, -over, big, -big], dtype=torch.float64).float()])
    return torch.cat([every, mid, torch.nextafter(mid, torch.tensor(np.inf)),
                      torch.nextafter(mid, torch.tensor(-np.inf)), special])


def _bits(t):
    return t.view(torch.int16).to(torch.int32) & 0xFFFF


@pytest.mark.parametrize("name", DTYPES)
def test_to_out_rounds_like_torch(name, device):
    dtype = DTYPES[name]
    v = _cases(dtype)
    got, want = _cast(v, dtype, device), v.to(dtype)
    bad = torch.nonzero(_bits(got) != _bits(want)).flatten()
    assert bad.numel() == 0, (f"{name}: {bad.numel()} of {v.numel()} casts differ from torch; first "
                              + ", ".join(f"{float(v[i])!r} (0x{int(v[i:i+1].view(torch.int32)) & 0xFFFFFFFF:08x}) -> "
                                          f"0x{int(_bits(got[i:i+1])):04x}, torch 0x{int(_bits(want[i:i+1])):04x}"
                                          for i in bad[:4].tolist()))


@pytest.mark.parametrize("name", DTYPES)
def test_to_out_keeps_nan(name, device):
    """NaN stays NaN, whatever its payload: torch writes 0x7FC0 (bf16) / 0x7E00 (fp16), PTX's
    cvt writes 0x7FFF, so NaN is compared as NaN, not by bits. A payload only in the low 16 bits
    is the trap: rounding those bits up carries into the exponent (inf) or wraps to zero."""
    dtype = DTYPES[name]
    nans = _f32([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7F80FFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FBFFFFF])
    got = _cast(nans, dtype, device)
    assert torch.isnan(got.float()).all(), f"{name}: NaN became {got.float().tolist()}"


@pytest.mark.parametrize("name", DTYPES)
def test_torch_is_round_to_nearest_even(name):
    """The yardstick itself, against the definition (reference.metrics.round_once, from float64 in
    one step; every FP32 input is exact in float64, so no double rounding here)."""
    dtype = DTYPES[name]
    v = _cases(dtype)
    want = torch.from_numpy(metrics.round_once(v.double().numpy(), dtype)).to(dtype)
    assert torch.equal(_bits(v.to(dtype)), _bits(want))


def test_round_once_is_one_rounding():
    """1 + 2^-8 + 2^-30 is just above a bf16 tie: one rounding goes up; rounding to FP32 first
    lands on the tie and then goes to even (down). round_once must go up."""
    v = np.array([1 + 2 ** -8 + 2 ** -30, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8 + 2 ** -30)])
    assert metrics.round_once(v, torch.bfloat16).tolist() == [1 + 2 ** -7, 1.0, 1 + 2 ** -6, -(1 + 2 ** -7)]
    assert float(torch.tensor(v[0]).float().to(torch.bfloat16)) == 1.0      # torch via FP32: down
    assert metrics.round_once(np.array([65519.99, 65520.0, 2.0 ** -25, 3 * 2.0 ** -25]), torch.float16).tolist() \
        == [65504.0, np.inf, 0.0, 2.0 ** -23]


def test_spacing():
    assert metrics.spacing(np.array([1.0, 1.5, 2.0, 0.0, 2.0 ** -130]), torch.bfloat16).tolist() \
        == [2.0 ** -7, 2.0 ** -7, 2.0 ** -6, 2.0 ** -133, 2.0 ** -133]
    assert metrics.spacing(np.array([1.0, 65504.0, 1e-7]), "float16").tolist() == [2.0 ** -10, 32.0, 2.0 ** -24]
    with pytest.raises(TypeError, match="expected bfloat16, float16 or float32, got int8"):
        metrics.spacing(1.0, torch.int8)


@pytest.mark.gpu
@pytest.mark.parametrize("name", DTYPES)
def test_random_bit_patterns_on_the_gpu(name, device):
    """A million random FP32 bit patterns (every exponent, NaN and inf included) through the
    compiled cast; the interpreter runs the exhaustive tie set above instead."""
    dtype = DTYPES[name]
    g = torch.Generator().manual_seed(11)
    v = torch.randint(-2 ** 31, 2 ** 31 - 1, (1 << 20,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    got, want = _cast(v, dtype, device), v.to(dtype)
    finite = ~torch.isnan(v)
    assert torch.equal(_bits(got)[finite], _bits(want)[finite])
    assert torch.isnan(got.float()[~finite]).all()
