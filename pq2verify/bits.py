"""The one bits comparison of tensors on any device: compare integer views of the storage, so
-0.0 != +0.0, NaN payloads count and no value is converted (torch.equal on floats would call
NaN != NaN and -0.0 == +0.0). reference.metrics compares host arrays the same way."""
import torch

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as same-size integers (a view where t is contiguous)."""
    return t.contiguous().view(_INT[t.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(bits(a), bits(b)))


def ndiff(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose bits differ (-1 where the shapes differ)."""
    return -1 if a.shape != b.shape else int((bits(a) != bits(b)).sum())
