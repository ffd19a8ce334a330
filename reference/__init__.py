"""FP64 CPU references for PQ2_0 kernels: the one source of truth every kernel is compared with.

numpy arrays or torch tensors in (CUDA tensors are copied to the CPU), numpy out.
Modules: pq2 (weight format), q8 (activation quantization, exact FP32), hadamard,
projection, metrics, generate.
"""
import numpy as np


def to_numpy(a) -> np.ndarray:
    """A numpy array holding exactly a's values. bfloat16 (which numpy lacks) becomes float32,
    which is exact. Tensors on any device are copied to the CPU."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None
    if torch is not None and isinstance(a, torch.Tensor):
        a = a.detach()
        if a.dtype == torch.bfloat16:
            a = a.float()
        return a.cpu().numpy()
    return np.asarray(a)


def to_float64(a) -> np.ndarray:
    """a as float64; exact for every float dtype up to float64 and for integers below 2**53."""
    return to_numpy(a).astype(np.float64)


from . import pq2, q8, hadamard, projection, metrics, generate  # noqa: E402,F401
