"""reference.pq2: the weight format, against the naive byte-by-byte reading and as properties."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from kernels import format as pw
from reference import pq2
from reference.metrics import bitwise_equal
from test_reference_naive import naive_decode, naive_decode_prepared, naive_encode

SETTINGS = settings(max_examples=100, deadline=None)


@st.composite
def codes_scales(draw, max_n=4, max_g=3):
    n = draw(st.integers(1, max_n))
    g = draw(st.integers(1, max_g))
    codes = draw(hnp.arrays(np.uint8, (n, g * 128), elements=st.integers(0, 2)))
    # any finite fp16: zeros of both signs, subnormals, negatives, the largest
    scales = draw(hnp.arrays(np.float16, (n, g), elements=st.floats(width=16, allow_nan=False,
                                                                    allow_infinity=False)))
    return codes, scales


def _raw_with_code3(n=5, k=384, row=3, block=1, weight=6):
    codes = np.ones((n, k), dtype=np.uint8)
    raw = pq2.encode(codes, np.full((n, k // 128), 0.25, np.float16))
    byte = 34 * block + 2 + weight // 4
    raw[row, byte] |= np.uint8(3 << (2 * (weight % 4)))
    return raw


# --- against the naive reading ----------------------------------------------------------------
@SETTINGS
@given(codes_scales())
def test_encode_matches_naive(cs):
    codes, scales = cs
    assert np.array_equal(pq2.encode(codes, scales), naive_encode(codes.tolist(), scales))


@SETTINGS
@given(codes_scales())
def test_decode_matches_naive(cs):
    raw = pq2.encode(*cs)
    assert bitwise_equal(pq2.decode(raw), naive_decode(raw))


@SETTINGS
@given(codes_scales())
def test_decode_prepared_matches_naive(cs):
    raw = pq2.encode(*cs)
    n, k = cs[0].shape
    flat = pq2.raw_to_prepared(raw)
    assert bitwise_equal(pq2.decode(flat, layout="prepared", n=n, k=k),
                         naive_decode_prepared(flat, n, k))


def test_byte_order_by_hand():
    # scale 1.5 = fp16 0x3E00 -> bytes 00 3E; code byte 0b00_10_01_00 -> codes 0, 1, 2, 0
    raw = np.zeros((1, 34), dtype=np.uint8)
    raw[0, :3] = [0x00, 0x3E, 0b00100100]
    raw[0, 3:] = 0x55
    w = pq2.decode(raw)[0]
    assert w[:4].tolist() == [-1.5, 0.0, 1.5, -1.5]
    assert (w[4:] == 0).all()


# --- round trips --------------------------------------------------------------------------------
@SETTINGS
@given(codes_scales())
def test_round_trips(cs):
    codes, scales = cs
    n, k = codes.shape
    raw = pq2.encode(codes, scales)
    c2, s2 = pq2.split_raw(raw)
    assert np.array_equal(c2, codes) and bitwise_equal(s2, scales)
    flat = pq2.raw_to_prepared(raw)
    assert flat.ndim == 1 and flat.size == raw.size
    assert np.array_equal(pq2.prepared_to_raw(flat, n, k), raw)
    assert np.array_equal(pq2.raw_to_prepared(pq2.prepared_to_raw(flat, n, k)), flat)
    plane, sp = pq2.split_prepared(flat, n, k)
    assert np.array_equal(plane, pq2.pack_codes(codes)) and bitwise_equal(sp, scales)
    assert bitwise_equal(pq2.decode(raw), pq2.decode(flat, layout="prepared", n=n, k=k))


def test_pack_unpack_all_bytes():
    every = np.arange(256, dtype=np.uint8).reshape(1, 256)
    codes = pq2.unpack_codes(every)
    assert codes.shape == (1, 1024)
    assert np.array_equal(pq2.pack_codes(codes), every)
    assert codes[0, 4 * 0b11100100:4 * 0b11100100 + 4].tolist() == [0, 1, 2, 3]


def test_unpack_follows_the_format_for_every_byte_and_any_layout():
    # SPEC: code 4*j + s is (byte[j] >> 2s) & 3, written out per byte with Python ints
    want = [[(b >> 2 * s) & 3 for s in range(4)] for b in range(256)]
    every = np.arange(256, dtype=np.uint8)
    assert pq2.unpack_codes(every).reshape(256, 4).tolist() == want
    # a strided view and a leading batch axis read the bytes where they are
    grid = np.random.default_rng(3).integers(0, 256, (2, 5, 12), dtype=np.uint8)
    view = grid[:, ::2, 1::3]
    got = pq2.unpack_codes(view)
    assert got.shape == (2, 3, 16)
    assert all(got[a, r, 4 * j + s] == want[view[a, r, j]][s]
               for a in range(2) for r in range(3) for j in range(4) for s in range(4))


@SETTINGS
@given(codes_scales())
def test_agrees_with_weight_object(cs):
    raw = pq2.encode(*cs)
    n, k = cs[0].shape
    w = pw.PQ2Weight.from_raw(torch.from_numpy(raw))
    prep = w.to_prepared()
    assert np.array_equal(pq2.raw_to_prepared(raw), prep.data.numpy())
    assert bitwise_equal(pq2.decode(w.data, layout=w.layout, n=n, k=k), pq2.decode(raw))
    assert bitwise_equal(pq2.decode(prep.data, layout=prep.layout, n=n, k=k), pq2.decode(raw))
    assert np.array_equal(pq2.prepared_to_raw(prep.data, n, k), raw)


def test_torch_inputs():
    codes = torch.randint(0, 3, (3, 256), dtype=torch.uint8)
    scales = torch.full((3, 2), 0.125, dtype=torch.float16)
    raw = pq2.encode(codes, scales)
    assert np.array_equal(pq2.decode(torch.from_numpy(raw)), pq2.decode(raw))
    assert np.array_equal(pq2.decode(raw), (codes.double().numpy() - 1) * 0.125)


def test_rows_select_and_name_original_row():
    raw = pq2.encode(np.full((6, 256), 2, np.uint8), np.arange(12, dtype=np.float16).reshape(6, 2))
    assert np.array_equal(pq2.decode(raw, rows=[4, 0, 4]), pq2.decode(raw)[[4, 0, 4]])
    flat = pq2.raw_to_prepared(raw)
    assert np.array_equal(pq2.decode(flat, layout="prepared", n=6, k=256, rows=np.array([5, 1])),
                          pq2.decode(raw)[[5, 1]])
    bad = _raw_with_code3(row=3, block=1)
    pq2.decode(bad, rows=[0, 4])                      # rows read are clean
    with pytest.raises(pq2.PQ2FormatError, match=r"code 3 at row 3, block 1"):
        pq2.decode(bad, rows=[4, 3])
    with pytest.raises(IndexError, match="rows"):
        pq2.decode(raw, rows=[6])


def test_empty_rows_and_zero_n():
    raw = pq2.encode(np.zeros((0, 128), np.uint8), np.zeros((0, 1), np.float16))
    assert raw.shape == (0, 34)
    assert pq2.decode(raw, k=128).shape == (0, 128)


# --- validation: one test per bad input --------------------------------------------------------
def test_error_class_is_the_references_own():
    """The oracle shares no code with the runtime, its error class included; both are
    ValueErrors, so a caller that catches ValueError sees either."""
    assert pq2.PQ2FormatError is not pw.PQ2FormatError
    assert issubclass(pq2.PQ2FormatError, ValueError) and issubclass(pw.PQ2FormatError, ValueError)


def test_reject_wrong_dtype():
    with pytest.raises(pq2.PQ2FormatError, match="uint8") as e:
        pq2.validate(np.zeros((2, 34), np.float32))
    assert "float32" in str(e.value)
    with pytest.raises(pq2.PQ2FormatError, match="uint8"):
        pq2.validate(torch.zeros(2, 34, dtype=torch.int8))


def test_reject_wrong_rank():
    with pytest.raises(pq2.PQ2FormatError, match="rank 3"):
        pq2.validate(np.zeros((2, 2, 34), np.uint8))
    with pytest.raises(pq2.PQ2FormatError, match="rank 2"):
        pq2.validate(np.zeros((2, 34), np.uint8), layout="prepared", n=2, k=128)


def test_reject_bytes_not_multiple_of_34():
    with pytest.raises(pq2.PQ2FormatError, match="35 bytes.*34"):
        pq2.validate(np.zeros((2, 35), np.uint8))
    with pytest.raises(pq2.PQ2FormatError, match="34"):
        pq2.validate(np.zeros((2, 0), np.uint8))


def test_reject_k_not_multiple_of_128():
    with pytest.raises(pq2.PQ2FormatError, match="K=100.*128"):
        pq2.validate(np.zeros(2 * 34, np.uint8), layout="prepared", n=2, k=100)
    with pytest.raises(pq2.PQ2FormatError, match="K=200.*128"):
        pq2.encode(np.zeros((2, 200), np.uint8), np.zeros((2, 1), np.float16))


def test_reject_prepared_size():
    with pytest.raises(pq2.PQ2FormatError, match="67 bytes.*68"):
        pq2.validate(np.zeros(67, np.uint8), layout="prepared", n=2, k=128)
    with pytest.raises(pq2.PQ2FormatError, match="n= and k="):
        pq2.validate(np.zeros(68, np.uint8), layout="prepared")


def test_reject_raw_shape_disagreeing_with_n_k():
    raw = np.full((2, 68), 0x55, np.uint8)
    with pytest.raises(pq2.PQ2FormatError, match="k=384"):
        pq2.validate(raw, k=384)
    with pytest.raises(pq2.PQ2FormatError, match="n=3"):
        pq2.validate(raw, n=3)


def test_reject_code_3_naming_row_and_block():
    raw = _raw_with_code3(row=3, block=1, weight=6)
    for w, kw in ((raw, {}), (pq2.raw_to_prepared(raw), dict(layout="prepared", n=5, k=384)),
                  (torch.from_numpy(raw), {})):
        with pytest.raises(pq2.PQ2FormatError, match="code 3") as e:
            pq2.validate(w, **kw)
        assert "row 3" in str(e.value) and "block 1" in str(e.value) and "weight 6" in str(e.value)
    with pytest.raises(pq2.PQ2FormatError, match="code 3 at row 3, block 1"):
        pq2.decode(raw)


def test_reject_first_code_3_of_several():
    raw = _raw_with_code3(row=3, block=2, weight=0)
    raw[1, 34 * 2 + 2 + 31] = 0xC0        # row 1, block 2, weight 127 (field s=3 of byte 31)
    with pytest.raises(pq2.PQ2FormatError, match="row 1, block 2 .weight 127"):
        pq2.validate(raw)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_reject_non_finite_scale(bad):
    raw = pq2.encode(np.ones((3, 256), np.uint8), np.ones((3, 2), np.float16))
    raw[2, 0:2] = np.array([bad], dtype="<f2").view(np.uint8)
    for w, kw in ((raw, {}), (pq2.raw_to_prepared(raw), dict(layout="prepared", n=3, k=256))):
        with pytest.raises(pq2.PQ2FormatError, match="non-finite") as e:
            pq2.validate(w, **kw)
        assert "row 2" in str(e.value) and "block 0" in str(e.value)


def test_encode_rejects_bad_codes_and_scales():
    with pytest.raises(pq2.PQ2FormatError, match="code 3 at row 1, block 1"):
        c = np.zeros((2, 256), np.uint8)
        c[1, 130] = 3
        pq2.encode(c, np.ones((2, 2), np.float16))
    with pytest.raises(pq2.PQ2FormatError, match="code -1"):
        pq2.encode(np.full((1, 128), -1, np.int64), np.ones((1, 1), np.float16))
    with pytest.raises(pq2.PQ2FormatError, match="float16"):
        pq2.encode(np.zeros((1, 128), np.uint8), np.ones((1, 1), np.float32))
    with pytest.raises(pq2.PQ2FormatError, match=r"\[N, K/128\]"):
        pq2.encode(np.zeros((1, 128), np.uint8), np.ones((1, 2), np.float16))
    with pytest.raises(pq2.PQ2FormatError, match="non-finite"):
        pq2.encode(np.zeros((1, 128), np.uint8), np.full((1, 1), np.inf, np.float16))
    with pytest.raises(pq2.PQ2FormatError, match="integer"):
        pq2.encode(np.zeros((1, 128), np.float32), np.ones((1, 1), np.float16))


def test_split_raw_shows_code_3_without_raising():
    codes, _ = pq2.split_raw(_raw_with_code3(row=3, block=1, weight=6))
    assert codes[3, 128 + 6] == 3 and (codes == 3).sum() == 1


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 6), st.integers(0, 2 ** 31 - 1))
def test_torch_pack_unpack_match_the_reference(rows, blocks, seed):
    """kernels.format packs and unpacks codes (the harness's one torch implementation)
    exactly as the numpy reference does, code 3 included."""
    codes = np.random.default_rng(seed).integers(0, 4, (rows, blocks * 128), dtype=np.uint8)
    packed = pw.pack_codes(torch.from_numpy(codes))
    assert np.array_equal(packed.numpy(), pq2.pack_codes(codes))
    assert np.array_equal(pw.unpack_codes(packed).numpy(), codes)


def test_torch_pack_codes_every_byte_and_wide_inputs():
    """Every byte is reached: the 256 four-code tuples (weight 4b+s at bits 2s, SPEC §2, worked
    out here) pack to the bytes 0..255 in order; codes given as int64 pack the same."""
    i = np.arange(256)
    codes = np.stack([(i >> (2 * s)) & 3 for s in range(4)], axis=1).reshape(1, 1024).astype(np.uint8)
    assert pw.pack_codes(torch.from_numpy(codes)).reshape(-1).tolist() == list(range(256))
    assert pw.pack_codes(torch.from_numpy(codes.astype(np.int64))).reshape(-1).tolist() == list(range(256))


@pytest.mark.gpu
def test_ternary_weight_generation_peak_memory():
    """Generating a seeded ternary weight holds its codes (n*k bytes, one per code) and at most
    a few packed copies of n*k/4 bytes (the packing's operands and result, the flat buffer) plus
    the scales (10 bytes a group): under 2.5 * n*k bytes at the peak. A packing in 4-byte
    integers would need 4 * n*k more (lm_head: 5 GB of a suite worker's GPU share)."""
    from pq2verify import inputs
    n, k = 8192, 8192
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    w = inputs.ternary_weight(n, k, 1, "cuda")
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    assert w.data.numel() == n * k // 4 + n * (k // 128) * 2
    assert peak <= 2.5 * n * k, f"peak {peak} bytes for n*k = {n * k} codes (repro: pytest {__file__} --device cuda -k peak)"
