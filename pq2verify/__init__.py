"""pq2verify: correctness and numerics verification for PQ2_0 ternary matrix kernels."""
__version__ = "0.1.0"


def pq2_matmul(x, w, *, kernels=None, path=None):
    """y = x @ W.T through the kernel set's path for (shape, M): kernels.pq2_matmul, re-exported
    while other files still import it from here."""
    from kernels.dispatch import pq2_matmul as _impl
    return _impl(x, w, kernels=kernels, path=path)
