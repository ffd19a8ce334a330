"""The Python API's bad-input contract (issue 24, classes 6 and 7), table-driven like
tests/test_cli_contract.py: the PQ2_* environment checked by pq2_matmul itself, a weight's bytes
changed after a first call (through torch, and behind torch's version counter through a numpy
view), and constructor or attribute misuse answered by a clear TypeError/AttributeError/ValueError
naming the problem.

Reproduce any row: .venv/bin/python -m pytest -q tests/test_api_contract.py -k '<row id>'"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels import backend, dispatch
from kernels.dispatch import pq2_matmul
from kernels.format import PQ2FormatError, PQ2Weight
from pq2verify import inputs
from pq2verify.bits import same_bits

ROOT = Path(__file__).parents[1]
N, K = 64, 256


def _dev(device):
    return "cuda" if device == "cuda" else "cpu"


# --- class 6: the environment, checked by the API too ---------------------------------------
ENV_BAD = [
    ("PQ2_KERNEL", "legacy", r"PQ2_KERNEL: not a variable pq2verify reads; did you mean PQ2_KERNELS\?"),
    ("PQ2_PATHS_SINGLE", "off", r"PQ2_PATHS_SINGLE: not a variable pq2verify reads; did you mean PQ2_PATH_SINGLE\?"),
    ("PQ2_PATH_GEMV_", "off", r"PQ2_PATH_GEMV_: no such path"),
    ("PQ2_PATH_SINGLE", "", r"PQ2_PATH_SINGLE='': expected on or off \(an empty value is not 'unset'"),
    ("PQ2_PATH_X", "", r"PQ2_PATH_X: no such path"),
    ("PQ2_KERNELS", "", r"PQ2_KERNELS='': "),
    ("pq2_kernels", "legacy", r"pq2_kernels: the variable is PQ2_KERNELS"),
    ("PQ2_EMULATE_GEMM", "", r"PQ2_EMULATE_GEMM='': an empty value"),
]


@pytest.mark.parametrize("var,value,pattern", ENV_BAD, ids=[f"{v}={x!r}" for v, x, _ in ENV_BAD])
@pytest.mark.parametrize("forced", [None, "int_gemv"], ids=["chosen", "forced-path"])
def test_pq2_matmul_refuses_a_bad_environment(var, value, pattern, forced, monkeypatch, device):
    """PQ2_KERNEL=legacy used to run tuned silently; every call (a forced path too) refuses it,
    again on the next call, and the call works once the variable is gone."""
    dev = _dev(device)
    w = inputs.ternary_weight(N, K, seed=1, device=dev)
    x = inputs.activations(1, K, seed=2, device=dev)
    pq2_matmul(x, w, path=forced)                      # a first call caches the choice
    monkeypatch.setenv(var, value)
    for _ in range(2):
        with pytest.raises(ValueError, match=pattern):
            pq2_matmul(x, w, path=forced)
    monkeypatch.delenv(var)
    pq2_matmul(x, w, path=forced)


def test_a_valid_change_of_the_environment_is_followed(monkeypatch, device):
    dev = _dev(device)
    w = inputs.ternary_weight(N, K, seed=1, device=dev)
    x = inputs.activations(1, K, seed=2, device=dev)
    with dispatch.trace() as t:
        pq2_matmul(x, w)
        monkeypatch.setenv("PQ2_KERNELS", "legacy")
        pq2_matmul(x, w)
        monkeypatch.setenv("PQ2_KERNELS", "tuned")
        monkeypatch.setenv("PQ2_PATH_GEMV", "off")
        pq2_matmul(x, w)
    assert list(t.elements()) == ["gemv", "int_gemv", "single"], t


# --- class 6: a weight's bytes changed after a first call -----------------------------------
def _write_torch(w, src):
    w.data.copy_(src)                   # torch counts it (the version counter)


def _write_numpy(w, src):
    w.data.numpy()[...] = src.numpy()   # behind torch's counter: only the bytes show it


WRITES = {"torch": _write_torch, "numpy": _write_numpy}


def _cases():
    for how in WRITES:
        for layout in ("raw", "prepared"):
            for cpu_backend in ("emulate", "interpreter"):
                yield pytest.param(how, layout, cpu_backend, id=f"{how}-{layout}-{cpu_backend}")


@pytest.mark.parametrize("how,layout,cpu_backend", list(_cases()))
def test_a_weight_written_after_a_call_gives_the_new_result(how, layout, cpu_backend, device):
    """The class docstring of PQ2Weight: the next call sees the new bytes (bits equal to a
    fresh weight holding them), and code 3 written in is refused. On a GPU the numpy route does
    not exist (GPU bytes have no numpy view); a torch write is seen there too."""
    if device == "cuda" and how == "numpy":
        pytest.skip("GPU tensors have no numpy view")
    if device == "cuda" and cpu_backend == "interpreter":
        pytest.skip("one GPU run per case is enough (the CPU backend does not apply)")
    dev = _dev(device)
    w = inputs.ternary_weight(N, K, seed=1, device=dev, layout=layout)
    other = inputs.ternary_weight(N, K, seed=5, device=dev, layout=layout)
    x = inputs.activations(2, K, seed=2, device=dev)
    with backend.using_cpu_backend(cpu_backend):
        before = pq2_matmul(x, w)
        want = pq2_matmul(x, PQ2Weight(other.data.clone(), N, K, layout))
        assert not same_bits(before, want)              # the two weights give different results
        src = other.data.cpu() if how == "numpy" else other.data
        WRITES[how](w, src)
        assert same_bits(pq2_matmul(x, w), want), f"{how} write after a first call: the old weight's result"
        # code 3 written in after a call is refused at the next one, never consumed
        bad = w.data.clone()
        bad.view(-1)[5 if layout == "prepared" else 2 + 5] = 0xFF   # row 0, code byte 5 of block 0
        WRITES[how](w, bad.cpu() if how == "numpy" else bad)
        with pytest.raises(PQ2FormatError, match=r"^weight: code 3 in row 0"):
            pq2_matmul(x, w)


def test_an_inference_tensor_is_refused_as_weight_data(device):
    """An inference tensor keeps no version counter: a write to it after the first call could
    not be seen on a GPU, so it is refused on every device, naming the cure."""
    dev = _dev(device)
    w = inputs.ternary_weight(N, K, seed=1, device=dev)
    with torch.inference_mode():
        data = w.data.clone()
    with pytest.raises(TypeError, match=r"^weight: data is an inference tensor .* build the weight outside"):
        PQ2Weight(data, N, K, "prepared")
    with pytest.raises(TypeError, match=r"^weight: data is an inference tensor"):
        PQ2Weight.from_prepared(data, N, K)
    with pytest.raises(TypeError, match=r"^weight: data is an inference tensor"):
        w.data = data


def test_a_call_inside_inference_mode_still_works(device):
    """Refusing inference tensors as weight data does not refuse inference mode itself."""
    dev = _dev(device)
    w = inputs.ternary_weight(N, K, seed=1, device=dev)
    x = inputs.activations(2, K, seed=2, device=dev)
    want = pq2_matmul(x, w)
    with torch.inference_mode():
        assert same_bits(pq2_matmul(x, w), want)


# --- class 7: constructor and attribute misuse ----------------------------------------------
def _data():
    return inputs.ternary_weight(N, K, seed=1).data.clone()


BAD_BUILD = [
    ("float-K", lambda: PQ2Weight(_data(), N, 256.0, "prepared"), TypeError, r"^weight: K must be an int, got float 256\.0$"),
    ("float-N", lambda: PQ2Weight(_data(), 64.0, K, "prepared"), TypeError, r"^weight: N must be an int, got float 64\.0$"),
    ("bool-N", lambda: PQ2Weight(_data(), True, K, "prepared"), TypeError, r"^weight: N must be an int, got bool True$"),
    ("str-K", lambda: PQ2Weight(_data(), N, "256", "prepared"), TypeError, r"^weight: K must be an int, got str '256'$"),
    ("list-data", lambda: PQ2Weight([0] * 10, N, K, "prepared"), TypeError, r"^weight: data must be a uint8 torch.Tensor, got list$"),
    ("negative-N", lambda: PQ2Weight(_data(), -64, K, "prepared"), PQ2FormatError, r"^weight: N=-64 is negative$"),
    ("zero-K", lambda: PQ2Weight(_data(), N, 0, "prepared"), PQ2FormatError, r"^weight: K=0 is not a positive multiple of 128$"),
]


@pytest.mark.parametrize("build,exc,pattern", [b[1:] for b in BAD_BUILD], ids=[b[0] for b in BAD_BUILD])
def test_a_bad_constructor_argument_is_named(build, exc, pattern):
    with pytest.raises(exc, match=pattern):
        build()


BAD_SET = [
    ("n", 32, AttributeError, r"^PQ2Weight\.n is read-only: it describes the bytes; build a new weight"),
    ("k", 128, AttributeError, r"^PQ2Weight\.k is read-only"),
    ("layout", "raw", AttributeError, r"^PQ2Weight\.layout is read-only"),
    ("data", torch.zeros(10, dtype=torch.uint8), PQ2FormatError, r"^weight: new data must be 4352 uint8 bytes \(N=64, K=256\), got 10"),
    ("data", "bytes", TypeError, r"^weight: data must be a uint8 torch.Tensor, got str$"),
]


@pytest.mark.parametrize("name,value,exc,pattern", BAD_SET, ids=[f"{b[0]}={type(b[1]).__name__}" for b in BAD_SET])
def test_a_bad_attribute_assignment_is_named_and_changes_nothing(name, value, exc, pattern, device):
    dev = _dev(device)
    w = inputs.ternary_weight(N, K, seed=1, device=dev)
    x = inputs.activations(2, K, seed=2, device=dev)
    want = pq2_matmul(x, w)
    with pytest.raises(exc, match=pattern):
        setattr(w, name, value.to(dev) if isinstance(value, torch.Tensor) else value)
    assert (w.n, w.k, w.layout) == (N, K, "prepared") and same_bits(pq2_matmul(x, w), want)


@pytest.mark.parametrize("m", [1, 4, 20])
def test_a_dense_weight_with_no_columns_is_refused(m, device):
    dev = _dev(device)
    x = torch.zeros(m, 0, dtype=torch.bfloat16, device=dev)
    w = torch.zeros(8, 0, dtype=torch.bfloat16, device=dev)
    with pytest.raises(ValueError, match=r"^w: a dense weight needs K >= 1 columns, got shape \(8, 0\)$"):
        pq2_matmul(x, w)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: --device cuda is valid here")
def test_device_cuda_without_a_gpu_is_a_usage_error():
    """pytest --device cuda on a machine without a GPU: pytest's usage error (exit 4) naming
    the problem, not an INTERNALERROR traceback."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--device", "cuda", "-q",
                        "tests/test_api_contract.py", "-k", "float"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 4 and "INTERNALERROR" not in out, out[-2000:]
    assert "ERROR: --device cuda: device: cuda was asked for but torch sees no CUDA GPU" in out, out[-2000:]
