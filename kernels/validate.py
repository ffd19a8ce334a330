"""The bad-input contract at the table boundary, shared by pq2_matmul and the kernel wrappers.

Every public entry point answers bad input with an exception that names the argument and what
was expected, before any kernel runs. The checks read shapes, dtypes, strides and devices only
(never the data), so they cost microseconds and are safe inside CUDA-graph capture.

Policies (tested in tests/test_bad_input.py):
- x: [M, K] bf16/fp16 for a kernel wrapper (pq2_matmul also takes [..., K] and flattens); unit
  stride along K (pq2_matmul copies a strided x, a wrapper refuses it); any row stride and any
  element alignment (Triton specializes on alignment, it does not assume it).
- w: a PQ2Weight (raw or prepared) on x's device, or a dense [N, K] matrix in x's dtype for the
  dense paths. Code 3 and non-finite scales are rejected once per weight (at load, prepare, or
  the first call), never per call. A weight whose allocation is not 16-byte aligned is refused
  (PQ2Weight.from_raw / from_prepared copy such a slice at load).
- K: a multiple of 128 (PQ2_0 blocks), and of the path's own `k_multiple` where stricter.
- out: [M, N], x's dtype and device, unit stride along N; dots: int32 [M, N, G] contiguous,
  integer paths only.
- M = 0: an empty [0, N] result, no launch. A path asked for an M outside its range: an error.
- NaN/Inf activations: the output rows of the affected activation rows are non-finite (every
  element), and the other rows are exactly what they would be without them. The FP64 Q8
  reference refuses non-finite activations (Q8 of NaN is undefined); the dense reference
  propagates them.
"""
import torch

from . import table
from .format import ALIGN, BLOCK, PQ2Weight

DTYPES = (torch.bfloat16, torch.float16)


def _name(dt) -> str:
    return str(dt).replace("torch.", "")


def activations(x, *, rank2: bool = True) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if rank2 and x.dim() != 2:
        raise ValueError(f"x: expected a matrix [M, K] (rank 2), got rank {x.dim()} of shape {tuple(x.shape)}")
    if x.dim() < 1:
        raise ValueError("x: expected shape [..., K], got a scalar (rank 0)")
    if x.dtype not in DTYPES:
        raise TypeError(f"x: expected dtype bfloat16 or float16, got {_name(x.dtype)}")


def weight(x, w, *, dense: bool | None = None) -> tuple[int, int]:
    """Check w against x; return (N, K). dense: True/False to require that kind, None for either."""
    k_x = x.shape[-1]
    if isinstance(w, PQ2Weight):
        if dense:
            raise TypeError("w: this path takes a dense [N, K] matrix, got a PQ2Weight")
        if k_x % BLOCK:
            raise ValueError(f"x: K={k_x} is not a multiple of {BLOCK} (PQ2_0 blocks hold 128 weights)")
        if k_x != w.k:
            raise ValueError(f"x: last dimension K={k_x} does not match the weight's K={w.k}")
        if w.device != x.device:
            raise ValueError(f"x: on {x.device} but the weight is on {w.device}; move one of them")
        if w.data.data_ptr() % ALIGN:
            raise ValueError(f"w: data at address {w.data.data_ptr():#x} is not {ALIGN}-byte aligned; "
                             "load it with PQ2Weight.from_raw/from_prepared, which copy such a slice")
        w.ensure_checked()
        return w.n, w.k
    if isinstance(w, torch.Tensor):
        if dense is False:
            raise TypeError("w: this path takes a PQ2Weight, got a dense tensor")
        if w.dim() != 2:
            raise ValueError(f"w: a dense weight must be [N, K] (rank 2), got rank {w.dim()}")
        if w.shape[1] == 0:
            raise ValueError(f"w: a dense weight needs K >= 1 columns, got shape {tuple(w.shape)}")
        if w.dtype != x.dtype:
            raise TypeError(f"w: dense weight dtype {_name(w.dtype)} differs from x dtype {_name(x.dtype)}")
        if k_x != w.shape[1]:
            raise ValueError(f"x: last dimension K={k_x} does not match the weight's K={w.shape[1]}")
        if w.device != x.device:
            raise ValueError(f"x: on {x.device} but the weight is on {w.device}; move one of them")
        return w.shape[0], w.shape[1]
    raise TypeError(f"w: expected a PQ2Weight or a dense torch.Tensor, got {type(w).__name__}")


def unfit(p: table.Entry, m: int, x, w) -> tuple[type, str] | None:
    """Why path p cannot serve this call (exception type, message after the path's name), or
    None. The one reading of a table entry's constraints: dispatch skips such paths, a
    forced path or a kernel wrapper raises."""
    kind = "dense" if isinstance(w, torch.Tensor) else "pq2"
    if p.weight != kind:
        return TypeError, f": takes {p.weight} weights, got a {kind} weight"
    if m and not p.serves(m):
        return ValueError, f" serves M in {p.m_range()}, got M={m}"
    if x.dtype not in p.dtypes:
        return TypeError, f": x dtype {_name(x.dtype)} is not one of {', '.join(_name(d) for d in p.dtypes)}"
    layout = "dense" if kind == "dense" else w.layout
    if layout not in p.layouts:
        return ValueError, f": weight layout {layout!r} is not one of {p.layouts}"
    k = x.shape[-1]
    if k % p.k_multiple:
        return ValueError, f" needs K a multiple of {p.k_multiple}, got K={k}"
    if p.min_cc is not None and x.device.type == "cuda" and torch.cuda.get_device_capability(x.device) < p.min_cc:
        return ValueError, (f" needs compute capability {p.min_cc}, this GPU has "
                            f"{torch.cuda.get_device_capability(x.device)}")
    return None


def path_fits(p: table.Entry, m: int, x, w, *, arg: str) -> None:
    """Raise if path p cannot serve this call; `arg` names what chose it (path=..., or the wrapper)."""
    why = unfit(p, m, x, w)
    if why is not None:
        raise why[0](arg + why[1])


def buffers(x, n: int, out=None, dots=None, *, groups: int | None = None, has_dots: bool = True) -> None:
    m = x.shape[0]
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out: expected a torch.Tensor, got {type(out).__name__}")
        if tuple(out.shape) != (m, n):
            raise ValueError(f"out: expected shape {(m, n)} = [M, N], got {tuple(out.shape)}")
        if out.dtype != x.dtype:
            raise TypeError(f"out: expected dtype {_name(x.dtype)} (x's), got {_name(out.dtype)}")
        if out.device != x.device:
            raise ValueError(f"out: on {out.device} but x is on {x.device}")
        if n > 1 and out.stride(1) != 1:
            raise ValueError(f"out: needs unit stride along N, got strides {out.stride()}")
    if dots is not None:
        if not has_dots:
            raise ValueError("dots: this path is floating and has no integer group dots; pass dots=None")
        if not isinstance(dots, torch.Tensor) or dots.dtype != torch.int32:
            raise TypeError(f"dots: expected an int32 tensor, got {getattr(dots, 'dtype', type(dots).__name__)}")
        if tuple(dots.shape) != (m, n, groups):
            raise ValueError(f"dots: expected shape {(m, n, groups)} = [M, N, K/128], got {tuple(dots.shape)}")
        if not dots.is_contiguous():
            raise ValueError("dots: must be contiguous")
        if dots.device != x.device:
            raise ValueError(f"dots: on {dots.device} but x is on {x.device}")


def kernel_out(kernel: str, x, w, out=None, dots=None, check: bool = True):
    """What each kernel wrapper does first: `validate.kernel_out(__name__, x, w, out, dots,
    check)`. Its arguments are checked against its table entry (kernel_args; check=False where
    pq2_matmul validated them already), then the output buffer: out, or a new [M, N] in x's
    dtype. kernel: the wrapper's module name (or a path name)."""
    if check:
        kernel_args(kernel, x, w, out, dots)
    if out is not None:
        return out
    n = w.shape[0] if isinstance(w, torch.Tensor) else w.n
    return torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)


def entry(kernel: str) -> table.Entry:
    """The table entry of a path name or of a kernel file's module name."""
    return table.of_module(kernel) if "." in kernel else table.get(kernel)


def kernel_args(kernel: str, x, w, out=None, dots=None) -> None:
    """The bad-input contract of a kernel wrapper, read from its table entry (kernel: a path
    name, or the wrapper's module name). Wrappers do not copy: x must already have unit
    stride along K."""
    p = entry(kernel)
    path = p.name
    activations(x)
    n, k = weight(x, w, dense=p.weight == "dense")
    if x.shape[0] and x.stride(1) != 1:
        raise ValueError(f"x: {path} needs unit stride along K, got strides {x.stride()} "
                         "(pq2_matmul copies such an x; a kernel wrapper does not)")
    path_fits(p, x.shape[0], x, w, arg=f"{path}")
    buffers(x, n, out, dots, groups=k // BLOCK, has_dots=p.has_dots)
