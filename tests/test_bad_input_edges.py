"""The runtime's bad-input contract (kernels/validate.py) at its edges: inputs just inside what
it allows must pass and those just outside must be refused, with the reason named. Each test was
written against a fault planted in validate.py that the rest of the suite let pass."""
import dataclasses
import types

import pytest
import torch

from kernels import table, validate
from pq2verify import inputs

HERE = ".venv/bin/python -m pytest -q -p no:randomly 'tests/test_bad_input_edges.py::{}'"


def repro(name: str) -> str:
    return "reproduce: " + HERE.format(name)


def test_a_vector_is_an_activation_where_rank_2_is_not_required():
    """pq2_matmul takes x [..., K]: rank 1 (one row) is allowed there, rank 0 never."""
    validate.activations(torch.zeros(128, dtype=torch.bfloat16), rank2=False)
    with pytest.raises(ValueError, match="scalar"):
        validate.activations(torch.zeros((), dtype=torch.bfloat16), rank2=False)
    with pytest.raises(ValueError, match="rank 2"):
        validate.activations(torch.zeros(128, dtype=torch.bfloat16))


@pytest.mark.parametrize("cc, refused", [((8, 9), True), ((9, 0), False), ((10, 0), False)])
def test_a_path_needing_a_newer_gpu_is_refused_on_an_older_one(monkeypatch, cc, refused):
    """An entry with min_cc (9, 0) on a CUDA x: refused below sm_90, served at and above it. The
    GPU is a stand-in (x names a CUDA device, the capability is patched), so this runs anywhere."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: cc)
    p = dataclasses.replace(table.get("mmq_wgmma"), min_cc=(9, 0))
    x = types.SimpleNamespace(dtype=torch.bfloat16, shape=(32, 256), device=torch.device("cuda"))
    w = inputs.ternary_weight(64, 256, seed=1)
    why = validate.unfit(p, 32, x, w)
    assert (why is not None) == refused, repro("test_a_path_needing_a_newer_gpu_is_refused_on_an_older_one") + f": {why}"
    if refused:
        assert why[0] is ValueError and "needs compute capability (9, 0)" in why[1], why
    # the same x on the CPU: the capability is not asked
    cpu = types.SimpleNamespace(dtype=torch.bfloat16, shape=(32, 256), device=torch.device("cpu"))
    assert validate.unfit(p, 32, cpu, w) is None


def test_a_single_output_column_may_have_any_stride():
    """Unit stride along N is needed only where there are two columns or more: an out of shape
    [M, 1] with stride (1, 4) (a column of a transposed buffer) is fine; [M, 2] with stride (1, 4)
    is not. dots=, with has_dots left at its default, is accepted when well formed."""
    x = torch.zeros(4, 128, dtype=torch.bfloat16)
    column = torch.empty(1, 4, dtype=torch.bfloat16).t()
    assert column.shape == (4, 1) and column.stride(1) == 4
    validate.buffers(x, 1, column)
    two = torch.empty(2, 4, dtype=torch.bfloat16).t()
    with pytest.raises(ValueError, match="unit stride along N"):
        validate.buffers(x, 2, two)
    validate.buffers(x, 3, None, torch.zeros(4, 3, 1, dtype=torch.int32), groups=1)


def test_a_wrapper_checks_by_default_and_sizes_a_dense_output_by_rows():
    """kernel_out checks unless told not to; with no out, the output is [M, N], N the dense
    weight's rows (96 here, K = 256)."""
    x = torch.zeros(2, 256, dtype=torch.bfloat16)
    w = torch.zeros(96, 256, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="dtype"):
        validate.kernel_out("small_gemm", x.float(), w)
    y = validate.kernel_out("small_gemm", x, w)
    assert y.shape == (2, 96), repro("test_a_wrapper_checks_by_default_and_sizes_a_dense_output_by_rows")


def test_an_empty_batch_needs_no_unit_stride_along_k():
    """M = 0: nothing is read, so x's strides are not judged; M = 2 with the same layout is
    refused."""
    w = inputs.ternary_weight(64, 128, seed=1)
    x0 = torch.empty_strided((0, 128), (1, 2), dtype=torch.bfloat16)
    assert x0.shape == (0, 128) and x0.stride(1) != 1
    validate.kernel_args("int_gemv", x0, w)
    x2 = torch.zeros(128, 2, dtype=torch.bfloat16).t()
    with pytest.raises(ValueError, match="unit stride along K"):
        validate.kernel_args("int_gemv", x2, w)
