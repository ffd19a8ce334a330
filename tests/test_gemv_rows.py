"""gemv_rows computes each plane's dot as a DP4A chain over the 8 words on CUDA and as one
word-sum under the interpreter. Both must give the same integers and bytes: this runs the chain
under the interpreter too (a GPU's golden capture and check then bind the compiled chain)."""
import pytest
import torch

from pq2verify.bits import same_bits
from pq2verify.inputs import activations, ternary_weight


@pytest.mark.parametrize("m,layout", [(3, "prepared"), (16, "raw")])
def test_the_chain_gives_the_word_sums_integers(m, layout, device, monkeypatch):
    from kernels import gemv_rows
    if device != "cpu":
        pytest.skip("the word-sum form is the interpreter's")
    n, k = 40, 1024
    w = ternary_weight(n, k, 5, device, layout)
    x = activations(m, k, 11, "outliers", torch.bfloat16, device)
    g = k // 128
    got = {}
    for chain in (False, True):
        monkeypatch.setattr(gemv_rows, "CHAIN", chain)
        dots = torch.empty(m, n, g, dtype=torch.int32)
        got[chain] = (gemv_rows.run(x, w, dots=dots), dots)
    assert torch.equal(got[True][1], got[False][1]), "group dots of the chain differ (seed 5 / 11)"
    assert same_bits(got[True][0], got[False][0])
