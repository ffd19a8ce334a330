"""pytest set-up: the device option (auto: CUDA if present, else the CPU with Triton's
interpreter, which must be chosen before any kernel module is imported) and GPU-only skips."""
import pytest


def pytest_addoption(parser):
    parser.addoption("--device", default="auto", choices=("auto", "cuda", "cpu"),
                     help="cuda, or cpu with TRITON_INTERPRET=1 (default: cuda if present)")


def pytest_configure(config):
    from pq2verify import backend
    config._pq2_device = backend.select(config.getoption("--device"))


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
