"""Which machinery runs the kernels: compiled Triton on CUDA, or Triton's interpreter on the
CPU. TRITON_INTERPRET must be decided before any kernels module is imported, so every entry
point calls `select()` first and nothing flips it later in the process: Triton decides
interpreted or compiled when a kernel is decorated (at import), so a mode flipped mid-process
leaves every kernel module imported meanwhile in the wrong mode for whatever runs next.

On the CPU, `pq2_matmul` runs either the kernels under the interpreter or the torch emulation
of their arithmetic (kernels.emulation, for whole models); that choice is `cpu_backend()`,
kept here and switched only for a block (`using_cpu_backend`), never through TRITON_INTERPRET."""
import contextlib
import os

# The runtime's modules that hold no Triton function: importing them fixes no kernel mode.
RUNTIME = frozenset(f"kernels.{m}" for m in ("backend", "config", "dispatch", "emulation", "format", "sets",
                                             "spec", "table", "validate"))

_chosen = None
CPU_BACKENDS = ("interpreter", "emulate")
_cpu_backend = "interpreter"


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
    if _chosen is not None and _chosen != device:
        import sys
        if any(m.startswith("kernels.") and m not in RUNTIME for m in sys.modules):   # refused before anything changes
            raise RuntimeError(f"backend already {_chosen}: kernels were imported; start a new process")
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
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


def key(dev=None) -> str:
    """The one backend key, for kernel-set membership, golden folders and verified records:
    'sm<major><minor>' for a CUDA device; for CPU tensors 'interpreter' where the kernels run
    under Triton's interpreter and pq2_matmul uses them, else 'emulate' (the torch emulation).
    dev: a torch.device or its name (default: this process's device)."""
    import torch
    d = torch.device(dev if dev is not None else device())
    if d.type == "cuda":
        major, minor = torch.cuda.get_device_capability(d)
        return f"sm{major}{minor}"
    from kernels.common import INTERPRET
    return "interpreter" if INTERPRET and _cpu_backend == "interpreter" else "emulate"


def golden_key() -> str:
    """Folder name under golden/ for this process's backend: key(), with 'emulate' read as
    'interpreter' (the emulation keeps no captures of its own; it is judged against those)."""
    k = key()
    return "interpreter" if k == "emulate" else k


def cpu_backend() -> str:
    """How pq2_matmul runs on CPU tensors: 'interpreter' (the Triton kernels) or 'emulate'."""
    return _cpu_backend


@contextlib.contextmanager
def using_cpu_backend(name: str):
    """Run CPU calls of pq2_matmul through `name` inside the block; restored after, so an
    in-process caller (a test calling the CLI) leaves nothing behind for the next one."""
    global _cpu_backend
    if name not in CPU_BACKENDS:
        raise ValueError(f"cpu backend: expected one of {', '.join(CPU_BACKENDS)}, got {name!r}")
    before, _cpu_backend = _cpu_backend, name
    try:
        yield
    finally:
        _cpu_backend = before


def mode_state() -> dict:
    """The process-wide kernel mode, for tests to prove that nothing changed it."""
    import sys
    common = sys.modules.get("kernels.common")
    return {"TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"), "device": _chosen,
            "cpu_backend": _cpu_backend, "kernels.common.INTERPRET": getattr(common, "INTERPRET", None)}


def restore_mode(state: dict) -> None:
    global _chosen, _cpu_backend
    import sys
    if state["TRITON_INTERPRET"] is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = state["TRITON_INTERPRET"]
    _chosen, _cpu_backend = state["device"], state["cpu_backend"]
    common = sys.modules.get("kernels.common")
    if common is not None and state["kernels.common.INTERPRET"] is not None:
        common.INTERPRET = state["kernels.common.INTERPRET"]


def mixed_kernels() -> list[str]:
    """Imported kernel modules not in the process's interpreter mode: a Triton function of the
    other kind, or an INTERPRET bound at import that differs from kernels.common's."""
    import sys
    common = sys.modules.get("kernels.common")
    if common is None:
        return []
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    other = JITFunction if common.INTERPRET else InterpretedFunction
    bad = []
    for name, mod in sorted(sys.modules.items()):
        if not name.startswith("kernels.") or mod is None:
            continue
        v = vars(mod)
        if "INTERPRET" in v and v["INTERPRET"] != common.INTERPRET:
            bad.append(f"{name}.INTERPRET = {v['INTERPRET']} (kernels.common says {common.INTERPRET})")
        for k, f in v.items():
            # a gluon.jit function is compiled in either mode (it never runs on the interpreter)
            if isinstance(f, other) and not getattr(f, "is_gluon", lambda: False)():
                bad.append(f"{name}.{k} is a {type(f).__name__}")
    return bad
