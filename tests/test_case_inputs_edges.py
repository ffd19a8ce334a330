"""The cases every check runs on, and the seeded data it builds for them (pq2verify.cases,
pq2verify.casedata, pq2verify.inputs): what each is pinned to here, and why.

- Seeds reproduce: the golden profile's ids, and the bytes of its activations and weights
  generated on the CPU, equal those the committed interpreter capture recorded (its manifest's
  ids and sha256s are the independent record; a changed seed rule, code draw or scale spread
  changes them).
- The check profile's rotation of kinds and strided rows, for a few (M, dtype, layout) cells
  worked out by hand from the rule in cases.py's docstring (r = i + 2j + raw over the shape
  set's M list and the dtypes; strided where (i + j) % 3 == 1), and every kind reached.
- Case ids round-trip through Case.parse, and parse refuses the edges: seed 2**63, N or K 0, a
  suite label at another size; a hand-made label takes any size.
- bench_case and selftest_case give what their docstrings say (unit stride, normal; bf16, the
  last layout, K >= 384, the smallest shape, M = 2 where served).
- Sampled reference rows: all rows up to 256, else 256 distinct in-range rows holding the first
  and the last.
- Input kinds are what their names say, counted on planted sizes: outliers in max(1, K // 64)
  columns, zero groups on even groups, ties with amax 127 and half-integers, tiny on even rows,
  subnormal values in every third group and in K // 64 columns, strided views of a wider buffer,
  ternary codes 0/1/2 about a third each, scales log-normal around 0.02.

Expected values are written out here (or read from committed files); the functions under test
never supply them. CPU tensors only: the same on `--device cuda`."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pq2verify import casedata, cases, registry
from pq2verify.golden.store import tensor_sha256
from pq2verify.cases import Case
from pq2verify.inputs import ACTIVATION_KINDS, activations, dense_weight, ternary_weight

REPRO = "reproduce: .venv/bin/python -m pytest -q tests/test_case_inputs_edges.py\n"
ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "golden" / "interpreter" / "manifest.json"


@pytest.fixture(scope="module")
def manifest():
    # committed: a missing record is a failure, not a reason to skip the seeds' check
    assert MANIFEST.exists(), REPRO + f"no committed interpreter capture at {MANIFEST} (git checkout -- golden/interpreter)"
    return json.loads(MANIFEST.read_text())


# --- seeds reproduce: the committed capture is the record ---------------------------------------
def test_golden_ids_are_the_committed_captures_ids(manifest):
    got = sorted(c.id for c in cases.golden_cases("interpreter"))
    want = sorted(e["id"] for e in manifest["cases"])
    assert got == want, REPRO + f"golden ids differ from {MANIFEST}: only here {sorted(set(got) - set(want))[:3]}, " \
                                f"only committed {sorted(set(want) - set(got))[:3]}"


def test_golden_inputs_regenerate_the_committed_bytes(manifest):
    """x of one case per kind (and a strided one), and every committed weight, from their seeds.
    torch's CPU randn bits follow ATen's CPU capability (pq2verify/golden: the reason captures
    store x), so the bytes are compared where this host's capability is the capture's; the
    seeds are checked everywhere."""
    caps = {p["isa"]["torch_cpu_capability"] for p in manifest["paths"].values() if p.get("isa")}
    same_cpu = caps == {torch.backends.cpu.get_cpu_capability()}
    picked = {}
    for e in manifest["cases"]:
        picked.setdefault((e["kind"], e["strided"], e["dtype"]), e)
    for e in picked.values():
        c = Case(e["path"], e["shape"], e["n"], e["k"], e["m"], e["dtype"], e["layout"], e["kind"], e["strided"],
                 e["seed"])
        assert cases.seeded(c).seed == e["seed"], REPRO + f"{e['id']}: seeded() gives seed {cases.seeded(c).seed}"
        x = casedata.golden_x(c)
        assert not same_cpu or tensor_sha256(x) == e["x_sha256"], \
            REPRO + f"{e['id']}: activations differ from the committed capture"
    for key, meta in manifest["weights"].items():
        assert meta["seed"] == cases.weight_seed(meta["n"], meta["k"]), REPRO + f"{key}: weight seed differs"
        if not same_cpu:
            continue
        if meta["kind"] == "dense":
            w = dense_weight(meta["n"], meta["k"], meta["seed"], "cpu", cases.DTYPES[meta["dtype"]])
        else:
            w = ternary_weight(meta["n"], meta["k"], meta["seed"], "cpu", "prepared").data
        assert tensor_sha256(w) == meta["sha256"], REPRO + f"{key}: weight bytes differ from the committed capture"
    if not same_cpu:    # the seeds held; say that the bytes were not compared
        pytest.skip(f"bytes compared only under the capture's ATen CPU capability {sorted(caps)}; "
                    f"this host: {torch.backends.cpu.get_cpu_capability()}")


def test_seeds_ignore_path_and_layout_but_not_the_rest():
    base = Case("int_gemv", "b", 64, 384, 2, "bf16", "prepared", "heavy", True)
    s = cases.seeded(base).seed
    assert 0 <= s < 100_000, REPRO + f"seed {s}"
    assert cases.seeded(Case("native", "b", 64, 384, 2, "bf16", "raw", "heavy", True)).seed == s, REPRO
    for other in (dict(m=3), dict(dtype="fp16"), dict(kind="ties"), dict(strided=False), dict(n=200, k=640)):
        c = Case(**{**base.__dict__, **other})
        assert cases.seeded(c).seed != s, REPRO + f"{other}: same seed {s} as {base.id}"


def test_the_same_seed_draws_the_same_bits_and_another_seed_other_bits():
    for kind in ACTIVATION_KINDS + ("subnormal", "tiny"):
        a, b = activations(3, 256, 7, kind), activations(3, 256, 7, kind)
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), REPRO + f"{kind}: seed 7 drew twice differently"
        c = activations(3, 256, 8, kind)
        assert not torch.equal(a.view(torch.int16), c.view(torch.int16)), REPRO + f"{kind}: seeds 7 and 8 agree"


# --- the check profile's rotation ---------------------------------------------------------------
# small: MS = (1, 2, 3, 16, 17, 33) -> i; DTYPES bf16, fp16 -> j; shape index s (pq2: a 0, b 1;
# dense: ba 0); r = i + 2j + (layout == raw) + s; kinds (normal, heavy, outliers, zero_groups,
# ties)[r % 5]; strided where (i + j) % 3 == 1. The cells are on shape b (s = 1), cublas on ba.
ROTATION = [
    ("int_gemv", 1, "bf16", "prepared", "heavy", False),          # r = 0 + 0 + 0 + 1
    ("int_gemv", 1, "bf16", "raw", "outliers", False),            # r = 2
    ("int_gemv", 2, "bf16", "prepared", "outliers", True),        # i = 1: r = 2
    ("int_gemv", 1, "fp16", "prepared", "zero_groups", True),     # r = 0 + 2 + 0 + 1
    ("int_gemv", 3, "bf16", "prepared", "zero_groups", False),    # i = 2: r = 3
    ("int_gemv", 2, "fp16", "prepared", "ties", False),           # r = 1 + 2 + 1 = 4
    ("int_gemv", 3, "fp16", "raw", "heavy", False),               # r = 2 + 2 + 1 + 1 = 6
    ("int_gemv", 16, "bf16", "raw", "normal", False),             # i = 3: r = 5
    ("int_gemv", 16, "fp16", "prepared", "heavy", True),          # r = 3 + 2 + 1 = 6
    ("mmq", 17, "bf16", "prepared", "normal", True),      # i = 4: its index in MS, not among mmq's Ms; r = 5
    ("mmq", 33, "fp16", "raw", "ties", False),            # i = 5: r = 5 + 2 + 1 + 1 = 9
    ("gemv_pair", 2, "bf16", "prepared", "outliers", True),       # a path of one M: r = 2
    ("cublas", 2, "fp16", "dense", "zero_groups", False),         # s = 0: r = 1 + 2 = 3
]


def test_check_rotation_matches_the_hand_worked_cells():
    full = {(c.path, c.shape, c.m, c.dtype, c.layout): c for c in cases.check_cases("small")}
    for path, m, dt, lay, kind, strided in ROTATION:
        shape = "ba" if path == "cublas" else "b"
        c = full.get((path, shape, m, dt, lay))
        assert c is not None, REPRO + f"no check case {path} {shape} m{m} {dt} {lay}"
        assert (c.kind, c.strided) == (kind, strided), REPRO + f"{c.id}: expected {kind}, strided={strided}"
        assert c.seed == cases.seeded(c).seed, REPRO + c.id


def test_every_path_reaches_every_kind_and_both_strides():
    """Every kind on every path, and both strides: the rotation counts the shape too, so a path
    of one M (gemv, single, gemv_pair) or of two Ms and one layout (mmq_wgmma) reaches them all
    (without the shape, gemv and single never saw ties, mmq_wgmma never zero_groups)."""
    cs = cases.check_cases("small")
    assert {c.kind for c in cs} == set(ACTIVATION_KINDS), REPRO
    for p in registry.PATHS:
        mine = [c for c in cs if c.path == p.name]
        kinds = {c.kind for c in mine}
        assert kinds == set(ACTIVATION_KINDS), REPRO + f"{p.name}: kinds {sorted(kinds)}"
        assert {c.strided for c in mine} == {False, True}, REPRO + f"{p.name}: strided never varies"
        assert all(p.serves(c.m) and cases.DTYPES[c.dtype] in p.dtypes and c.layout in p.layouts for c in mine), \
            REPRO + p.name


@pytest.mark.parametrize("key", ["interpreter", "sm90"])
def test_every_path_has_golden_cases_on_each_backend(key):
    """A path none of the profile's Ms reach still gets captures, at its smallest M (before this
    rule gemv_pair, M = 2 alone, had none on a GPU, whose profile Ms are 1, 4, 17, 64)."""
    gs = cases.golden_cases(key)
    for p in registry.PATHS:
        mine = [c for c in gs if c.path == p.name]
        assert mine, REPRO + f"{p.name}: no golden case on {key}"
        assert all(p.serves(c.m) for c in mine), REPRO + p.name
    pair = {c.m for c in gs if c.path == "gemv_pair"}
    assert pair == {2}, REPRO + str(pair)
    # the others keep exactly the profile's Ms they serve (their captures are committed)
    ms = cases.GOLDEN_MS["interpreter" if key == "interpreter" else "gpu"]
    for name in ("gemv", "small_mma", "int_gemv", "mmq"):
        p = registry.get(name)
        assert {c.m for c in gs if c.path == name} == {m for m in ms if p.serves(m)}, REPRO + name


def test_golden_gpu_profile_spans_and_strides():
    """gb is span 'one' (first dtype, no raw layout); strided only where M > 1 at odd index i."""
    gs = cases.golden_cases("sm90", paths=["int_gemv"])
    gb = [c for c in gs if c.shape == "gb"]
    assert gb and all(c.dtype == "bf16" and c.layout == "prepared" for c in gb), REPRO + str([c.id for c in gb])
    ga = [c for c in gs if c.shape == "ga"]
    assert {(c.dtype, c.layout) for c in ga} == {(d, lay) for d in ("bf16", "fp16") for lay in ("raw", "prepared")}, REPRO
    # GOLDEN_MS gpu = (1, 4, 17, 64); int_gemv serves 1-16: i = 0 (M 1), 1 (M 4)
    assert {(c.m, c.strided) for c in ga} == {(1, False), (4, True)}, REPRO + str({(c.m, c.strided) for c in ga})


# --- ids and their parse ------------------------------------------------------------------------
def test_every_profile_case_round_trips_through_its_id():
    every = cases.check_cases("small") + cases.golden_cases("interpreter") + cases.profile("bench", "interpreter")
    for c in every:
        assert Case.parse(c.id) == c, REPRO + c.id
        assert c.repro() == f"./pq2 check --case {c.id}", REPRO + c.repro()


@pytest.mark.parametrize("spec", [
    "int_gemv:t=8x128:m1:bf16:prepared:normal:seed9223372036854775807",
    "int_gemv:t=8x128:m1:bf16:prepared:normal:seed0",
    "int_gemv:forced=3x256:m16:fp16:raw:ties:strided:seed5",
    "int_gemv:b=64x384:m2:bf16:prepared:heavy:strided:seed1",
])
def test_parse_takes_the_edges(spec):
    assert Case.parse(spec).id == spec, REPRO + spec


@pytest.mark.parametrize("spec,why", [
    ("int_gemv:t=8x128:m1:bf16:prepared:normal:seed9223372036854775808", "seed"),
    ("int_gemv:t=8x128:m1:bf16:prepared:normal:seed-1", "seed"),
    ("int_gemv:t=0x128:m1:bf16:prepared:normal:seed1", "N, K"),
    ("int_gemv:t=8x0:m1:bf16:prepared:normal:seed1", "N, K"),
    ("int_gemv:t=8x128:m17:bf16:prepared:normal:seed1", "serves M"),
    ("int_gemv:b=200x640:m1:bf16:prepared:normal:seed1", "shape 'b' is 64x384"),
    ("int_gemv:zz=8x128:m1:bf16:prepared:normal:seed1", "not a shape of the suite"),
    ("int_gemv:t=8x128:m1:bf16:prepared:normal:wide:seed1", "expected path:shape"),
    ("int_gemv:t=8x128:m1:bf16:dense:normal:seed1", "layout"),
    ("int_gemv:t=8x128:m1:bf16:prepared:nope:seed1", "input kind"),
])
def test_parse_refuses_the_edges(spec, why):
    with pytest.raises(ValueError) as e:
        Case.parse(spec)
    assert why in str(e.value), REPRO + str(e.value)


# --- bench and selftest cases -------------------------------------------------------------------
def test_bench_case_is_normal_unit_stride_and_path_blind():
    a = cases.bench_case("int_gemv", "b", 64, 384, 2, "bf16", "prepared")
    b = cases.bench_case("native", "b", 64, 384, 2, "bf16", "raw")
    assert (a.kind, a.strided) == ("normal", False) and ":strided" not in a.id, REPRO + a.id
    assert a.seed == b.seed and 0 <= a.seed < 100_000, REPRO + f"{a.id} vs {b.id}"
    assert cases.bench_case("int_gemv", "b", 64, 384, 3, "bf16", "prepared").seed != a.seed, REPRO


@pytest.mark.parametrize("path,shape,m,layout", [
    ("int_gemv", "b", 2, "prepared"), ("gemv", "b", 1, "prepared"), ("mmq", "b", 17, "prepared"),
    ("mmq_wgmma", "b", 17, "prepared"), ("cublas", "ba", 2, "dense"),
])
def test_selftest_case_is_what_its_docstring_says(path, shape, m, layout):
    c = cases.selftest_case(registry.get(path))
    assert (c.path, c.shape, c.m, c.dtype, c.layout) == (path, shape, m, "bf16", layout), REPRO + c.id
    assert c.k >= 384, REPRO + c.id


def test_selftest_takes_m_2_where_served_even_if_3_is_not():
    """A path serving M 1-2 (int_gemv's entry with its upper bound moved down: the selftest reads
    the range from the entry it is given) still takes M = 2, not its smallest M."""
    from dataclasses import replace
    p = replace(registry.get("int_gemv"), m_max=2)
    assert p.serves(2) and not p.serves(3), REPRO
    c = cases.selftest_case(p)
    assert (c.m, c.shape) == (2, "b"), REPRO + c.id


def test_selftest_skips_a_smaller_shape_of_fewer_than_3_groups(monkeypatch):
    """A small PQ2 shape of K = 256 (2 groups: a reordered fold cannot change bits) is smaller
    than b but never the selftest's; b (64x384, 3 groups) is."""
    small = dict(cases.SHAPES["small"])
    small["pq2"] = [("t", 8, 256)] + list(small["pq2"])
    monkeypatch.setitem(cases.SHAPES, "small", small)
    c = cases.selftest_case(registry.get("int_gemv"))
    assert (c.shape, c.n, c.k) == ("b", 64, 384), REPRO + c.id


# --- sampled reference rows ---------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 255, 256])
def test_small_shapes_take_every_row(n):
    assert casedata._rows(n).tolist() == list(range(n)), REPRO + f"N={n}"


@pytest.mark.parametrize("n", [257, 258, 1000, 5120])
def test_large_shapes_sample_256_distinct_rows_with_both_ends(n):
    r = casedata._rows(n).tolist()
    assert len(r) == 256 and len(set(r)) == 256, REPRO + f"N={n}: {len(r)} rows, {len(set(r))} distinct"
    assert r[:2] == [0, n - 1] and all(0 <= v < n for v in r), REPRO + f"N={n}: {r[:4]} ..."
    assert casedata._rows(n).tolist() == r, REPRO + f"N={n}: a second draw differs"


def test_given_data_keeps_the_device_it_is_told(cpu_only):
    c = Case("int_gemv", "t", 8, 128, 1, "bf16", "prepared")
    x = activations(1, 128, 1)
    w = ternary_weight(8, 128, 1)
    assert casedata.CaseData.given(c, x, w, device="cuda:3").device == "cuda:3", REPRO
    assert casedata.CaseData.given(c, x, w).device == "cpu", REPRO


def test_the_dense_reference_sums_over_absolute_terms(cpu_only):
    """S for a dense weight: |x| @ |w|^T in float64 on the sampled rows, written out here."""
    c = cases.seeded(Case("cublas", "ba", 96, 384, 2, "bf16", "dense", "heavy"))
    d = casedata.CaseData(c, "cpu")
    want = d.x.abs().double().numpy() @ d.w.abs().double().numpy().T
    got = d.abs_sum()
    assert got.shape == (2, 96) and np.allclose(got, want, rtol=1e-12, atol=0), REPRO + c.id


def test_a_pq2_cases_dense_sum_is_over_the_decoded_weight_and_the_path_given_decides(cpu_only):
    """S against the 'dense' reference (native's) of a PQ2 case: |x| @ |decode(w)|^T on the
    sampled rows, the weight decoded by reference.pq2 here; with no path given, the case's own
    path (int_gemv: the 'quantized' reference) decides, and it is another sum."""
    from reference import pq2
    c = cases.seeded(Case("int_gemv", "b", 64, 384, 2, "bf16", "prepared", "outliers"))
    d = casedata.CaseData(c, "cpu")
    wd = pq2.decode(d.w.data.numpy(), layout="prepared", n=64, k=384)
    want = d.x.abs().double().numpy() @ np.abs(wd).T
    got = d.abs_sum(registry.get("native"))
    assert np.allclose(got, want, rtol=1e-12, atol=0), REPRO + c.id
    own = casedata.CaseData(c, "cpu").abs_sum()
    assert own.shape == (2, 64) and not np.allclose(own, want, rtol=1e-6), REPRO + f"{c.id}: no path took native's"


# --- input kinds are what their names say -------------------------------------------------------
def test_heavy_has_the_variance_its_clamp_gives_and_normal_has_one():
    """heavy = N(0,1) / sqrt(max(U, 0.05)): variance E[1/max(U, c)] = 1 - ln c = 3.996 for
    c = 0.05 (3.30 for 0.1); normal: 1. 256k draws: the sample variance is within 0.1."""
    h = activations(64, 4096, 5, "heavy", torch.float32).double()
    v = h.pow(2).mean().item()
    assert abs(v - (1 - math.log(0.05))) < 0.3, REPRO + f"heavy variance {v}"
    z = activations(64, 4096, 5, "normal", torch.float32).double().pow(2).mean().item()
    assert abs(z - 1) < 0.05, REPRO + f"normal variance {z}"


@pytest.mark.parametrize("k,cols", [(640, 10), (128, 2), (32, 1)])
def test_outliers_hit_k_over_64_columns_at_least_one(k, cols):
    x = activations(16, k, 3, "outliers", torch.float32)
    hit = (x.abs().max(0).values > 12).sum().item()    # 50 x a normal draw; a normal one stays < 6
    assert hit == cols, REPRO + f"K={k}: {hit} outlier columns, expected {cols}"


def test_zero_groups_are_the_even_groups():
    x = activations(3, 640, 3, "zero_groups", torch.float32).view(3, 5, 128)
    zero = [bool((x[:, g] == 0).all()) for g in range(5)]
    assert zero == [True, False, True, False, True], REPRO + str(zero)


def test_ties_have_amax_127_first_and_half_integers():
    x = activations(2, 384, 3, "ties", torch.float32).view(2, 3, 128)
    assert (x[:, :, 0] == 127).all() and (x.abs().amax(-1) == 127).all(), REPRO
    rest = x[:, :, 1:]
    assert ((rest - 0.5) == (rest - 0.5).round()).all() and (rest.abs() <= 125.5).all(), REPRO


@pytest.mark.parametrize("dtype,scale", [(torch.bfloat16, 2.0 ** -64), (torch.float16, 2.0 ** -10)])
def test_tiny_scales_even_rows_only(dtype, scale):
    x = activations(4, 256, 3, "tiny", dtype).float().abs()
    assert (x[0::2].max() < 8 * scale) and (x[1::2].max() > 0.5), REPRO + f"{dtype}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_tiny_is_the_normal_draw_with_even_rows_times_2_to_the_minus_64(dtype):
    """bf16 and any dtype without its own factor (float32): even rows exactly 2^-64 times the
    normal draw of the same seed (a power of two, no subnormal: exact), odd rows untouched."""
    t = activations(4, 256, 6, "tiny", dtype).double()
    n = activations(4, 256, 6, "normal", dtype).double()
    assert torch.equal(t[0::2], n[0::2] * 2.0 ** -64) and torch.equal(t[1::2], n[1::2]), REPRO + str(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_subnormal_groups_and_columns(dtype):
    tiny = torch.finfo(dtype).tiny
    x = activations(4, 768, 3, "subnormal", dtype).float()
    g = x.view(4, 6, 128).abs()
    for gi in range(6):
        sub = bool((g[:, gi] < tiny).all())
        assert sub == (gi % 3 == 1), REPRO + f"{dtype} group {gi}: all subnormal = {sub}"
    pinned = ((x.abs() == tiny / 4).all(0)).sum().item()
    assert pinned == 768 // 64, REPRO + f"{dtype}: {pinned} columns at tiny/4, expected 12"


def test_strided_activations_are_a_view_of_a_wider_buffer():
    x = activations(3, 256, 4, "normal", row_stride=512)
    assert x.shape == (3, 256) and x.stride() == (512, 1) and not x.is_contiguous(), REPRO + str(x.stride())
    y = activations(3, 256, 4, "normal", row_stride=256)
    assert y.is_contiguous(), REPRO


def test_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind"):
        activations(1, 128, 1, "normals")


def test_ternary_codes_are_a_third_each_and_scales_near_0_02():
    from kernels.format import unpack_codes
    n, k = 64, 1024
    w = ternary_weight(n, k, 11)
    assert w.layout == "prepared" and ternary_weight(n, k, 11, layout="raw").layout == "raw", REPRO
    codes = unpack_codes(w.data[: n * k // 4]).reshape(-1)
    frac = [(codes == v).float().mean().item() for v in range(4)]
    assert frac[3] == 0 and all(0.3 < f < 0.37 for f in frac[:3]), REPRO + f"code fractions {frac}"
    scales = w.data[n * k // 4:].view(torch.float16).float()
    med = scales.median().item()
    assert scales.numel() == n * k // 128 and 0.012 < med < 0.03, REPRO + f"median scale {med}"
    assert math.isclose(med, math.exp(-4), rel_tol=0.25) and (scales > 0).all(), REPRO


def test_dense_weight_is_scaled_by_root_k():
    w = dense_weight(64, 1024, 2, dtype=torch.float32)
    assert 0.9 / 32 < w.std().item() < 1.1 / 32, REPRO + f"std {w.std().item()}"


@pytest.mark.parametrize("kw", [{"ms": [17]}, {"dtypes": ["fp16"]}, {"ms": [2], "dtypes": ["bf16"]},
                                {"ms": [33, 1], "layouts": ["raw"]}, {"paths": ["int_gemv"], "ms": [3]}],
                         ids=["m17", "fp16", "m2-bf16", "m33-m1-raw", "int_gemv-m3"])
def test_a_filter_selects_the_full_runs_cases(kw):
    """The module's promise: --m, --dtype, --layout and --paths select cases of the full run,
    all of those the filter admits and no other (the kind and stride rotation counts over the
    full profile, not over the filtered lists)."""
    full = cases.check_cases("small")
    want = [c for c in full if (not kw.get("ms") or c.m in kw["ms"]) and (not kw.get("dtypes") or c.dtype in kw["dtypes"])
            and (not kw.get("layouts") or c.layout in kw["layouts"]) and (not kw.get("paths") or c.path in kw["paths"])]
    got = cases.check_cases("small", **kw)
    assert want and sorted(c.id for c in got) == sorted(c.id for c in want), \
        f"reproduce: .venv/bin/python -m pytest -q 'tests/test_case_inputs_edges.py::test_a_filter_selects_the_full_runs_cases' ({kw})"


def test_an_m_outside_the_profile_rotates_as_the_m_it_sorts_beside():
    """M = 5 is not in the small profile (1, 2, 3, 16, 17, 33): it takes the rotation place of
    16, the M it sorts before (index 3), so its kinds are those 16's cases have."""
    five = {(c.path, c.shape, c.dtype, c.layout): (c.kind, c.strided) for c in cases.check_cases("small", ms=[5])}
    sixteen = {(c.path, c.shape, c.dtype, c.layout): (c.kind, c.strided) for c in cases.check_cases("small", ms=[16])}
    shared = five.keys() & sixteen.keys()
    assert shared and all(five[x] == sixteen[x] for x in shared), sorted(shared)


def test_every_profiles_ms_are_sorted_and_distinct():
    # check_cases places each M in the full profile by bisection: an unsorted list misplaces it
    for name, ms in cases.MS.items():
        assert list(ms) == sorted(set(ms)), REPRO + f"MS[{name!r}] = {ms}"
