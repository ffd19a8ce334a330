"""pytest set-up: the device option (auto: CUDA if present, else the CPU with Triton's
interpreter, which must be chosen before any kernel module is imported), GPU-only skips, the
workers' thread pools under -n, and a guard that no test changes the process's kernel mode
(tests run in random order)."""
import os

import pytest


def pytest_addoption(parser):
    parser.addoption("--device", default="auto", choices=("auto", "cuda", "cpu"),
                     help="cuda, or cpu with TRITON_INTERPRET=1 (default: cuda if present)")


THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _share_cores(config) -> None:
    """Under `pytest -n N`, each worker's torch/BLAS thread pool gets cores // N threads: with a
    full-size pool per worker, idle pool threads spin on the cores the other workers need (on 2
    cores, -n 2 took 1.4-1.5x as long on the interpreter-bound tests). Set in the controller
    before the workers start, so they inherit it; a value the user set is kept. Only the thread
    count changes, never what a test runs."""
    n = getattr(config.option, "numprocesses", None)
    if os.environ.get("PYTEST_XDIST_WORKER") or not isinstance(n, int) or n < 1:
        return
    for var in THREAD_VARS:
        os.environ.setdefault(var, str(max(1, (os.cpu_count() or 1) // n)))


def worker_memory_fraction(workers: int, devices: int, share: float) -> float | None:
    """The fraction of its GPU's memory one of `workers` pytest-xdist workers may hold when they
    share `devices` GPUs round robin and the whole run may use `share` of each: None when a
    worker has its GPU alone. Without a cap each worker's caching allocator keeps what its
    largest case freed, and whether a case finds memory then depends on which cases the other
    workers ran before (69 lm_head cases ran out of memory under -n 12 in one order and passed
    in another). Under the cap a worker's cache is given back before it would exceed its share,
    so a case either fits its share in every order or fails in every order."""
    per_gpu = -(-workers // max(1, devices))
    if per_gpu <= 1:
        return None
    if not 0.0 < share <= 1.0:
        raise ValueError(f"PQ2_TEST_GPU_SHARE={share}: expected a fraction in (0, 1]")
    return share / per_gpu


def pytest_configure(config):
    from kernels import backend
    _share_cores(config)
    try:
        config._pq2_device = backend.select(config.getoption("--device"))
    except RuntimeError as e:     # --device cuda without a GPU: a usage error, not an INTERNALERROR
        raise pytest.UsageError(f"--device {config.getoption('--device')}: {e}; run without --device "
                                "(or --device cpu) to use Triton's interpreter") from None
    worker = os.environ.get("PYTEST_XDIST_WORKER")      # pytest -n N (pytest-xdist): gw0, gw1, ...
    if config._pq2_device == "cuda" and worker:
        # one GPU per worker, round robin; every test allocates on the current device
        import torch
        torch.cuda.set_device(int(worker.removeprefix("gw")) % torch.cuda.device_count())
        # the rest of each GPU's memory is left to CUDA contexts (about 0.5 GB a process) and to
        # whatever runs beside the suite
        frac = worker_memory_fraction(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")),
                                      torch.cuda.device_count(),
                                      float(os.environ.get("PQ2_TEST_GPU_SHARE", "0.9")))
        if frac is not None:
            torch.cuda.set_per_process_memory_fraction(frac)


def pytest_collection_modifyitems(config, items):
    if config._pq2_device == "cuda":
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run with --device cuda on a GPU runner)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def device(request):
    return request.config._pq2_device


@pytest.fixture(autouse=True)
def _kernel_mode_unchanged():
    """A test that changes the interpreter mode, the CPU backend or the device selection, or
    imports a kernel module in the other mode, would break whatever runs after it: fail that
    test (naming what changed) and put the mode back, so the next test starts clean."""
    from kernels import backend
    before, mixed_before = backend.mode_state(), set(backend.mixed_kernels())
    yield
    after = backend.mode_state()
    mixed = [m for m in backend.mixed_kernels() if m not in mixed_before]    # reported once
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]
               and not (k == "kernels.common.INTERPRET" and before[k] is None)}
    if changed:
        backend.restore_mode(before)
    if changed or mixed:
        pytest.fail(f"this test left the process's kernel mode changed: {changed or ''} {'; '.join(mixed)}"
                    .strip(), pytrace=False)
