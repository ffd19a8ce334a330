"""Balanced-ternary conversion: digits reconstruct n exactly; ternary weights are lossless."""
import numpy as np
import pytest
import torch

from kernels.format import PQ2Weight
from pq2verify.gsm8k import convert


@pytest.mark.parametrize("digits", [1, 2, 3, 4, 5])
def test_digits_reconstruct_every_n(digits):
    half = (3 ** digits - 1) // 2
    n = torch.arange(-half, half + 1)
    d = convert.balanced_ternary(n, digits)
    assert set(d.unique().tolist()) <= {-1, 0, 1}
    pow3 = torch.tensor([3 ** t for t in range(digits)]).view(-1, 1)
    assert torch.equal((d.long() * pow3).sum(0), n)


def test_too_many_digits_needed():
    with pytest.raises(ValueError):
        convert.balanced_ternary(torch.tensor([5]), 1)


def _decode(w: PQ2Weight) -> torch.Tensor:
    from reference import pq2
    return torch.from_numpy(pq2.decode(w.data, layout=w.layout, n=w.n, k=w.k))


def test_stacked_digits_sum_to_reconstruction():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(24, 200, generator=g), torch.randn(8, 200, generator=g)
    w, st = convert.convert([a, b], 3)
    assert (w.n, w.k) == (32, 3 * 256)                         # digits along K, each padded 200 -> 256
    dec = _decode(w).view(32, 3, 256)
    _, _, rec_a = convert.quantize_digits(a, 3)
    _, _, rec_b = convert.quantize_digits(b, 3)
    assert torch.allclose(dec.sum(1)[:, :200].float(), torch.cat([rec_a, rec_b]), atol=1e-6)   # the T digits add up
    assert torch.count_nonzero(dec[:, :, 200:]) == 0            # padding is zero weights
    rel = (st["sq_err"] / st["sq_ref"]) ** 0.5
    assert 0 < rel < 0.1


def test_more_digits_more_fidelity():
    w = torch.randn(16, 256, generator=torch.Generator().manual_seed(2))
    rels = [convert.convert([w], t)[1] for t in (2, 3, 4, 5)]
    rels = [(s["sq_err"] / s["sq_ref"]) ** 0.5 for s in rels]
    assert rels == sorted(rels, reverse=True)


def test_ternary_matrix_converts_with_one_digit_losslessly():
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(-1, 2, (16, 256), generator=g).float()
    scale = torch.tensor([0.5, 0.25, 2.0 ** -7, 3.0]).repeat_interleave(4).view(16, 1, 1)
    w = (codes.view(16, 2, 128) * scale).view(16, 256).bfloat16()
    assert convert.is_ternary(w)
    assert not convert.is_ternary(w + 0.01 * torch.randn(16, 256, generator=g).bfloat16())
    pw, st = convert.convert([w], 1)
    assert st["sq_err"] == 0.0
    assert torch.equal(_decode(pw).float(), w.float())


def test_pq2ify_picks_one_digit_for_ternary_model():
    from pq2verify.gsm8k import model as mdl
    lin = torch.nn.Sequential(torch.nn.Linear(128, 8, bias=False))
    with torch.no_grad():
        lin[0].weight.copy_(torch.randint(-1, 2, (8, 128)).float() * 0.125)
    digits, ternary, rel, worst, n, _ = mdl.pq2ify(lin, None)
    assert (digits, ternary, rel, n) == (1, True, 0.0, 1)


def test_pack_codes_matches_reference_encode():
    from reference import pq2
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 3, (4, 256), dtype=np.uint8)
    scales = rng.random((4, 2)).astype(np.float16)
    ours = convert.pack_codes(torch.from_numpy(codes), torch.from_numpy(scales))
    assert np.array_equal(ours.numpy(), pq2.encode(codes, scales))


@pytest.mark.gpu
def test_pq2ify_of_a_cuda_model_gives_the_cpu_bytes():
    """A model already on the GPU converts to the same PQ2 bytes as on the CPU (on the GPU it
    once failed outright: a CPU constant met CUDA weights)."""
    from pq2verify.gsm8k import model as mdl
    torch.manual_seed(5)
    cpu = torch.nn.Sequential(torch.nn.Linear(200, 16, bias=False))
    gpu = torch.nn.Sequential(torch.nn.Linear(200, 16, bias=False)).cuda()
    with torch.no_grad():
        gpu[0].weight.copy_(cpu[0].weight)
    mdl.pq2ify(cpu, 4)
    mdl.pq2ify(gpu, 4)
    assert gpu[0].stack.w.data.is_cuda
    assert torch.equal(gpu[0].stack.w.data.cpu(), cpu[0].stack.w.data)
    w = torch.randn(16, 200, device="cuda")
    d, sc, _ = convert.quantize_digits(w, 3)
    d2, sc2, _ = convert.quantize_digits(w.cpu(), 3)
    assert torch.equal(d.cpu(), d2) and torch.equal(sc.cpu(), sc2)
