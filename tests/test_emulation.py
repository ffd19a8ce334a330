"""The CPU emulation of each path against the FP64 references: Q8 codes bit-equal, integer
group dots exact, outputs within output rounding; claimed bit-identities hold."""
import numpy as np
import pytest
import torch

from kernels import emulation as E
from kernels.format import PQ2Weight
from pq2verify import registry

from reference import projection as ref, q8, generate as gen, metrics

KINDS = ("normal", "heavy", "outliers", "zero_groups", "ties")
INTEGER = [p.name for p in registry.PATHS if p.weight == "pq2" and p.arithmetic == "integer"]


def weight(n=96, k=640, seed=1, layout="raw"):
    w = PQ2Weight.from_raw(torch.from_numpy(gen.ternary_weight(n, k, seed)))
    return w.to_prepared() if layout == "prepared" else w


def _layout(w):
    """With w.data, what the reference reads of a weight: its bytes and their layout."""
    return {"layout": w.layout, "n": w.n, "k": w.k}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_q8_codes_bit_equal(kind, dtype):
    x = gen.activations(7, 640, 5, kind=kind, dtype=dtype)
    q, s = E.quantize_q8(x)
    r = q8.quantize_q8(x)
    assert np.array_equal(q.numpy().astype(np.int8), r.q)
    assert np.array_equal(s.numpy().view(np.uint32), np.asarray(r.scales, np.float32).view(np.uint32))


@pytest.mark.parametrize("gemm", ["onednn", "fp32"])
def test_group_dots_exact(gemm, monkeypatch):
    if gemm == "onednn" and not E._onednn_available():
        pytest.skip("oneDNN int8 ops not in this torch build")
    monkeypatch.setattr(E, "_GEMM", gemm)
    w = weight()
    x = gen.activations(5, 640, 6, kind="heavy")
    q, _ = E.quantize_q8(x)
    d = E.group_dots(q, w).permute(1, 2, 0).numpy()            # [M, N, G]
    assert np.array_equal(d.astype(np.int64), ref.group_dots(x, w.data, **_layout(w)))


@pytest.mark.rms
@pytest.mark.parametrize("path", INTEGER)
@pytest.mark.parametrize("layout", ["raw", "prepared"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_integer_paths_within_output_rounding(path, layout, dtype):
    p = registry.get(path)
    w = weight(layout=layout)
    m = 1 if p.m_max == 1 else (8 if p.m_max == 16 else 40)
    for kind in KINDS:
        x = gen.activations(m, 640, 7, kind=kind, dtype=dtype)
        y = E.emulate(path, x, w)
        assert y.dtype == dtype and y.shape == (m, w.n)
        r = ref.quantized(x, w.data, **_layout(w))
        assert metrics.relative_rms(y, r) <= p.tolerance(dtype, "quantized"), (path, kind)
        # before the output rounding the FP32 fold is within 1e-5 of FP64
        y32 = E.integer(path, x, w, out_dtype=torch.float32)
        assert metrics.relative_rms(y32, r) <= 1e-5


def test_prefill_row_blocks_change_no_bit():
    w = weight()
    x = gen.activations(E.ROW_CHUNK * 2 + 9, 640, 8)
    y = E.emulate("mmq", x, w)
    for s in (0, E.ROW_CHUNK + 3, x.shape[0] - 1):
        assert torch.equal(y[s], E.emulate("mmq", x[s:s + 1].repeat(20, 1), w)[0])


def test_claimed_identities():
    w = weight()
    x = gen.activations(40, 640, 9, kind="outliers")
    assert torch.equal(E.emulate("mmq", x, w), E.emulate("mmq_planes", x, w))
    xs = x[:8]
    a, b = E.integer("int_gemv", xs, w, out_dtype=torch.float32), E.integer("small_mma", xs, w, out_dtype=torch.float32)
    assert torch.allclose(a, b, rtol=1e-5, atol=0)          # same dots, another FP32 order


@pytest.mark.parametrize("path", INTEGER)
def test_emulation_is_the_kernels_arithmetic(path, device):
    """The emulation, told the interpreter's config (registry.Path.fold), gives each integer
    path's kernel bytes exactly: its fold order comes from the kernel file alone, so a new path
    is emulated with no edit here. (On a GPU an FMA may contract the fold: CPU only.)"""
    if device == "cuda":
        pytest.skip("the interpreter's bits: the GPU's fold may contract into an FMA")
    p = registry.get(path)
    w = weight(n=40, k=1024, layout="prepared")
    m = p.m_min if p.m_min > 1 else min(3, p.m_max or 3)
    for kind in ("normal", "outliers", "ties"):
        x = gen.activations(m, 1024, 3, kind=kind)
        got = E.emulate(path, x, w, interpret=True)
        want = p.kernel()(x, w)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)), (path, kind)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_native_and_dense_paths(dtype):
    w = weight()
    x = gen.activations(6, 640, 10, dtype=dtype)
    y = E.emulate("native", x, w)
    assert metrics.relative_rms(y, ref.floating(x, w.data, **_layout(w))) <= registry.get("native").tolerance(dtype, "dense")
    wd = torch.randn(32, 640, dtype=dtype)
    d = ref.dense(x, wd)
    for path in ("cublas", "small_gemm"):
        y = E.emulate(path, x, wd)
        assert y.dtype == dtype and metrics.relative_rms(y, d) <= registry.get(path).tolerance(dtype, "dense")


def test_cache_lives_on_the_weight():
    w = weight()
    x = gen.activations(2, 640, 11)
    E.emulate("int_gemv", x, w)
    assert any(k.startswith("emu_codes") for k in w._views)          # the GEMM's layout of the codes
    if E.gemm_kind() == "int_mm":   # ... and only that one: two copies are 5 GB on a 1.5B model
        assert [k for k in w._views if k.startswith("emu_codes")] == ["emu_codes_i8_t"]
    w2 = weight(seed=2)
    assert not any(k.startswith("emu_codes") for k in w2._views)
    assert not torch.equal(E.emulate("int_gemv", x, w), E.emulate("int_gemv", x, w2))


def test_every_registry_path_emulates():
    w = weight()
    x = gen.activations(1, 640, 12)
    for p in registry.PATHS:
        arg = torch.randn(16, 640, dtype=x.dtype) if p.weight == "dense" else w
        assert E.emulate(p.name, x, arg).shape[0] == 1


def test_pq2_matmul_on_cpu_uses_emulation():
    from kernels import backend, dispatch
    w = weight()
    x = gen.activations(3, 640, 13)
    with backend.using_cpu_backend("emulate"), dispatch.trace() as t:
        y = dispatch.pq2_matmul(x, w, kernels="legacy")
    assert dict(t) == {"int_gemv": 1}
    assert torch.equal(y, E.emulate("int_gemv", x, w))


def test_kernel_fold_orders_follow_the_kernels():
    """single and small_mma take their FP32 order from the kernels' fold() for the GPU's
    config, whatever the process's interpreter mode."""
    single = pytest.importorskip("kernels.single")
    small_mma = pytest.importorskip("kernels.small_mma")
    w5 = weight(n=3840, k=640)
    f = single.fold(w5.n, w5.k, 1, interpret=False)
    plan = E.kernel_plan("single", 1, w5)
    assert len(plan) == -(-w5.groups // f["groups_per_split"]) and len(plan[0]) == f["lanes"]
    assert sorted(g for split in plan for lane in split for g in lane) == list(range(w5.groups))
    w12 = weight(n=2304, k=1536)
    f = small_mma.fold(w12.n, w12.k, 8, interpret=False)
    plan = E.kernel_plan("small_mma", 8, w12)
    assert [lane for split in plan for lane in split] == [
        list(range(s, min(s + f["groups_per_split"], 12))) for s in range(0, 12, f["groups_per_split"])]
    assert E.kernel_plan("int_gemv", 8, w12) == [[list(range(12))]]


def test_a_forced_config_sets_the_plan():
    """kernel_plan and emulate follow a config forced as run(config=) takes it (fields left
    out keep the chosen values), and refuse a bad one naming its field."""
    w = weight(n=40, k=1024)                                  # 8 groups
    cfg = {"GC": 2, "groups_per_split": 5, "SPLIT": 2}
    assert E.kernel_plan("single", 1, w, config=cfg) == [[[0, 2, 4], [1, 3]], [[5, 7], [6]]]
    cfg = {"groups_per_split": 3, "SPLIT": 3, "UNROLL": 1}
    assert E.kernel_plan("small_mma", 4, w, config=cfg) == [[[0, 1, 2]], [[3, 4, 5]], [[6, 7]]]
    x = gen.activations(1, 1024, 14)
    with pytest.raises(ValueError, match=r"config field SPLIT=3: split 2 would be empty"):
        E.emulate("single", x, w, config={"groups_per_split": 4, "SPLIT": 3})
    with pytest.raises(ValueError, match=r"config field 'BM' unknown"):
        E.emulate("single", x, w, config={"BM": 16})
