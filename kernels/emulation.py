"""Fast torch CPU emulation of each table path's arithmetic, for runs where Triton's
interpreter is far too slow (a whole model on the CPU).

`emulate(path_name, x, w) -> y` computes what the path computes:
- native: decode the packed weights to floats, multiply in FP32, round to x's dtype.
- the integer paths (int_gemv, mmq, gemv, single, small_mma, mmq_planes): Q8 of x bit-exactly as SPEC §3, the exact
  integer group dots, then FP32 `acc + dot * xs * ws` per group in the path's fold order.
- cublas, small_gemm: a dense matrix in x's dtype.

The integer group dots are exact in FP32 (|dot| <= 127*128 < 2^24), so any GEMM with FP32
output that sees integer inputs gives them bit for bit: torch._int_mm's int8 GEMM by default
where it passes a self-test (4x fewer weight bytes than FP32: decode is bound by them), else
(or with PQ2_EMULATE_GEMM=fp32) an FP32 matmul; oneDNN's qlinear with PQ2_EMULATE_GEMM=onednn.

Per-weight decoded tensors are cached in the PQ2Weight's own `_views` dict (never keyed by a
data pointer, which can be reused after a free).
"""
import os

import torch

from . import table
from .format import BLOCK, PQ2Weight

# fp32(1/127): the reciprocal multiply of SPEC §3.
RCP127 = torch.tensor(0.007874015718698502, dtype=torch.float32)

# Each path's FP32 order comes from its kernel file's `fold(n, k, m, interpret, config)` through
# table.Entry.fold (the GPU's config by default, whatever this process's interpreter mode; a
# forced config where one is given):
# splits over contiguous group ranges, in a split lane c of L lanes folds groups c, c+L, ...
# ascending from 0.0, lanes summed by a pairwise tree ((l0+l1)+(l2+l3))+..., splits summed
# ((p0+p1)+p2)+.... No path is named here: a new path with a fold needs no edit.
# The kernels do not contract acc + dot*xs*ws into an FMA in the interpreter, but a GPU compiler
# may: the emulation never does, so GPU bits may differ in the last place there.

_GEMM = None   # "int_mm" | "onednn" | "fp32", decided once by a self-test


def quantize_q8(x: torch.Tensor):
    """SPEC §3, plain order: (q float32 [M, K] holding integers, scales float32 [M, G]).
    q stays in float32 because the GEMMs below take it that way; the values are exact."""
    m, k = x.shape
    a = x.to(torch.float32).reshape(m, k // BLOCK, BLOCK)
    amax = a.abs().amax(dim=2)
    scale = amax * RCP127                                  # fp32 * fp32, one rounding
    div = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round(a / div.unsqueeze(2)).clamp_(-127, 127)  # torch.round: half to even
    return q.reshape(m, k), scale


def _signed_codes(w: PQ2Weight, cache: bool = True) -> torch.Tensor:
    """int8 [N, K] in {-1, 0, 1}, cached on the weight unless cache=False (a caller that keeps
    its own layout of them: one byte per weight twice is 5 GB on a 1.3B-weight model)."""
    c = w._views.get("emu_codes")
    if c is None:
        b = w.codes_matrix().to(torch.int16)                       # [N, K/4]
        parts = [((b >> (2 * s)) & 3) for s in range(4)]            # weight 4*j + s
        c = torch.stack(parts, dim=2).reshape(w.n, w.k).to(torch.int8) - 1
        if cache:
            w._views["emu_codes"] = c
    return c


def _scales(w: PQ2Weight) -> torch.Tensor:
    """float32 [N, G] weight scales, cached."""
    s = w._views.get("emu_scales")
    if s is None:
        s = w._views["emu_scales"] = w.scales_matrix().to(torch.float32).contiguous()
    return s


def _scales_t(w: PQ2Weight) -> torch.Tensor:
    """float32 [G, N] (contiguous rows: a strided broadcast operand is several times slower)."""
    s = w._views.get("emu_scales_t")
    if s is None:
        s = w._views["emu_scales_t"] = _scales(w).t().contiguous()
    return s


def _onednn_available() -> bool:
    ops = getattr(torch.ops, "onednn", None)
    try:
        return ops is not None and hasattr(ops, "qlinear_pointwise") and hasattr(ops, "qlinear_prepack")
    except Exception:
        return False


def _onednn_pack(w: PQ2Weight):
    """Per-group prepacked int8 code matrices [N, 128] for oneDNN, cached on the weight."""
    packs = w._views.get("emu_onednn")
    if packs is None:
        c = _signed_codes(w).reshape(w.n, w.groups, BLOCK)
        packs = [torch.ops.onednn.qlinear_prepack(c[:, g].contiguous(), None) for g in range(w.groups)]
        w._views["emu_onednn"] = packs
    return packs


def _dot_onednn(q: torch.Tensor, w: PQ2Weight):
    """g -> exact group dot FP32 [M, N] through oneDNN's s8 x s8 -> s32 -> f32 GEMM with unit
    scales and zero points (the self-test checks that the result is the exact integer)."""
    m = q.shape[0]
    qs = q.to(torch.int8).reshape(m, w.groups, BLOCK)
    ones = w._views.get("emu_ones")
    if ones is None:
        ones = w._views["emu_ones"] = (torch.ones(w.n), torch.zeros(w.n, dtype=torch.long))
    packs = _onednn_pack(w)

    def dot(g):
        return torch.ops.onednn.qlinear_pointwise(
            qs[:, g].contiguous(), 1.0, 0, packs[g], ones[0], ones[1], None, 1.0, 0,
            torch.float32, "none", [], "")
    return dot


def _dot_fp32(q: torch.Tensor, w: PQ2Weight):
    """g -> exact group dot FP32 [M, N] through an FP32 matmul of integer values."""
    cf = w._views.get("emu_codes_f32")
    if cf is None:
        cf = _signed_codes(w).to(torch.float32).reshape(w.n, w.groups, BLOCK).permute(1, 2, 0).contiguous()
        w._views["emu_codes_f32"] = cf                              # [G, 128, N]
    qg = q.reshape(q.shape[0], w.groups, BLOCK)
    return lambda g: qg[:, g] @ cf[g]


def _dots_onednn(q, w):
    f = _dot_onednn(q, w)
    return torch.stack([f(g) for g in range(w.groups)])


def _dots_fp32(q, w):
    f = _dot_fp32(q, w)
    return torch.stack([f(g) for g in range(w.groups)])


def _dots_int_mm(q, w):
    """Exact group dots FP32 [G, M, N]: torch._int_mm (s8 x s8 -> s32) per group on int8 codes
    [G, 128, N] cached on the weight."""
    ct = w._views.get("emu_codes_i8_t")
    if ct is None:
        ct = _signed_codes(w, cache=False).reshape(w.n, w.groups, BLOCK).permute(1, 2, 0).contiguous().unbind(0)
        w._views["emu_codes_i8_t"] = ct
    out = torch.empty(w.groups, q.shape[0], w.n, dtype=torch.int32)
    # unbind: every group's view in one call (decode runs thousands of these per token)
    for a, b, o in zip(q.to(torch.int8).reshape(q.shape[0], w.groups, BLOCK).unbind(1), ct, out.unbind(0)):
        torch._int_mm(a, b, out=o)
    return out.to(torch.float32)


_DOTS = {"int_mm": _dots_int_mm, "onednn": _dots_onednn, "fp32": _dots_fp32}


def _self_test() -> str:
    """Pick the GEMM: torch._int_mm unless PQ2_EMULATE_GEMM names another (fp32 | onednn); an
    int8 GEMM is used only if it reproduces the FP32 integer dots exactly on extreme values (some
    int8 GEMMs saturate 16-bit intermediates without VNNI), else the FP32 matmul of integer
    values (exact, |dot| < 2^24). oneDNN's qlinear is not the default: on torch 2.13 it falls back
    to a reference kernel 300-600x slower than the FP32 matmul (2026-11-30, this project's CPU)."""
    forced = os.environ.get("PQ2_EMULATE_GEMM", "").strip().lower() or "int_mm"
    if forced not in ("int_mm", "onednn"):
        return "fp32"
    if forced == "onednn" and not _onednn_available():
        return "fp32"
    try:
        g = torch.Generator().manual_seed(0)
        n, k = 64, 256
        codes = torch.randint(0, 3, (n, k // 4), generator=g, dtype=torch.int32)
        codes[0] = 0b10101010        # every weight +1
        codes[1] = 0                 # every weight -1
        packed = (codes.to(torch.uint8).view(n, k // BLOCK, 32))
        scales = torch.ones(n, k // BLOCK, dtype=torch.float16).view(torch.uint8).view(n, k // BLOCK, 2)
        w = PQ2Weight.from_raw(torch.cat([scales, packed], 2).reshape(n, -1))
        q = torch.randint(-127, 128, (8, k), generator=g).to(torch.float32)
        q[0], q[1] = 127, -127
        ok = torch.equal(_DOTS[forced](q, w), _dots_fp32(q, w))
        return forced if ok else "fp32"
    except Exception:
        return "fp32"


def gemm_kind() -> str:
    global _GEMM
    if _GEMM is None:
        _GEMM = _self_test()
    return _GEMM


def group_dots(q: torch.Tensor, w: PQ2Weight) -> torch.Tensor:
    """Exact integer group dots as FP32 [G, M, N] for integer-valued q [M, K]."""
    return _DOTS[gemm_kind()](q, w)


def kernel_plan(path_name: str, m: int, w: PQ2Weight, *, interpret: bool = False,
                config: dict | None = None) -> list[list[list[int]]]:
    """The path's FP32 order as splits -> lanes -> groups (table.Entry.fold), for the config
    its kernel picks or for `config` forced."""
    G = w.groups
    f = table.get(path_name).fold(w.n, w.k, m, interpret=interpret, config=config)
    per, lanes = f["groups_per_split"], f.get("lanes", 1)
    plan = []
    for s0 in range(0, G, per):
        end = min(s0 + per, G)
        # every lane, empty ones too: the kernel's tree adds their +0.0 (it matters for -0.0)
        plan.append([list(range(s0 + c, end, lanes)) for c in range(lanes)])
    return plan


# Rows per block of the integer paths: G temporaries of [rows, N] FP32 stay near the caches
# instead of streaming G full [M, N] matrices through memory (prefill M is in the thousands).
ROW_CHUNK = 64


def _fold(term, plan, rows: int, n: int) -> torch.Tensor:
    """sum of term(g) over the plan's splits -> lanes -> groups in FP32, as the kernels add."""
    def lane(idx):
        acc = None
        for g in idx:
            t = term(g)
            acc = t.add_(0.0) if acc is None else acc.add_(t)     # from a +0.0 accumulator
        return acc if acc is not None else torch.zeros(rows, n)

    splits = []
    for lanes in plan:
        vals = [lane(idx) for idx in lanes]
        while len(vals) > 1:                                 # pairwise tree, adjacent pairs
            vals = [vals[i] + vals[i + 1] if i + 1 < len(vals) else vals[i] for i in range(0, len(vals), 2)]
        splits.append(vals[0])
    y = splits[0]
    for p in splits[1:]:
        y = y.add_(p)
    return y


def _integer_rows(q, xs, w, ws, plan) -> torch.Tensor:
    # The kernels' expression acc + dot * xs * ws: (dot * xs) * ws, then the add, each rounded
    # to FP32 (elementwise, so all groups' terms at once give the same bits as one at a time).
    t = group_dots(q, w).mul_(xs).mul_(ws.unsqueeze(1))
    return _fold(lambda g: t[g], plan, q.shape[0], w.n)


def integer(path_name: str, x: torch.Tensor, w: PQ2Weight, *, out_dtype=None,
            interpret: bool = False, config: dict | None = None) -> torch.Tensor:
    """The integer paths: y = sum_g dot_g * xs * ws in FP32 in the path's fold order.
    Rows are independent (per-row Q8, per-row sums), so blocks of rows change no bit."""
    q, xs = quantize_q8(x)
    xs = xs.t().contiguous().unsqueeze(2)                   # [G, M, 1]
    ws = _scales_t(w)                                       # [G, N]
    m = x.shape[0]
    plan = kernel_plan(path_name, m, w, interpret=interpret, config=config)
    dtype = out_dtype or x.dtype
    if m <= ROW_CHUNK:
        return _integer_rows(q, xs, w, ws, plan).to(dtype)
    out = torch.empty(m, w.n, dtype=dtype)
    for s in range(0, m, ROW_CHUNK):
        out[s:s + ROW_CHUNK] = _integer_rows(q[s:s + ROW_CHUNK], xs[:, s:s + ROW_CHUNK], w, ws, plan)
    return out


def floating(path_name: str, x: torch.Tensor, w: PQ2Weight, *, interpret: bool = False,
             config: dict | None = None) -> torch.Tensor:
    """Floating PQ2 paths (kernels/native.py): per 128-group an FP32 dot of x with the decoded
    ternary values (code - 1), times the fp16 scale as fp32, folded in the path's order.
    (The order inside one group's dot is the MMA's own; here it is the CPU GEMM's.)"""
    cf = w._views.get("emu_codes_f32")
    if cf is None:
        cf = _signed_codes(w).to(torch.float32).reshape(w.n, w.groups, BLOCK).permute(1, 2, 0).contiguous()
        w._views["emu_codes_f32"] = cf                              # [G, 128, N]
    ws = _scales_t(w)
    xg = x.to(torch.float32).reshape(x.shape[0], w.groups, BLOCK)
    plan = kernel_plan(path_name, x.shape[0], w, interpret=interpret, config=config)
    return _fold(lambda g: (xg[:, g] @ cf[g]).mul_(ws[g]), plan, x.shape[0], w.n).to(x.dtype)


def dense(path_name: str, x: torch.Tensor, w: torch.Tensor, *, interpret: bool = False,
          config: dict | None = None) -> torch.Tensor:
    """Dense paths: the library's own product where the path's fold is None, else FP32
    partials over its K splits, added in order, one final rounding."""
    f = table.get(path_name).fold(w.shape[0], x.shape[1], x.shape[0], interpret=interpret, config=config)
    if f is None:
        from . import cublas      # the path's own product, FP32 reductions included
        return cublas.product(x, w)
    k, step = x.shape[1], f["k_per_split"]
    xf, wf = x.to(torch.float32), w.to(torch.float32)
    acc = None
    for s in range(0, k, step):
        part = xf[:, s:s + step] @ wf[:, s:s + step].t()
        acc = part if acc is None else acc.add_(part)
    return acc.to(x.dtype)


def emulate(path_name: str, x: torch.Tensor, w, *, interpret: bool = False,
            config: dict | None = None) -> torch.Tensor:
    """y [M, N] in x's dtype for x [M, K] (bf16/fp16, CPU) through the named path's arithmetic,
    in the fold order of the config its kernel picks on the GPU (or on the interpreter), or of
    `config` forced as `run(..., config=)` takes it (a bad one is a ValueError naming the field)."""
    p = table.get(path_name)
    if x.dim() != 2:
        raise ValueError(f"x: expected [M, K], got shape {tuple(x.shape)}")
    if p.weight == "dense":
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"path {path_name!r} takes a dense weight")
        return dense(path_name, x, w, interpret=interpret, config=config)
    if not isinstance(w, PQ2Weight):
        raise TypeError(f"path {path_name!r} takes a PQ2Weight")
    if x.shape[0] == 0:
        return x.new_empty(0, w.n)
    if p.arithmetic == "floating":
        return floating(path_name, x, w, interpret=interpret, config=config)
    return integer(path_name, x, w, interpret=interpret, config=config)
