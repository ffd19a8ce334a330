"""Kernel sets, per-path switches, the dispatch trace, and their errors."""
import re

import pytest
import torch

from kernels import dispatch, sets as kernelsets
from kernels.dispatch import pq2_matmul
from pq2verify import inputs, registry

KEY = "interpreter"


def _names(kset, kind="pq2"):
    return [p.name for p in dispatch.candidates(kset, kind, KEY)]


def _resolve(m, kset, layout="prepared", dtype=torch.bfloat16):
    w = inputs.ternary_weight(8, 128, seed=1, layout=layout)
    x = torch.zeros(m, 128, dtype=dtype)
    return dispatch.resolve(m, w, x, kset).name


@pytest.mark.parametrize("m,legacy,tuned", [(1, "int_gemv", "gemv"), (2, "int_gemv", "gemv_pair"),
                                            (3, "int_gemv", "small_mma"), (16, "int_gemv", "small_mma"), (17, "mmq", "mmq_wgmma"),
                                            (2048, "mmq", "mmq_wgmma")])
def test_sets_choose_by_m(m, legacy, tuned):
    assert _resolve(m, "legacy") == legacy
    assert _resolve(m, "tuned") == tuned


@pytest.mark.parametrize("m", [17, 2048])
def test_prefill_on_raw_weights_falls_back_to_mmq(m):
    """mmq_wgmma reads the prepared layout only (TMA needs the code plane's 16-byte rows)."""
    assert _resolve(m, "tuned", layout="raw") == "mmq"


def test_deselected_tuned_path_stays_reachable_by_its_switch(monkeypatch):
    assert registry.get("mmq_planes").deselected  # measured slower than mmq on the H200
    monkeypatch.setenv("PQ2_PATH_MMQ_PLANES", "on")
    assert _resolve(17, "tuned") == "mmq_planes"
    assert _resolve(17, "legacy") == "mmq_planes"


@pytest.fixture(autouse=True)
def _fresh_resolution():
    dispatch.clear_cache()
    yield
    dispatch.clear_cache()


def test_exact_set_uses_only_verified_paths(monkeypatch):
    monkeypatch.setattr(kernelsets, "verified_exact", lambda key: set())
    assert _resolve(1, "exact") == "int_gemv"
    assert _resolve(4, "exact") == "int_gemv"
    monkeypatch.setattr(kernelsets, "verified_exact", lambda key: {"single"})
    monkeypatch.setattr(kernelsets, "same_fold", lambda *a: False)
    dispatch.clear_cache()
    assert _resolve(1, "exact") == "int_gemv"      # proven, but its fold differs for this call
    monkeypatch.setattr(kernelsets, "same_fold", lambda *a: True)
    dispatch.clear_cache()
    assert _resolve(1, "exact") == "single"
    assert _resolve(4, "exact") == "int_gemv"


def test_path_switch_off_falls_back_and_on_forces(monkeypatch):
    monkeypatch.setenv("PQ2_PATH_GEMV", "off")
    assert _resolve(1, "tuned") == "single"     # the next tuned path serving M=1
    monkeypatch.setenv("PQ2_PATH_SINGLE", "off")
    assert _resolve(1, "tuned") == "int_gemv"
    monkeypatch.setenv("PQ2_PATH_INT_GEMV", "off")
    assert _resolve(1, "tuned") == "native"
    monkeypatch.delenv("PQ2_PATH_SINGLE")
    monkeypatch.delenv("PQ2_PATH_GEMV")
    monkeypatch.delenv("PQ2_PATH_INT_GEMV")
    monkeypatch.setenv("PQ2_PATH_SMALL_MMA", "on")
    assert _resolve(4, "legacy") == "small_mma"


def test_unknown_set_and_switches_are_errors(monkeypatch):
    with pytest.raises(ValueError, match="unknown kernel set"):
        dispatch.kernel_set("fast")
    monkeypatch.setenv("PQ2_KERNELS", "tunned")
    with pytest.raises(ValueError, match="PQ2_KERNELS='tunned'"):
        dispatch.kernel_set()
    monkeypatch.delenv("PQ2_KERNELS")
    monkeypatch.setenv("PQ2_PATH_SINGEL", "off")
    with pytest.raises(ValueError, match="PQ2_PATH_SINGEL: no such path"):
        dispatch.switches()
    monkeypatch.delenv("PQ2_PATH_SINGEL")
    monkeypatch.setenv("PQ2_PATH_SINGLE", "maybe")
    with pytest.raises(ValueError, match="expected on or off"):
        dispatch.switches()


def test_dense_weights_dispatch_to_dense_paths():
    w = torch.zeros(96, 128, dtype=torch.bfloat16)
    assert dispatch.resolve(4, w, torch.zeros(4, 128, dtype=torch.bfloat16), "tuned").name == "small_gemm"
    assert dispatch.resolve(4, w, torch.zeros(4, 128, dtype=torch.bfloat16), "legacy").name == "cublas"
    assert dispatch.resolve(64, w, torch.zeros(64, 128, dtype=torch.bfloat16), "tuned").name == "cublas"


def test_every_path_is_reachable_from_some_set_or_switch(monkeypatch):
    served = {_resolve(m, s) for m in (1, 2, 17) for s in ("legacy", "tuned")}
    for p in registry.paths(weight="pq2"):
        if p.name not in served:
            monkeypatch.setenv(p.env, "on")
            assert _resolve(p.m_min, "tuned") == p.name
            monkeypatch.delenv(p.env)


def test_trace_proves_which_path_ran(device):
    dev = "cuda" if device == "cuda" else "cpu"
    w = inputs.ternary_weight(64, 128, seed=2, device=dev)
    x = inputs.activations(2, 128, seed=3, device=dev)
    with dispatch.trace() as t:
        pq2_matmul(x, w, kernels="legacy")
        pq2_matmul(x, w, kernels="tuned")
        pq2_matmul(x[:1], w, kernels="tuned")
    assert t == {"int_gemv": 1, "gemv_pair": 1, "gemv": 1}


def test_forced_path_outside_its_range_is_an_error():
    w = inputs.ternary_weight(8, 128, seed=1)
    with pytest.raises(ValueError, match=r"path='single' serves M in 1, got M=2"):
        pq2_matmul(torch.zeros(2, 128, dtype=torch.bfloat16), w, path="single")


def test_m_zero_returns_empty_without_a_launch():
    w = inputs.ternary_weight(8, 128, seed=1)
    with dispatch.trace() as t:
        y = pq2_matmul(torch.zeros(0, 128, dtype=torch.bfloat16), w)
    assert y.shape == (0, 8) and not t


def test_cached_resolution_follows_switches_set_later(monkeypatch):
    assert _resolve(1, "tuned") == "gemv"
    monkeypatch.setenv("PQ2_PATH_GEMV", "off")
    assert _resolve(1, "tuned") == "single"
    monkeypatch.delenv("PQ2_PATH_GEMV")
    assert _resolve(1, "tuned") == "gemv"
    monkeypatch.setenv("PQ2_PATH_SINGLE_", "off")
    with pytest.raises(ValueError, match="no such path"):
        _resolve(1, "tuned")


def test_nested_traces_with_equal_counts_close_cleanly():
    with dispatch.trace() as outer:
        with dispatch.trace() as inner:
            pass
        assert inner == outer
    assert not any(t is outer or t is inner for t in dispatch._traces)


def test_switch_names_are_upper_case_only(monkeypatch):
    """PQ2_PATH_single=off used to be accepted and ignored: single still served M=1."""
    monkeypatch.setenv("PQ2_PATH_single", "off")
    with pytest.raises(ValueError, match="PQ2_PATH_single: switch names are upper case; use PQ2_PATH_SINGLE"):
        dispatch.switches()
    with pytest.raises(ValueError, match="use PQ2_PATH_SINGLE"):
        _resolve(1, "tuned")
    with pytest.raises(ValueError, match="use PQ2_PATH_SINGLE"):
        dispatch.validate_env()


@pytest.mark.parametrize("var,value,names", [("PQ2_KERNELS", "bogus", "PQ2_KERNELS='bogus'"),
                                             ("PQ2_KERNELS", "", "PQ2_KERNELS=''"),
                                             ("Pq2_Kernels", "tuned", "Pq2_Kernels: the variable is PQ2_KERNELS"),
                                             ("PQ2_PATH_X", "on", "PQ2_PATH_X: no such path"),
                                             ("PQ2_PATH_MMQ", "maybe", "PQ2_PATH_MMQ='maybe': expected on or off")])
def test_validate_env_names_the_variable(var, value, names, monkeypatch):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=re.escape(names)):
        dispatch.validate_env()


def test_a_typo_swapped_for_another_variable_is_refused(monkeypatch):
    """5f06600 rescanned the environment when its count changed: one variable removed and a
    typo'd switch added (same count) returned the cached path unrefused."""
    monkeypatch.setenv("PQ2VERIFY_TEST_UNRELATED", "1")
    assert _resolve(1, "tuned") == "gemv"
    monkeypatch.delenv("PQ2VERIFY_TEST_UNRELATED")
    monkeypatch.setenv("PQ2_PATH_GEMV_", "off")
    for _ in range(2):          # and again: a refusal is not cached as a pass
        with pytest.raises(ValueError, match="PQ2_PATH_GEMV_: no such path"):
            _resolve(1, "tuned")
    monkeypatch.delenv("PQ2_PATH_GEMV_")
    assert _resolve(1, "tuned") == "gemv"


def test_env_key_is_the_pq2_variables_names_and_values(monkeypatch):
    """The cache key is the (name, value) pairs of the PQ2_* variables: a value changed under
    the same names changes it, an unrelated variable does not."""
    base = dispatch.env_key()
    monkeypatch.setenv("PQ2_PATH_GEMV", "off")
    off = dispatch.env_key()
    assert ("PQ2_PATH_GEMV", "off") in off and set(off) - set(base) == {("PQ2_PATH_GEMV", "off")}
    monkeypatch.setenv("PQ2_PATH_GEMV", "on")
    assert ("PQ2_PATH_GEMV", "on") in dispatch.env_key()
    assert _resolve(1, "tuned") == "gemv"
    monkeypatch.setenv("PQ2_PATH_GEMV", "off")
    assert _resolve(1, "tuned") == "single"
    monkeypatch.setenv("PQ2VERIFY_TEST_UNRELATED", "1")
    assert dispatch.env_key() == off


def test_env_key_costs_microseconds():
    """It runs on every pq2_matmul call: an unchanged environment is compared, not rescanned."""
    import timeit
    dispatch.env_key()
    per_call = min(timeit.repeat(dispatch.env_key, number=2000, repeat=5)) / 2000
    assert per_call < 20e-6, f"env_key took {per_call * 1e6:.1f} us a call"
