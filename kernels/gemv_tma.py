"""gemv_tma (M = 1 decode, sm_90, prepared weights): gemv's arithmetic and FP32 order, with the
weight codes and scales staged in shared memory by TMA, and all of the first S chunks asked for
before the PDL wait.

Why: gemv holds the chunks it loads before `griddepcontrol.wait` in registers, so every chunk
more costs programs per SM (results/2026-12-02-decode-levers/), and each call pays its start
and end while the weight stream stops. Here TMA writes a ring of S stages (codes [BN, GC, 8]
words and fp16 scales [BN, GC] a stage) without registers, so a program can have its whole
slice in flight while the previous kernels drain. After the wait one more TMA batch brings the
split's Q8 words, scales and group sums into shared memory (one L2 round trip, not one per
chunk).

Arithmetic, per chunk, is gemv's: plane s of code word j masked by 0x03030303 << 2s, an
unsigned-by-signed DP4A with activation word 8s + j, the plane sums shifted back and the group
sum subtracted, so the integer dots are int_gemv's. FP32 order is gemv's for the same tiles:
lane c of a row folds groups c, c + GC, ... of its split ascending (common.scale_accumulate's
expression), the GC lanes are summed by the pairwise tree, the split partials by the tile's
last program in split order. So for the same (BN, GC, groups_per_split, SPLIT) the output bits
are gemv's (tests/test_gemv_tma.py compares them on the GPU).

Groups past a split's end that a chunk's box still covers are read but folded as exact zeros
(their activation scale and weight scale are masked to 0), as gemv's masked loads give; rows
and groups past the tensor's end are zero-filled by TMA.

Gluon does not run under TRITON_INTERPRET=1; there, on GPUs other than sm_90, for raw weights
and for dots, run() launches gemv's kernel with this path's tiles (the twin): the same dots and
the same FP32 order.
"""
import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from kernels import common, gemv, prepare, splitk
from kernels import config as protocol, validate

STAGE_BYTES = 48 * 1024     # shared memory a program gives its ring of weight stages


@gluon.jit
def _gdc_launch_dependents():
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _gdc_wait():
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _dp4a_u8s8(a, b, acc):
    return gl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, acc],
                                     dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _issue_weights(c_desc, s_desc, bar, c_s, s_s, row0, g0, st):
    b = bar.index(st)
    mbarrier.expect(b, c_desc.block_type.nbytes + s_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(c_desc, [row0, g0, 0], b, c_s.index(st))
    tma.async_copy_global_to_shared(s_desc, [row0, g0], b, s_s.index(st))


@gluon.jit
def _kernel(c_desc, s_desc, a_desc, x_desc, t_desc, out_ptr, out_sn, part_ptr, count_ptr,
            dots_ptr, d_sn, d_sg, N, G, per,
            BN: gl.constexpr, GC: gl.constexpr, LOG_GC: gl.constexpr, CHUNKS: gl.constexpr,
            S: gl.constexpr, SPLIT: gl.constexpr, WRITE_DOTS: gl.constexpr, PDL: gl.constexpr,
            num_warps: gl.constexpr):
    if PDL:
        _gdc_launch_dependents()
    # [rows, groups, words]: a thread holds four words (16 bytes) of one row's group; a warp
    # reads two rows' 256-byte chunks, whole 128-byte lines
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [32 // (2 * GC), GC, 2], [num_warps, 1, 1], [2, 1, 0])
    L2: gl.constexpr = gl.SliceLayout(2, L3)         # [rows, groups]
    LA: gl.constexpr = gl.SliceLayout(0, L3)         # [groups, words]: the activations, broadcast on rows
    LT: gl.constexpr = gl.BlockedLayout([1, GC], [32, 1], [num_warps, 1], [1, 0])   # a row's lanes in a thread
    L1: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    tile = gl.program_id(0)
    pid_k = gl.program_id(1)
    row0 = tile * BN
    g_begin = pid_k * per
    g_end = gl.minimum(g_begin + per, G)

    c_s = gl.allocate_shared_memory(gl.int32, [S, BN, GC, 8], c_desc.layout)
    s_s = gl.allocate_shared_memory(gl.float16, [S, BN, GC], s_desc.layout)
    a_s = gl.allocate_shared_memory(gl.int32, [CHUNKS, GC, 32], a_desc.layout)
    # a TMA copy's shared-memory target must be 128-byte aligned: a chunk's scales and sums
    # come as boxes of 32 groups (128 bytes), of which the first GC are used
    x_s = gl.allocate_shared_memory(gl.float32, [CHUNKS, 1, 32], x_desc.layout)
    t_s = gl.allocate_shared_memory(gl.int32, [CHUNKS, 1, 32], t_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    abar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(S):
        mbarrier.init(bar.index(i), count=1)
    mbarrier.init(abar.index(0), count=1)
    fence_async_shared()
    # the weights are constants: the first S chunks are asked for before the wait
    for i in gl.static_range(S):
        if i < CHUNKS:
            _issue_weights(c_desc, s_desc, bar, c_s, s_s, row0, g_begin + i * GC, i)
    if PDL:
        _gdc_wait()
    # the activations are the previous kernel's output: after the wait, all of the split's at once
    ab = abar.index(0)
    mbarrier.expect(ab, CHUNKS * (a_desc.block_type.nbytes + x_desc.block_type.nbytes + t_desc.block_type.nbytes))
    for i in gl.static_range(CHUNKS):
        g0 = g_begin + i * GC
        tma.async_copy_global_to_shared(a_desc, [g0, 0], ab, a_s.index(i))
        tma.async_copy_global_to_shared(x_desc, [0, g0], ab, x_s.index(i))
        tma.async_copy_global_to_shared(t_desc, [0, g0], ab, t_s.index(i))

    rn = row0 + gl.arange(0, BN, layout=gl.SliceLayout(1, L2))
    gi = gl.arange(0, GC, layout=gl.SliceLayout(0, L2))
    lanes = gl.zeros([BN, GC], gl.float32, L2)
    zero3 = gl.zeros([BN, GC, 8], gl.int32, L3)
    plane0 = gl.full([], 0x03030303, gl.int32)   # shifted in int32: 0xC0C0C0C0 wraps
    mbarrier.wait(ab, 0)
    for i in range(CHUNKS):
        st = i % S
        mbarrier.wait(bar.index(st), (i // S) & 1)
        w = c_s.index(st).load(L3)
        ws = s_s.index(st).load(L2).to(gl.float32)
        aq = a_s.index(i)
        dot = gl.zeros([BN, GC], gl.int32, L2)
        for s in gl.static_range(4):
            a = aq.slice(8 * s, 8, dim=1).load(LA)
            p = _dp4a_u8s8(w & (plane0 << (2 * s)), gl.expand_dims(a, 0), zero3)
            dot += gl.sum(p, axis=2) >> (2 * s)
        g = g_begin + i * GC + gi
        g_ok = gl.expand_dims(g < g_end, 0)
        t = t_s.index(i).slice(0, GC, dim=1).load(L2)
        xs = gl.where(g_ok, x_s.index(i).slice(0, GC, dim=1).load(L2), 0.0)
        ws = gl.where(g_ok, ws, 0.0)
        dot = dot - gl.where(g_ok, t, 0)
        lanes = lanes + dot.to(gl.float32) * xs * ws       # common.scale_accumulate's expression
        if WRITE_DOTS:
            rn2 = gl.expand_dims(rn, 1)
            gl.store(dots_ptr + rn2 * d_sn + gl.expand_dims(g, 0) * d_sg, dot, mask=(rn2 < N) & g_ok)
        if S < CHUNKS:
            gl.thread_barrier()   # every warp is done with stage st before TMA refills it
            if i + S < CHUNKS:
                _issue_weights(c_desc, s_desc, bar, c_s, s_s, row0, g_begin + (i + S) * GC, st)
    for i in gl.static_range(S):
        mbarrier.invalidate(bar.index(i))
    mbarrier.invalidate(abar.index(0))
    # the lanes summed by the pairwise tree ((l0+l1)+(l2+l3))+... (common.lane_tree's order)
    y = gl.convert_layout(lanes, LT)
    for r in gl.static_range(LOG_GC):
        lo, hi = gl.split(gl.reshape(y, [BN, GC >> (r + 1), 2]))
        y = lo + hi
    y = gl.convert_layout(gl.reshape(y, [BN]), L1)
    rows = row0 + gl.arange(0, BN, layout=L1)
    ok = rows < N
    if SPLIT == 1:
        gl.store(out_ptr + rows * out_sn, y.to(out_ptr.dtype.element_ty), mask=ok)
    else:
        # splitk.sum_if_last's protocol: store the partial, count the arrival, and the tile's
        # last program sums the SPLIT partials in split order and puts the counter back to 0
        gl.store(part_ptr + pid_k * N + rows, y, mask=ok)
        gl.thread_barrier()
        arrived = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT - 1:
            gl.thread_barrier()
            acc = gl.load(part_ptr + rows, mask=ok, other=0.0, cache_modifier=".cg")
            for s in gl.static_range(1, SPLIT):
                acc = acc + gl.load(part_ptr + s * N + rows, mask=ok, other=0.0, cache_modifier=".cg")
            gl.store(out_ptr + rows * out_sn, acc.to(out_ptr.dtype.element_ty), mask=ok)
            gl.store(count_ptr + tile, 0)


FIELDS = {"BN": protocol.pow2(8, 256), "GC": protocol.pow2(1, 16), "groups_per_split": protocol.integer(1),
          "SPLIT": protocol.integer(1), "num_stages": protocol.integer(1), "PDL": protocol.flag,
          "num_warps": protocol.pow2(1, 8)}


def config(n: int, k: int, m: int = 1, interpret: bool | None = None) -> dict:
    """{BN, GC, groups_per_split, SPLIT, num_stages, PDL, num_warps} from shapes only.
    num_stages: the TMA ring's depth (stages asked for before the PDL wait). interpret: the
    twin's tiles (gemv's kernel) or the GPU's (default: this process's)."""
    return dict(_config(n, k, common.INTERPRET if interpret is None else bool(interpret)))


def configs(interpret: bool) -> list[dict]:
    return protocol.sweep("gemv_tma", lambda n, k, m: config(n, k, m, interpret))


@functools.lru_cache(maxsize=None)
def _config(n: int, k: int, interpret: bool) -> tuple:
    groups = k // 128
    if interpret:
        # the interpreter pays per program: gemv's interpreter tiles (several chunks, a masked
        # tail and the in-kernel split reduction in small cases)
        bn, gc, warps = min(128, max(8, triton.next_power_of_2(n))), 2, 4
        per, split = splitk.split_groups(groups, 2 if groups >= 4 else 1)
    else:
        gc = min(8, triton.next_power_of_2(groups))
        bn, warps = 32, 4
        # about four programs an SM of 132 on every shape: split-K where rows alone give fewer
        want = max(1, triton.cdiv(4 * 132, triton.cdiv(n, bn)))
        per, split = splitk.split_groups(groups, want, gc)
    chunks = triton.cdiv(per, gc)
    stage = bn * gc * 34
    stages = max(1, min(chunks, STAGE_BYTES // stage))
    return (("BN", bn), ("GC", gc), ("groups_per_split", per), ("SPLIT", split), ("num_stages", stages),
            ("PDL", True), ("num_warps", warps))


def _resolve(n, k, interpret, cfg) -> dict:
    c = protocol.force("gemv_tma", config(n, k, 1, interpret), cfg, FIELDS)
    if cfg is not None:
        protocol.splits("gemv_tma", k // 128, c["groups_per_split"], c["SPLIT"])
        if not (common.INTERPRET if interpret is None else interpret) and c["GC"] < 8:
            # TMA boxes are at least 16 bytes wide: GC fp16 scales of a row
            raise ValueError(f"gemv_tma: config field GC={c['GC']}: the GPU kernel needs GC >= 8")
    return c


def fold(n: int, k: int, m: int = 1, interpret: bool | None = None, config: dict | None = None) -> dict:
    """gemv's FP32 order for these tiles: GC lanes per row, groups_per_split, SPLIT."""
    c = _resolve(n, k, interpret, config)
    return dict(lanes=c["GC"], groups_per_split=c["groups_per_split"], splits=c["SPLIT"])


def _hopper(device) -> bool:
    if common.INTERPRET or device.type != "cuda":
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device())[0] == 9


@functools.lru_cache(maxsize=None)
def _capability(index: int):
    return torch.cuda.get_device_capability(index)


@functools.lru_cache(maxsize=None)
def _layout(block: tuple, bits: int):
    # unswizzled: the kernel reads rows of 16-byte vectors; a stage is one box
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=len(block))


def _desc(t, block, bits):
    return TensorDescriptor.from_tensor(t, list(block), _layout(tuple(block), bits))


def weight_descs(w, cfg: dict):
    """(codes [N, G, 8] int32, scales [N, G] fp16) descriptors of a prepared weight for tiles of
    BN rows x GC groups, kept in the weight's cache of what derives from its bytes."""
    bn, gc = cfg["BN"], cfg["GC"]
    key = ("gemv_tma descriptors", bn, gc)
    d = w._views.get(key)
    if d is None:
        n, g = w.n, w.groups
        codes = w.codes_i32[: n * g * 8].view(n, g, 8)
        off = w.strides["scale_off"]
        scales = w.scales_f16[off: off + n * g].view(n, g)
        d = w._views[key] = (_desc(codes, (bn, gc, 8), 32), _desc(scales, (bn, gc), 16))
    return d


def act_descs(q, xs, t, gc: int):
    """Descriptors of one row's Q8 words [G, 32] int32 (boxes of GC groups), scales [1, G] and
    sums [1, G] (boxes of 32 groups: 128 bytes, the alignment of a TMA target)."""
    g = xs.shape[1]
    return (_desc(q.view(torch.int32).view(g, 32), (gc, 32), 32), _desc(xs, (1, 32), 32), _desc(t, (1, 32), 32))


def supported(x, w) -> bool:
    """Whether the Gluon kernel runs (else the twin): sm_90, prepared weights, G a multiple of 8
    (TMA wants 16-byte row strides for the fp16 scales)."""
    return _hopper(x.device) and w.layout == "prepared" and w.groups % 8 == 0


def run(x, w, *, out=None, dots=None, check=True, config=None):
    """The Gluon kernel where supported(), the twin elsewhere."""
    return _launch(x, w, out, dots, check, config, None)


def twin(x, w, *, out=None, dots=None, check=True, config=None):
    """gemv's kernel with this path's tiles, wherever it runs (the GPU test compares the two)."""
    return _launch(x, w, out, dots, check, config, False)


def _launch(x, w, out, dots, check, config, use_gluon):
    out = validate.kernel_out(__name__, x, w, out, dots, check)
    (m, k), n = x.shape, out.shape[1]
    if m == 0 or n == 0:
        return out
    gluon_kernel = supported(x, w) if use_gluon is None else use_gluon
    cfg = _resolve(n, k, None, config)
    split, bn = cfg["SPLIT"], cfg["BN"]
    row_tiles = triton.cdiv(n, bn)
    pdl = cfg["PDL"] and not common.INTERPRET and x.device.type == "cuda"
    count = torch.empty(row_tiles, dtype=torch.int32, device=x.device) if split > 1 else None
    q, xs, t = prepare.quantize_q8(x, order="plane", pdl=pdl, zero=count)
    if not gluon_kernel:
        gcfg = dict(BN=bn, GC=cfg["GC"], groups_per_split=cfg["groups_per_split"], SPLIT=split, DEPTH=1,
                    num_warps=cfg["num_warps"])
        gemv.launch(q, xs, t, w, out, gcfg, pdl=pdl, count=count, dots=dots)
        return out
    gc, per = cfg["GC"], cfg["groups_per_split"]
    c_desc, s_desc = weight_descs(w, cfg)
    a_desc, x_desc, t_desc = act_descs(q, xs, t, gc)
    part = splitk.partials(out.device, split * n) if split > 1 else out
    dd = dots if dots is not None else out
    ds = dots.stride() if dots is not None else (0, 0, 0)
    _kernel[(row_tiles, split)](
        c_desc, s_desc, a_desc, x_desc, t_desc, out, out.stride(1), part, count if split > 1 else t,
        dd, ds[1], ds[2], n, w.groups, per,
        BN=bn, GC=gc, LOG_GC=gc.bit_length() - 1, CHUNKS=triton.cdiv(per, gc), S=cfg["num_stages"],
        SPLIT=split, WRITE_DOTS=dots is not None, PDL=pdl, num_warps=cfg["num_warps"], launch_pdl=pdl)
    return out
