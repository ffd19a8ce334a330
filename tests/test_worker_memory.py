"""The GPU memory cap of pytest-xdist workers that share a GPU (conftest.worker_memory_fraction):
the shares of the workers on one GPU never add up to more than the run's share, a worker alone
on its GPU is not capped, and a share outside (0, 1] is refused."""
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("root_conftest", Path(__file__).resolve().parents[1] / "conftest.py")
root = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(root)


@pytest.mark.parametrize("workers,devices", [(2, 1), (9, 1), (12, 1), (13, 4), (16, 8), (3, 2)])
def test_shares_on_one_gpu_add_up_to_the_run_share_at_most(workers, devices):
    frac = root.worker_memory_fraction(workers, devices, 0.9)
    # worker i runs on GPU i % devices (conftest's round robin): count the busiest GPU's workers
    busiest = max(sum(1 for i in range(workers) if i % devices == d) for d in range(devices))
    assert busiest > 1 and frac is not None
    assert busiest * frac <= 0.9 + 1e-12
    assert frac >= 0.9 / workers        # never below an even split of one GPU


@pytest.mark.parametrize("workers,devices", [(1, 1), (4, 4), (3, 8)])
def test_a_worker_alone_on_its_gpu_is_not_capped(workers, devices):
    assert root.worker_memory_fraction(workers, devices, 0.9) is None


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_a_share_outside_the_unit_interval_is_refused(share):
    with pytest.raises(ValueError, match="PQ2_TEST_GPU_SHARE"):
        root.worker_memory_fraction(4, 1, share)
