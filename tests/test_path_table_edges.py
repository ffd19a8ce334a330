"""The path table's edges: the facts dispatch reads for each path (kernels/table.py), the claims
the suite checks it against (pq2verify/registry.py), what each kernel set holds and in which
order (kernels/sets.py), the fold plans and sources digest an exactness proof rests on, and the
cache dispatch keeps of its choice (kernels/dispatch.py). A wrong fact, claim, order or cache key
changes silently which path serves a call or what is checked about it, so each is pinned here
with its expected value written out by hand (from the docstrings and the path descriptions),
never computed by the function under test: a planted fold, a planted record, a copied source
tree whose files are touched one at a time, a planted host path.

Found by fault injection (mutation) of those four files; each test names the fault it catches."""
import importlib
import json
import os
import shutil

import pytest
import torch

from kernels import dispatch, table
from kernels import sets as kernelsets
from pq2verify import inputs, registry

REPRO = "reproduce: .venv/bin/python -m pytest -q tests/test_path_table_edges.py\n"
BF16, FP16 = torch.bfloat16, torch.float16


@pytest.fixture(autouse=True)
def _fresh_caches():
    dispatch.clear_cache()
    kernelsets.clear_cache()
    yield
    dispatch.clear_cache()
    kernelsets.clear_cache()


def _names(entries) -> list[str]:
    return [p.name for p in entries]


# ---- the table's dispatch facts and the suite's claims -------------------------------------

# name: (kset, m_min, m_max, weight, layouts, arithmetic, has_dots, counterpart, deselected?)
FACTS = {
    "native": ("legacy", 1, None, "pq2", ("raw", "prepared"), "floating", False, None, False),
    "int_gemv": ("legacy", 1, 16, "pq2", ("raw", "prepared"), "integer", True, None, False),
    "mmq": ("legacy", 17, None, "pq2", ("raw", "prepared"), "integer", True, None, False),
    "gemv": ("tuned", 1, 1, "pq2", ("raw", "prepared"), "integer", True, "int_gemv", False),
    "single": ("tuned", 1, 1, "pq2", ("raw", "prepared"), "integer", True, "int_gemv", False),
    "gemv_pair": ("tuned", 2, 2, "pq2", ("raw", "prepared"), "integer", True, "int_gemv", False),
    "small_mma": ("tuned", 2, 16, "pq2", ("raw", "prepared"), "integer", True, "int_gemv", False),
    "mmq_planes": ("tuned", 17, None, "pq2", ("raw", "prepared"), "integer", True, "mmq", True),
    "mmq_wgmma": ("tuned", 17, None, "pq2", ("prepared",), "integer", True, "mmq", False),
    "cublas": ("legacy", 1, None, "dense", ("dense",), "floating", False, None, False),
    "small_gemm": ("tuned", 1, 16, "dense", ("dense",), "floating", False, "cublas", False),
}

# name: (reference, bit_identical_to, dots_equal_to, deterministic, batch_invariant, stream workspace?)
CLAIMS = {
    "native": ("dense", None, None, True, True, False),
    "int_gemv": ("quantized", None, None, True, True, False),
    "mmq": ("quantized", None, None, True, True, False),
    "gemv": ("quantized", None, "int_gemv", True, True, False),
    "single": ("quantized", None, "int_gemv", True, True, False),
    "gemv_pair": ("quantized", None, "int_gemv", True, True, False),
    "small_mma": ("quantized", None, "int_gemv", True, True, False),
    "mmq_planes": ("quantized", "mmq", "mmq", True, True, False),
    "mmq_wgmma": ("quantized", "mmq", "mmq", True, True, False),
    "cublas": ("dense", None, None, True, True, True),
    "small_gemm": ("dense", None, None, True, True, False),
}


def test_the_table_facts_dispatch_reads_for_each_path():
    # catches: an M bound moved by one, a layout or counterpart dropped, a deselection lost,
    # the arithmetic or dots of a floating path flipped, a default K multiple changed
    assert set(registry.BY_NAME) == set(FACTS), REPRO + f"paths: {sorted(registry.BY_NAME)}"
    for name, want in FACTS.items():
        p = table.get(name)
        got = (p.kset, p.m_min, p.m_max, p.weight, tuple(p.layouts), p.arithmetic, p.has_dots,
               p.counterpart, bool(p.deselected))
        assert got == want, REPRO + f"{name}: {got} != {want}"
        assert p.k_multiple == 128 and tuple(p.dtypes) == (BF16, FP16), REPRO + name


def test_the_claims_the_suite_checks_each_path_against():
    # catches: a dropped or retargeted bit-identity / equal-dots claim, a flipped reference,
    # deterministic or batch_invariant defaulted off, cuBLAS's stream workspace forgotten
    for name, want in CLAIMS.items():
        p = registry.get(name)
        got = (p.reference, p.bit_identical_to, p.dots_equal_to, p.deterministic, p.batch_invariant,
               bool(p.capture_stream_workspace))
        assert got == want, REPRO + f"{name}: {got} != {want}"


def test_the_runtime_reads_the_suites_table():
    # catches: registry not attaching itself (dispatch would read the bare runtime entries,
    # without the claims, and miss a path the suite adds)
    assert table.all_paths() == registry.PATHS and table.by_name() is registry.BY_NAME, REPRO
    assert table.get("single") is registry.get("single"), REPRO
    assert table.of_module("kernels.single") is registry.get("single"), REPRO


def test_entry_fold_defaults_to_the_gpus_configs():
    # catches: Entry.fold's interpret default flipped (tools that call it without interpret,
    # e.g. tools/tune/prefill_sweep.py, would read the interpreter's configs)
    mod = importlib.import_module("kernels.single")
    gpu, interp = mod.fold(8, 384, 1, interpret=False), mod.fold(8, 384, 1, interpret=True)
    assert gpu != interp, "precondition: the two configs fold differently at (8, 384, 1)"
    assert table.get("single").fold(8, 384, 1) == gpu, REPRO


def test_entry_fold_passes_a_forced_config_on():
    # catches: Entry.fold dropping `config` (a forced config's order read as the picked one's)
    p = table.get("single")
    picked = p.fold(8, 384, 1, interpret=True)
    forced = p.fold(8, 384, 1, interpret=True, config={"GC": 1})    # one group per chunk: one lane
    assert picked["lanes"] == 2 and forced["lanes"] == 1, REPRO + f"{picked} {forced}"
    with pytest.raises(ValueError, match="SPLIT=1"):
        p.fold(8, 384, 1, interpret=True, config={"SPLIT": 1})      # 1 x 2 groups of 3


# ---- kernel sets ----------------------------------------------------------------------------

def test_each_set_in_dispatch_preference_order(monkeypatch):
    # catches: legacy before tuned, a deselected path selected, the exact set not filtered by
    # the proof
    m = kernelsets.members
    assert _names(m("legacy", "interpreter", weight="pq2")) == ["int_gemv", "mmq", "native"], REPRO
    assert _names(m("tuned", "interpreter", weight="pq2")) == [
        "gemv", "single", "gemv_pair", "small_mma", "mmq_wgmma", "int_gemv", "mmq", "native"], REPRO
    assert _names(m("legacy", "interpreter", weight="dense")) == ["cublas"], REPRO
    assert _names(m("tuned", "interpreter", weight="dense")) == ["small_gemm", "cublas"], REPRO
    monkeypatch.setattr(kernelsets, "verified_exact", lambda key: {"gemv", "mmq_planes"})
    assert _names(m("exact", "interpreter", weight="pq2")) == ["gemv", "int_gemv", "mmq", "native"], REPRO
    monkeypatch.setattr(kernelsets, "verified_exact", lambda key: set())
    assert _names(m("exact", "interpreter", weight="pq2")) == ["int_gemv", "mmq", "native"], REPRO


def test_integer_legacy_paths_come_before_the_floating_one_whatever_the_table_order(monkeypatch):
    # catches: the legacy sort key lost or inverted (whatever order a host table lists them in)
    rev = tuple(reversed(registry.PATHS))
    monkeypatch.setattr(registry, "PATHS", rev)
    got = _names(kernelsets.members("legacy", "interpreter", weight="pq2"))
    assert got == ["mmq", "int_gemv", "native"], REPRO + str(got)


def test_verified_file_and_fold_owner_per_backend_key():
    # catches: 'emulate' reading a record of its own, the emulation folding with the
    # interpreter's configs
    f = kernelsets.verified_file
    assert (f("emulate").name, f("interpreter").name, f("sm90").name) == (
        "exact-interpreter.json", "exact-interpreter.json", "exact-sm90.json"), REPRO
    got = [kernelsets.interpret_folds(k) for k in ("interpreter", "emulate", "sm90")]
    assert got == [True, False, False], REPRO + str(got)


def test_a_record_rewritten_with_the_same_size_is_read_again(tmp_path, monkeypatch):
    # catches: the record's cache stamp without the mtime (an edit of equal size is missed)
    monkeypatch.setattr(kernelsets, "VERIFIED_DIR", tmp_path)
    assert kernelsets.record("interpreter") == {}, REPRO
    f = tmp_path / "exact-interpreter.json"
    f.write_text(json.dumps({"paths": {"aa": 1}}))
    os.utime(f, ns=(10**18, 10**18))
    assert kernelsets.record("interpreter") == {"paths": {"aa": 1}}, REPRO
    f.write_text(json.dumps({"paths": {"bb": 1}}))
    os.utime(f, ns=(10**18 + 10**9, 10**18 + 10**9))
    assert kernelsets.record("interpreter") == {"paths": {"bb": 1}}, REPRO


def _entry(name, **kw):
    p = registry.get(name)
    return {"format": 2, "counterpart": p.counterpart, "rule": "proven",
            "sources": kernelsets.sources_digest(name, p.counterpart), **kw}


def test_a_proof_is_held_only_with_every_field_right():
    # catches: any of held's five conditions inverted or dropped
    assert kernelsets.FORMAT == 2, REPRO
    assert kernelsets.held("gemv", _entry("gemv")), REPRO
    for bad in (dict(format=1), dict(rule="refuted"), dict(counterpart="mmq"), dict(sources="0" * 16)):
        assert not kernelsets.held("gemv", _entry("gemv", **bad)), REPRO + str(bad)
    assert not kernelsets.held("nosuch", _entry("gemv")), REPRO
    assert not kernelsets.held("gemv", ["not", "a", "dict"]), REPRO


def test_a_proof_of_a_host_added_path_is_held(register_path, tmp_path, monkeypatch):
    """A path the host's table adds (register_path) with a proven record of its sources as they
    are is held: the record is read against the host's entry, as every other lookup is."""
    from kernels import int_gemv
    e = table.Entry("twin_e", "kernels.twin_e", "tuned", 1, 16, counterpart="int_gemv", description="t")
    register_path(e, int_gemv.run, protocol={"fold": int_gemv.fold}, tol_reason="t")
    for f in (*kernelsets.SHARED_SOURCES, "kernels/int_gemv.py"):      # a source tree with its file
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(kernelsets._ROOT / f, tmp_path / f)
    (tmp_path / "kernels/twin_e.py").write_text("# twin_e's kernel file\n")
    monkeypatch.setattr(kernelsets, "_ROOT", tmp_path)
    kernelsets.clear_cache()
    rec = {"format": 2, "counterpart": "int_gemv", "rule": "proven",
           "sources": kernelsets.sources_digest("twin_e", "int_gemv")}
    assert table.get("twin_e").counterpart == "int_gemv", "precondition: the host table has it"
    assert kernelsets.held("twin_e", rec), REPRO


# ---- fold plans -----------------------------------------------------------------------------

def _fold_as(monkeypatch, fold):
    monkeypatch.setattr(importlib.import_module("kernels.single"), "fold",
                        lambda n, k, m, interpret=None, config=None: fold)
    kernelsets.clear_cache()


def test_a_fold_plan_is_splits_then_lanes_then_groups(monkeypatch):
    # catches: a lane starting at the split's first group, the split's end past the last group,
    # a default of more than one lane, a group size other than 128
    _fold_as(monkeypatch, dict(groups_per_split=3, lanes=2, splits=2))
    got = kernelsets.fold_plan("single", 8, 640, 1, True)
    assert got == (((0, 2), (1,)), ((3,), (4,))), REPRO + str(got)
    _fold_as(monkeypatch, dict(groups_per_split=2, splits=3))
    got = kernelsets.fold_plan("single", 8, 640, 1, True)
    assert got == (((0, 1),), ((2, 3),), ((4,),)), REPRO + str(got)
    _fold_as(monkeypatch, dict(groups_per_split=2))      # no splits: the plan's own count
    got = kernelsets.fold_plan("single", 8, 384, 1, True)
    assert got == (((0, 1),), ((2,),)), REPRO + str(got)


def test_folds_that_prove_nothing_give_no_plan(monkeypatch):
    # catches: a self-contradicting, empty or non-group fold taken as a plan; a floating or
    # dense path's order compared
    for f in (dict(groups_per_split=3, lanes=1, splits=3), None, {}, dict(k_per_split=256, splits=2)):
        _fold_as(monkeypatch, f)
        assert kernelsets.fold_plan("single", 8, 640, 1, True) is None, REPRO + str(f)
    monkeypatch.undo()
    kernelsets.clear_cache()
    assert importlib.import_module("kernels.native").fold(8, 640, 1, interpret=True), "precondition"
    for name, n in (("native", 8), ("small_gemm", 96), ("cublas", 96)):
        assert kernelsets.fold_plan(name, n, 640, 1, True) is None, REPRO + name
    assert not kernelsets.same_fold("native", "cublas", 96, 640, 1, True), REPRO
    assert kernelsets.same_fold("int_gemv", "int_gemv", 8, 640, 1, True), REPRO


# ---- the sources digest ---------------------------------------------------------------------

def test_the_sources_digest_covers_both_paths_and_each_shared_file(tmp_path, monkeypatch):
    # catches: a shared file left out of the digest (a proof not going stale when the Q8, the
    # epilogue or split-K changes), one path's file left out, the digest depending on the order
    root = kernelsets._ROOT
    for f in ("kernels/common.py", "kernels/prepare.py", "kernels/splitk.py", "kernels/single.py",
              "kernels/int_gemv.py", "kernels/gemv.py"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(root / f, tmp_path / f)
    monkeypatch.setattr(kernelsets, "_ROOT", tmp_path)

    def digest(*names):
        kernelsets.clear_cache()
        return kernelsets.sources_digest(*names)

    base = digest("single", "int_gemv")
    assert len(base) == 16 and int(base, 16) >= 0, REPRO + base
    assert digest("int_gemv", "single") == base, REPRO
    assert digest("gemv", "int_gemv") != base, REPRO
    for f in ("kernels/common.py", "kernels/prepare.py", "kernels/splitk.py", "kernels/single.py",
              "kernels/int_gemv.py"):
        text = (tmp_path / f).read_text()
        (tmp_path / f).write_text(text + "\n# touched\n")
        assert digest("single", "int_gemv") != base, REPRO + f"{f} changed, digest did not"
        (tmp_path / f).write_text(text)
    (tmp_path / "kernels/gemv.py").write_text("# another path's file\n")
    assert digest("single", "int_gemv") == base, REPRO + "gemv.py is not single's or int_gemv's"


# ---- dispatch's cached choice ---------------------------------------------------------------

def _resolve(m, kset="tuned", layout="prepared", dtype=BF16, k=128, n=8):
    w = inputs.ternary_weight(n, k, seed=1, layout=layout)
    return dispatch.resolve(m, w, torch.zeros(m, k, dtype=dtype), kset).name


def test_one_cache_serves_every_m_and_layout_with_its_own_path():
    # catches: the M ranges or the layout missing from the cache key (no cache clear between)
    got = [_resolve(1), _resolve(2), _resolve(17), _resolve(17, layout="raw"), _resolve(16),
           _resolve(1, kset="legacy"), _resolve(2048, kset="legacy")]
    assert got == ["gemv", "gemv_pair", "mmq_wgmma", "mmq", "small_mma", "int_gemv", "mmq"], REPRO + str(got)


def test_the_exact_set_checks_the_fold_at_the_calls_n_and_m(monkeypatch):
    # catches: the call's (n, k, m) missing from the exact set's cache key (a proof whose fold
    # matches at one N reused for another N of the same K and M), or the fold asked at another M
    monkeypatch.setattr(kernelsets, "verified_exact", lambda key: {"single"})
    monkeypatch.setattr(kernelsets, "same_fold", lambda a, b, n, k, m, interpret: (a, b, n) == ("single", "int_gemv", 8))
    got = [_resolve(1, kset="exact", n=8), _resolve(1, kset="exact", n=16), _resolve(1, kset="exact", n=8)]
    assert got == ["single", "int_gemv", "single"], REPRO + str(got)
    monkeypatch.setattr(kernelsets, "verified_exact", lambda key: {"small_mma"})
    monkeypatch.setattr(kernelsets, "same_fold", lambda a, b, n, k, m, interpret: m == 4)
    dispatch.clear_cache()
    got = [_resolve(4, kset="exact"), _resolve(5, kset="exact")]
    assert got == ["small_mma", "int_gemv"], REPRO + str(got)


def test_the_cache_keys_on_the_dtype_and_a_host_paths_m_range(register_path, monkeypatch):
    # catches: the dtype missing from the cache key; the M ranges read from the runtime's own
    # entries, not the host's table
    from kernels import int_gemv
    e = table.Entry("bf_only", "kernels.bf_only", "tuned", 3, 5, dtypes=(BF16,), counterpart="int_gemv",
                    description="a bf16-only path for M 3-5 (tests/test_path_table_edges.py)")
    register_path(e, int_gemv.run, protocol={"fold": int_gemv.fold}, tol_reason="t")
    monkeypatch.setenv("PQ2_PATH_BF_ONLY", "on")
    got = [_resolve(4), _resolve(4, dtype=FP16), _resolve(2), _resolve(3), _resolve(6)]
    assert got == ["bf_only", "small_mma", "gemv_pair", "bf_only", "small_mma"], REPRO + str(got)


def test_an_off_switch_never_forces_and_an_on_switch_comes_first(monkeypatch):
    # catches: 'off' taken as forcing, 'on' not preferred over the set's choice
    monkeypatch.setenv("PQ2_PATH_SMALL_MMA", "off")
    assert _names(dispatch.candidates("tuned", "pq2", "interpreter")) == [
        "gemv", "single", "gemv_pair", "mmq_wgmma", "int_gemv", "mmq", "native"], REPRO
    monkeypatch.setenv("PQ2_PATH_NATIVE", "on")
    assert _names(dispatch.candidates("tuned", "pq2", "interpreter"))[:2] == ["native", "gemv"], REPRO
    assert _resolve(4) == "native", REPRO


def test_the_spec_dispatch_follows_is_the_blocks_else_the_environments(monkeypatch):
    # catches: current_spec() giving nothing outside a use block
    from kernels.spec import KernelSpec
    monkeypatch.setenv("PQ2_KERNELS", "legacy")
    assert dispatch.current_spec() == KernelSpec("legacy"), REPRO
    with dispatch.use(KernelSpec("exact", (("single", False),))):
        assert dispatch.current_spec() == KernelSpec("exact", (("single", False),)), REPRO
    assert dispatch.current_spec() == KernelSpec("legacy"), REPRO


def test_leading_dims_of_x_are_accepted_by_the_contract():
    # catches: pq2_matmul's contract asking for a rank-2 x (its docstring: x [..., K])
    w = inputs.ternary_weight(8, 128, seed=1)
    dispatch.validate(torch.zeros(2, 3, 128, dtype=BF16), w)
    with pytest.raises(ValueError, match="scalar"):
        dispatch.validate(torch.zeros((), dtype=BF16), w)


def test_registry_paths_filters_by_set_and_weight():
    # catches: a filter applied when not asked for, or ignored when asked for
    assert registry.paths() == list(registry.PATHS), REPRO
    assert _names(registry.paths(kset="legacy")) == ["native", "int_gemv", "mmq", "cublas"], REPRO
    assert _names(registry.paths(weight="dense")) == ["cublas", "small_gemm"], REPRO
    assert _names(registry.paths(kset="tuned", weight="dense")) == ["small_gemm"], REPRO
    assert _names(table.paths(kset="legacy", weight="pq2")) == ["native", "int_gemv", "mmq"], REPRO


def test_only_the_emulate_backend_on_cpu_runs_the_emulation(monkeypatch, cpu_only):
    # catches: the emulation run on the interpreter backend, or the kernel on the emulate one
    from kernels import backend, emulation
    seen = []

    def planted(name, x, w):
        seen.append(name)
        return torch.zeros(x.shape[0], w.n, dtype=x.dtype)

    monkeypatch.setattr(emulation, "emulate", planted)
    w = inputs.ternary_weight(8, 128, seed=1)
    x = inputs.activations(1, 128, seed=2)
    with backend.using_cpu_backend("emulate"):
        y = dispatch.pq2_matmul(x, w, kernels="legacy")
    assert seen == ["int_gemv"] and y.shape == (1, 8) and not y.any(), REPRO + str(seen)
    with backend.using_cpu_backend("interpreter"):
        y = dispatch.pq2_matmul(x, w, kernels="legacy")
    assert seen == ["int_gemv"], REPRO + "the interpreter backend ran the emulation"
