"""Which machinery runs the kernels: compiled Triton on CUDA, or Triton's interpreter on the
CPU. TRITON_INTERPRET must be decided before any kernels module is imported, so every entry
point calls `select()` first."""
import os

_chosen = None


def cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def select(device: str = "auto") -> str:
    """Return 'cuda' or 'cpu' and set TRITON_INTERPRET for the CPU. device: auto|cuda|cpu."""
    global _chosen
    if device not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device: expected auto, cuda or cpu, got {device!r}")
    if device == "auto":
        device = "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise RuntimeError("device: cuda was asked for but torch sees no CUDA GPU")
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    if _chosen is not None and _chosen != device:
        import sys
        if any(m.startswith("kernels.") for m in sys.modules):
            raise RuntimeError(f"backend already {_chosen}: kernels were imported; start a new process")
    _chosen = device
    return device


def device() -> str:
    return _chosen or select("auto")


def name() -> str:
    """'interpreter' or the GPU's name with its compute capability, for provenance."""
    import torch
    if device() == "cpu":
        return "interpreter"
    major, minor = torch.cuda.get_device_capability()
    return f"{torch.cuda.get_device_name()} (sm_{major}{minor})"


def golden_key() -> str:
    """Folder name under golden/ for this backend: 'interpreter' or 'sm90' etc."""
    import torch
    if device() == "cpu":
        return "interpreter"
    major, minor = torch.cuda.get_device_capability()
    return f"sm{major}{minor}"
