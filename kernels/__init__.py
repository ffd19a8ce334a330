"""The PQ2_0 kernel runtime: the weight format (format), the path table (table), kernel sets
(sets) and the KernelSpec that picks one (spec), dispatch and pq2_matmul (dispatch), the
bad-input contract (validate), the config protocol (config), the backend key (backend), the
torch emulation (emulation), and one file per path. It imports torch and triton only.

The kernel files are imported lazily: TRITON_INTERPRET must be set before any of them is
imported (kernels.backend.select does that); the modules named above hold no Triton function."""
from .spec import KernelSpec, use  # noqa: F401


def pq2_matmul(x, w, *, kernels=None, path=None):
    """y = x @ W.T through the kernel set's path for (shape, M). See kernels.dispatch."""
    from .dispatch import pq2_matmul as _impl
    return _impl(x, w, kernels=kernels, path=path)
