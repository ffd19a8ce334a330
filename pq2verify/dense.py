"""The legacy dense path: torch.matmul (cuBLAS on CUDA) on an unquantized matrix."""
import torch


def run(x, w, *, out=None, dots=None):
    y = torch.matmul(x, w.t())
    if out is not None:
        out.copy_(y)
        return out
    return y
