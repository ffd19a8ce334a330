"""Seeded inputs for checks, golden captures and benchmarks, made on the device itself so that
large weights (hundreds of MB) cost no host time. Codes are drawn like real ternary weights:
0, 1, 2 about a third each, never 3 (uniform random bytes would include code 3)."""
import torch

from kernels.format import BLOCK, PQ2Weight, pack_codes

ACTIVATION_KINDS = ("normal", "heavy", "outliers", "zero_groups", "ties")
# Regimes the fuzzer draws besides those; kept out of ACTIVATION_KINDS, whose order the check and
# golden profiles rotate through (their case ids name committed captures). zeros: every value 0;
# tiny: even rows scaled far down (bf16: 2^-64, fp16: 2^-10, near its normal floor), so one call
# mixes magnitudes; subnormal: every third group subnormal in the dtype, plus a few subnormal values.
EXTRA_KINDS = ("zeros", "tiny", "subnormal")
KINDS = ACTIVATION_KINDS + EXTRA_KINDS
_TINY = {torch.bfloat16: 2.0 ** -64, torch.float16: 2.0 ** -10}


def _gen(device, seed: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def ternary_weight(n: int, k: int, seed: int, device="cpu", layout="prepared") -> PQ2Weight:
    if k % BLOCK:
        raise ValueError(f"K={k} is not a multiple of {BLOCK}")
    g = _gen(device, seed)
    codes = torch.randint(0, 3, (n, k), generator=g, device=device, dtype=torch.uint8)
    # fp16 scales spread like real ones: log-normal around 0.02, never zero or subnormal.
    scales = torch.exp(torch.randn(n, k // BLOCK, generator=g, device=device) * 0.5 - 4.0).half()
    flat = torch.cat([pack_codes(codes).reshape(-1), scales.reshape(-1).view(torch.uint8)])
    w = PQ2Weight(flat, n, k, "prepared")
    return w if layout == "prepared" else w.to_raw()


def dense_weight(n: int, k: int, seed: int, device="cpu", dtype=torch.bfloat16) -> torch.Tensor:
    g = _gen(device, seed)
    return (torch.randn(n, k, generator=g, device=device) * k ** -0.5).to(dtype)


def activations(m: int, k: int, seed: int, kind="normal", dtype=torch.bfloat16, device="cpu",
                row_stride: int | None = None) -> torch.Tensor:
    """[M, K] activations; row_stride > K gives a strided view (rows not adjacent)."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
    g = _gen("cpu", seed)
    stride = row_stride or k
    if kind == "heavy":
        # normal over the root of a uniform: a heavy tail with a seeded generator
        base = torch.randn(m, stride, generator=g) / torch.rand(m, stride, generator=g).clamp_min(0.05).sqrt()
    else:
        base = torch.randn(m, stride, generator=g)
    if kind == "outliers":
        cols = torch.randperm(k, generator=g)[: max(1, k // 64)]
        base[:, cols] *= 50.0
    elif kind == "zero_groups":
        for gi in range(0, k // BLOCK, 2):
            base[:, gi * BLOCK:(gi + 1) * BLOCK] = 0.0
    elif kind == "ties":
        base = _ties(m, stride, g)
    elif kind == "zeros":
        base = torch.zeros(m, stride)
    elif kind == "tiny":
        base[0::2] *= _TINY.get(dtype, 2.0 ** -64)
    elif kind == "subnormal":
        base = _subnormal(base, k, g, dtype)
    x = base.to(dtype).to(device)
    return x[:, :k] if stride != k else x


def _ties(m: int, k: int, g: torch.Generator) -> torch.Tensor:
    """Groups with amax 127 (so the fp32 scale is fp32(127*fp32(1/127))) and the other values
    near half-integers, so a/scale lands on or next to .5 and round-half-even decides."""
    v = (torch.randint(-126, 126, (m, k), generator=g).float() + 0.5)
    v.view(m, -1, BLOCK)[:, :, 0] = 127.0
    return v


def _subnormal(base: torch.Tensor, k: int, g: torch.Generator, dtype) -> torch.Tensor:
    """Every third group (from group 1) below the dtype's smallest normal, and one value in 64
    elsewhere too: quantizing, scaling and converting such values must neither flush a row's
    normal values nor make NaN."""
    tiny = torch.finfo(dtype).tiny if dtype in (torch.bfloat16, torch.float16) else 2.0 ** -126
    for gi in range(1, k // BLOCK, 3):
        base[:, gi * BLOCK:(gi + 1) * BLOCK] *= tiny / 8
    cols = torch.randperm(k, generator=g)[: max(1, k // 64)]
    base[:, cols] = base[:, cols].sign() * tiny / 4
    return base
