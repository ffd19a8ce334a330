"""mmq_wgmma (prefill, M >= 17, sm_90, prepared weights): mmq's arithmetic on Hopper's warpgroup
MMA, in Gluon. The operands are swapped: weight rows are the MMA's M side, fed from registers
(code plane s minus 1, four bytes at a time, in four instructions; no expansion through shared
memory), and the Q8 activations in plane order are its N side, read from shared memory. TMA
stages the code bytes, the activations and their group scales in an S-deep ring.

Per group the MMA gives mmq's integer dot exactly (int32); the fold is common.scale_accumulate's
expression, acc + dot*xs*ws, groups ascending from 0.0: mmq's FP32 order.

Measured on the H200 and dropped (results/2026-12-01-prefill-mmq-wgmma/): unsigned codes minus the group sum per dot
(0.80x of signed codes in the registers); the int32 -> fp32 conversion by adding 0x4B400000 and
subtracting 1.5*2^23 (0.94x); the MMA of one half of the tokens overlapped with the fold of the
other half (0.78-0.87x: more registers, two programs an SM instead of three); one CTA-wide sync
per two groups instead of one per group (0.88-0.91x).

Gluon does not run under TRITON_INTERPRET=1: there, and on GPUs other than sm_90 (wgmma is
Hopper's alone), run() launches _twin_kernel, plain Triton with the same dots and the same fold.
On the GPU tests/test_mmq_wgmma.py compares the two bit for bit."""
import functools

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels import common, prepare
from kernels import config as tiles, validate  # the config protocol (kernels/config.py)

@gluon.jit
def _plane(c, s: gl.constexpr):
    # code plane s minus 1, four bytes at a time (pack=4): p = (c >> 2s) & 3 per byte, then
    # (p + 0x7F) ^ 0x80 per byte is p - 1 as int8 (no carry leaves a byte: p <= 2)
    if s == 0:
        sh: gl.constexpr = "mov.b32 t, $1;"
    elif s == 1:
        sh: gl.constexpr = "shr.b32 t, $1, 2;"
    elif s == 2:
        sh: gl.constexpr = "shr.b32 t, $1, 4;"
    else:
        sh: gl.constexpr = "shr.b32 t, $1, 6;"
    return gl.inline_asm_elementwise(
        "{.reg .b32 t; " + sh + " and.b32 t, t, 0x03030303; add.u32 t, t, 0x7F7F7F7F; xor.b32 $0, t, 0x80808080;}",
        "=r,r", [c], dtype=gl.int8, is_pure=True, pack=4)


@gluon.jit
def _issue(q_desc, c_desc, x_desc, bar, q_s, c_s, x_s, g, st, off_t, off_w):
    b = bar.index(st)
    mbarrier.expect(b, q_desc.block_type.nbytes + c_desc.block_type.nbytes + x_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [off_t, g * 128], b, q_s.index(st))
    tma.async_copy_global_to_shared(c_desc, [off_w, g * 32], b, c_s.index(st))
    tma.async_copy_global_to_shared(x_desc, [g, off_t], b, x_s.index(st))


@gluon.jit
def _group(acc, g, S: gl.constexpr, bar, q_s, c_s, x_s, s_ptrs, zero, d_ptr, rows, cols, M, N,
           G: gl.constexpr, mma: gl.constexpr, la: gl.constexpr, DOTS: gl.constexpr):
    # group g of stage g % S: four K=32 MMA steps (code plane s against activations s*32..s*32+31,
    # plane order), waited for, then folded as common.scale_accumulate: acc + dot * xs * ws
    st = g % S
    mbarrier.wait(bar.index(st), (g // S) & 1)
    codes = c_s.index(st).load(la)
    qb = q_s.index(st)
    d = warpgroup_mma(_plane(codes, 0), qb.slice(0, 32, dim=1).permute((1, 0)), zero, use_acc=False, is_async=True)
    d = warpgroup_mma(_plane(codes, 1), qb.slice(32, 32, dim=1).permute((1, 0)), d, is_async=True)
    d = warpgroup_mma(_plane(codes, 2), qb.slice(64, 32, dim=1).permute((1, 0)), d, is_async=True)
    d = warpgroup_mma(_plane(codes, 3), qb.slice(96, 32, dim=1).permute((1, 0)), d, is_async=True)
    ws = gl.load(s_ptrs + g, mask=rows < N, other=0.0).to(gl.float32)
    d = warpgroup_mma_wait(num_outstanding=0, deps=[d])
    xs = x_s.index(st).load(mma)            # [1, BT]
    if DOTS:
        d_off = (gl.expand_dims(cols.to(gl.int64), 0) * N + gl.expand_dims(rows, 1)) * G + g
        gl.store(d_ptr + d_off, d, mask=gl.expand_dims(rows < N, 1) & gl.expand_dims(cols < M, 0))
    return acc + d.to(gl.float32) * xs * gl.expand_dims(ws, 1)


@gluon.jit
def _tile(M, N, BT: gl.constexpr, BW: gl.constexpr, GROUP_M: gl.constexpr):
    # (first token, first weight row) of this program's tile. GROUP_M = 0: a 2D grid whose axis 0
    # walks the token tiles fastest, so programs running together share a weight tile. Else a 1D
    # grid walking GROUP_M token tiles, then the weight tiles, then the next GROUP_M: a group's
    # activations stay in L2 while the weight tiles pass, which matters once the Q8 activations
    # outgrow L2 (M x K bytes: down at M = 8192 is 143 MB)
    if GROUP_M == 0:
        t = gl.program_id(0)
        w = gl.program_id(1)
    else:
        pid = gl.program_id(0)
        span = GROUP_M * gl.cdiv(N, BW)
        first = (pid // span) * GROUP_M
        size = gl.minimum(gl.cdiv(M, BT) - first, GROUP_M)
        t = first + (pid % span) % size
        w = (pid % span) // size
    return t * BT, w * BW


@gluon.jit
def _wgmma_kernel(q_desc, c_desc, x_desc, s_ptr, y_ptr, d_ptr, M, N, stride_ym, scale_off, scale_row,
                  G: gl.constexpr, BT: gl.constexpr, S: gl.constexpr, GROUP_M: gl.constexpr, DOTS: gl.constexpr,
                  num_warps: gl.constexpr):
    BW: gl.constexpr = 16 * num_warps
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BT, 32])
    la: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    off_t, off_w = _tile(M, N, BT, BW, GROUP_M)
    q_s = gl.allocate_shared_memory(gl.int8, [S, BT, 128], q_desc.layout)
    c_s = gl.allocate_shared_memory(gl.uint8, [S, BW, 32], c_desc.layout)
    x_s = gl.allocate_shared_memory(gl.float32, [S, 1, BT], x_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(S):
        mbarrier.init(bar.index(i), count=1)
    fence_async_shared()
    for i in gl.static_range(S):
        if i < G:
            _issue(q_desc, c_desc, x_desc, bar, q_s, c_s, x_s, i, i, off_t, off_w)

    rows = off_w + gl.arange(0, BW, layout=gl.SliceLayout(1, mma))
    cols = off_t + gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
    s_ptrs = s_ptr + scale_off + rows.to(gl.int64) * scale_row
    acc = gl.zeros([BW, BT], gl.float32, mma)
    zero = gl.zeros([BW, BT], gl.int32, mma)
    for g in range(G):
        acc = _group(acc, g, S, bar, q_s, c_s, x_s, s_ptrs, zero, d_ptr, rows, cols, M, N, G, mma, la, DOTS)
        gl.thread_barrier()   # every warp is done with stage g % S before TMA refills it
        if g + S < G:
            _issue(q_desc, c_desc, x_desc, bar, q_s, c_s, x_s, g + S, g % S, off_t, off_w)
    for i in gl.static_range(S):
        mbarrier.invalidate(bar.index(i))
    y_ptrs = y_ptr + gl.expand_dims(cols.to(gl.int64), 0) * stride_ym + gl.expand_dims(rows, 1)
    gl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=gl.expand_dims(rows < N, 1) & gl.expand_dims(cols < M, 0))


@triton.jit
def _twin_kernel(q_ptr, xs_ptr, sg, c_ptr, s_ptr, y_ptr, d_ptr, M, N, stride_ym, scale_off, scale_row,
                 G: tl.constexpr, BT: tl.constexpr, BW: tl.constexpr, DOTS: tl.constexpr, INTERP: tl.constexpr):
    # the Gluon kernel's arithmetic in plain Triton: [BW, BT] tiles, signed plane dots, the same fold
    rows = tl.program_id(1) * BW + tl.arange(0, BW)
    cols = tl.program_id(0) * BT + tl.arange(0, BT)
    rmask = rows < N
    cmask = cols < M
    b = tl.arange(0, 32)
    acc = tl.zeros((BW, BT), dtype=tl.float32)
    for g in range(G):
        codes = tl.load(c_ptr + rows.to(tl.int64)[:, None] * (G * 32) + g * 32 + b[None, :], mask=rmask[:, None],
                        other=0x55)
        d = tl.zeros((BW, BT), dtype=tl.int32)
        for s in tl.static_range(4):
            qs = tl.load(q_ptr + cols.to(tl.int64)[None, :] * (G * 128) + g * 128 + s * 32 + b[:, None],
                         mask=cmask[None, :], other=0)                      # [32, BT]
            d = tl.dot(common.code_plane(codes, s, INTERP) - 1, qs, d, out_dtype=tl.int32)
        xs = tl.load(xs_ptr + g * sg + cols, mask=cmask, other=0.0)
        ws = tl.load(s_ptr + scale_off + rows.to(tl.int64) * scale_row + g, mask=rmask, other=0.0).to(tl.float32)
        acc = common.scale_accumulate(acc, d, xs[None, :], ws[:, None])
        if DOTS:
            tl.store(d_ptr + (cols.to(tl.int64)[None, :] * N + rows[:, None]) * G + g, d,
                     mask=rmask[:, None] & cmask[None, :])
    tl.store(y_ptr + cols.to(tl.int64)[None, :] * stride_ym + rows[:, None],
             prepare.to_out(acc, y_ptr.dtype.element_ty, INTERP), mask=rmask[:, None] & cmask[None, :])


# BM: tokens a tile (the MMA's N side), BN: weight rows (its M side: 16 a warp, one warpgroup per
# 64), num_stages: the TMA ring's depth.
# GROUP_M: token tiles walked before the next weight tile (program order only; 0: all of them).
FIELDS = {"BM": tiles.pow2(64, 128), "BN": tiles.pow2(64, 128), "num_stages": tiles.integer(2),
          "GROUP_M": tiles.integer(0)}


def config(n: int, k: int, m: int, interpret: bool | None = None) -> dict:
    """{BM, BN, num_stages, GROUP_M} from shapes only, the same on the interpreter (num_warps =
    BN / 16; the twin reads BM and BN alone)."""
    return _config(min(triton.next_power_of_2(m), 4096))


def _config(m):
    # H200, M = 2048, the six Bonsai shapes (results/2026-12-01-prefill-mmq-wgmma/): BN 64 (three programs an SM)
    # beat BN 128 by 1.2-1.3x and BM 64 by 1.2x; 2, 3 and 4 stages were within 1%.
    # GROUP_M 4 past M = 2048, H100 (results/2026-12-07-prefill-program-order-h100/): 1.09-1.45x at M = 8192
    # and 1.04-1.15x at 4096 over GROUP_M 0 on the six shapes, ahead of 8 and 16 on most
    return dict(BM=64 if m <= 64 else 128, BN=64, num_stages=4, GROUP_M=4 if m > 2048 else 0)


def configs(interpret: bool) -> list[dict]:
    """Every distinct config config() picks (pq2verify.tiles)."""
    return tiles.sweep("mmq_wgmma", lambda n, k, m: config(n, k, m, interpret))


def _resolve(n, k, m, interpret, cfg) -> dict:
    return tiles.force("mmq_wgmma", config(n, k, m, interpret), cfg, FIELDS)


def fold(n: int, k: int, m: int, interpret: bool | None = None, config: dict | None = None) -> dict:
    """mmq's FP32 order whatever the tiles: one split, one lane, groups ascending from 0.0."""
    _resolve(n, k, m, interpret, config)
    return dict(groups_per_split=k // 128, lanes=1, splits=1)


def _hopper(device) -> bool:
    if common.INTERPRET or device.type != "cuda":
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device())[0] == 9


@functools.lru_cache(maxsize=None)
def _capability(index: int):
    # once per GPU: run() asks on every call
    return torch.cuda.get_device_capability(index)


@functools.lru_cache(maxsize=None)
def _smem_layout(block: tuple, dtype):
    # a pure function of the box and dtype, and a few µs of Python per call otherwise
    return gl.NVMMASharedLayout.get_default_for(list(block), dtype)


def _desc(t, block, dtype):
    return TensorDescriptor.from_tensor(t, list(block), _smem_layout(tuple(block), dtype))


# The kernel's TMA boxes, in one place: a tile of BT tokens x one group of Q8 codes, one group's
# scales of that tile, and BW weight rows x one group of code bytes.
def _act_descs(q, xs_t, bt: int):
    return _desc(q, (bt, 128), gl.int8), _desc(xs_t, (1, bt), gl.float32)


def _codes_desc(codes, bw: int):
    return _desc(codes, (bw, 32), gl.uint8)


def kernel_args(q, codes, xs_t, groups: int, cfg: dict, dots: bool) -> tuple[dict, dict]:
    """(TMA descriptors, constexprs) of _wgmma_kernel for Q8 activations q [M, K], code bytes
    [N, K/4] and scales [G, M]: what run() launches with, and what pq2verify.sm90 compiles."""
    bt, bw = cfg["BM"], cfg["BN"]
    q_desc, x_desc = _act_descs(q, xs_t, bt)
    descs = dict(q_desc=q_desc, c_desc=_codes_desc(codes, bw), x_desc=x_desc)
    return descs, _consts(groups, cfg, dots)


def _consts(groups: int, cfg: dict, dots: bool) -> dict:
    return dict(G=groups, BT=cfg["BM"], S=cfg["num_stages"], GROUP_M=cfg["GROUP_M"], DOTS=dots,
                num_warps=cfg["BN"] // 16)


# The launch plan. Prefill runs eagerly and this path's Python launch cost is of the order of its
# GPU time at M = 2048 (the bench's launch table), so what does not change between calls is
# kept: the code-byte descriptor on the weight itself, valid while its codes keep their address
# AND their version counter (a reallocated or rewritten weight gets a new one; a freed weight
# takes its plan with it), and per (device, stream) one activation workspace (Q8 codes, scales
# by group, sums) with the descriptors of each (M, K) on it. Calls on one stream run in order, so
# no two calls in flight share a workspace; a call inside a CUDA graph capture allocates its own
# buffers (the graph's pool keeps them), as every other path does.
_workspace: dict = {}   # (device index, stream) -> {"q", "s", "t": buffers, "descs": {(M, K, BM): ...}}
_DESCS = 64              # descriptor sets kept per stream (prefill M varies call to call)


def _slot(device):
    """The workspace's key: the device and the current stream (calls on one stream run in order;
    torch's streams come from a pool and are not destroyed, so a stream's key is never reused)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return (index, torch.cuda.current_stream(index))


def _views(device, m: int, k: int, bt: int):
    """((q [M, K], scales [G, M], sums [M, G]) on this stream's workspace, (q, scale descriptors)),
    the buffers grown to the largest call seen (scratch: pq2verify.graphs.SCRATCH)."""
    slot = _slot(device)
    ws = _workspace.get(slot)
    g, mp = k // 128, -(-m // 4) * 4
    need = {"q": (m * k, torch.int8), "s": (g * mp, torch.float32), "t": (m * g, torch.int32)}
    if ws is None or any(n > ws[b].numel() for b, (n, _) in need.items()):
        old = ws or {}
        ws = _workspace[slot] = {b: torch.empty(max(n, old[b].numel() if b in old else 0), dtype=dt, device=device)
                                 for b, (n, dt) in need.items()}
        ws["descs"] = {}
    v = ws["descs"].get((m, k, bt))
    if v is None:
        if len(ws["descs"]) >= _DESCS:
            ws["descs"].clear()
        q, sc = ws["q"][: m * k].view(m, k), ws["s"][: g * mp].view(g, mp)[:, :m]
        v = ws["descs"][(m, k, bt)] = ((q, sc, ws["t"][: m * g].view(m, g)), _act_descs(q, sc, bt))
    return v


def _code_desc(w, n: int, bw: int):
    """The weight's code-byte descriptor, in the weight's own cache of what derives from its bytes
    (PQ2Weight._views: dropped when the data is replaced or written in place)."""
    key = ("mmq_wgmma code descriptor", n, bw)
    d = w._views.get(key)
    if d is None:
        d = w._views[key] = _codes_desc(w.codes_u8[: n * w.k // 4].view(n, w.k // 4), bw)
    return d


def _launch(x, w, out, dots, check, config, gluon_kernel: bool):
    y = validate.kernel_out("mmq_wgmma", x, w, out, dots, check)
    m, n = y.shape
    if m == 0 or n == 0:
        return y
    cfg = _resolve(n, w.k, m, None, config)
    bt, bw = cfg["BM"], cfg["BN"]
    st = w.strides
    grid = (triton.cdiv(m, bt), triton.cdiv(n, bw))
    dd = dots if dots is not None else y
    if gluon_kernel:
        if cfg["GROUP_M"]:
            grid = (grid[0] * grid[1],)     # one axis: _tile orders the programs
        planned = not torch.cuda.is_current_stream_capturing()
        if planned:
            bufs, (q_desc, x_desc) = _views(x.device, m, w.k, bt)
            prepare.quantize_q8(x, order="plane", by_group=True, out=bufs)
        else:
            q, xs_t, _ = prepare.quantize_q8(x, order="plane", by_group=True)
            q_desc, x_desc = _act_descs(q, xs_t, bt)
        _wgmma_kernel[grid](q_desc, _code_desc(w, n, bw), x_desc, w.scales_f16, y, dd, m, n, y.stride(0),
                            st["scale_off"], st["scale_row"], **_consts(w.groups, cfg, dots is not None))
    else:
        q, xs_t, _ = prepare.quantize_q8(x, order="plane", by_group=True)
        _twin_kernel[grid](q, xs_t, xs_t.stride(0), w.codes_u8, w.scales_f16, y, dd, m, n, y.stride(0),
                           st["scale_off"], st["scale_row"], G=w.groups, BT=bt, BW=bw,
                           DOTS=dots is not None, INTERP=common.INTERPRET, num_warps=bw // 16)
    return y


def run(x, w, *, out=None, dots=None, check=True, config=None):
    """The Gluon kernel on sm_90, its twin elsewhere (the interpreter, other GPUs)."""
    return _launch(x, w, out, dots, check, config, _hopper(x.device))


def twin(x, w, *, out=None, dots=None, check=True, config=None):
    """The twin wherever it runs (on the GPU too: tests/test_mmq_wgmma.py compares the two)."""
    return _launch(x, w, out, dots, check, config, False)
