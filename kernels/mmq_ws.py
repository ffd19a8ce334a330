"""mmq_ws (prefill, M >= 17, sm_90, prepared weights): mmq_wgmma's arithmetic, warp-specialized.

A program owns NC * 64 weight rows and BT tokens. One producer warp group issues every TMA copy
(codes of all NC * 64 rows, the tokens' Q8 codes and group scales) into an S-deep ring; NC
consumer warp groups each own 64 rows. A consumer waits on the stage's `ready` barrier, runs its
four K = 32 MMAs (code plane s minus 1 from registers, mmq_wgmma._plane), folds, and arrives on the
stage's `empty` barrier; the producer refills a stage once all NC consumers have arrived. So the
consumers never wait on each other (mmq_wgmma's loop has five CTA-wide barriers a group), and one
consumer's fold runs while another's MMAs do. Each row's fp16 weight scale is loaded one group
ahead, so its latency hides under the next group's MMAs.

The fold is mmq_wgmma's, acc + dot * xs * ws, groups ascending from 0.0: mmq's FP32 order, so the
output is bit-identical to mmq and mmq_wgmma. Gluon does not run under TRITON_INTERPRET=1 nor off
sm_90: there run() launches mmq_wgmma's twin, the same dots and the same fold in plain Triton."""
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from kernels import mmq_wgmma, prepare, validate
from kernels import config as tiles

_plane = mmq_wgmma._plane


@gluon.jit
def _producer(q_desc, c_desc, x_desc, ready, empty, q_s, c_s, x_s, off_t, off_w, G):
    S: gl.constexpr = q_s.shape[0]
    NC: gl.constexpr = c_s.shape[0] // S
    for g in range(G):
        st = g % S
        # the stage's previous contents (group g - S) must be released by every consumer
        mbarrier.wait(empty.index(st), ((g // S) & 1) ^ 1, pred=g >= S)
        b = ready.index(st)
        mbarrier.expect(b, q_desc.block_type.nbytes + NC * c_desc.block_type.nbytes + x_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [off_t, g * 128], b, q_s.index(st))
        for c in gl.static_range(NC):   # TMA boxes are powers of two: one 64-row box a consumer
            tma.async_copy_global_to_shared(c_desc, [off_w + c * 64, g * 32], b, c_s.index(st * NC + c))
        tma.async_copy_global_to_shared(x_desc, [g, off_t], b, x_s.index(st))


@gluon.jit
def _consumer(q_s, c_s, x_s, ready, empty, s_ptr, y_ptr, d_ptr, M, N, stride_ym, scale_off, scale_row, off_t,
              off_w, G, CID: gl.constexpr):
    S: gl.constexpr = q_s.shape[0]
    BT: gl.constexpr = q_s.shape[1]
    NC: gl.constexpr = c_s.shape[0] // S
    # dots are asked for by an int32 d_ptr (run() passes the output itself otherwise)
    DOTS: gl.constexpr = d_ptr.dtype.element_ty == gl.int32
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BT, 32])
    la: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    rows = off_w + CID * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
    cols = off_t + gl.arange(0, BT, layout=gl.SliceLayout(0, mma))
    rmask = rows < N
    s_ptrs = s_ptr + scale_off + rows.to(gl.int64) * scale_row
    acc = gl.zeros([64, BT], gl.float32, mma)
    zero = gl.zeros([64, BT], gl.int32, mma)
    ws_next = gl.load(s_ptrs, mask=rmask, other=0.0)
    for g in range(G):
        st = g % S
        mbarrier.wait(ready.index(st), (g // S) & 1)
        codes = c_s.index(st * NC + CID).load(la)
        qb = q_s.index(st)
        d = warpgroup_mma(_plane(codes, 0), qb.slice(0, 32, dim=1).permute((1, 0)), zero, use_acc=False, is_async=True)
        d = warpgroup_mma(_plane(codes, 1), qb.slice(32, 32, dim=1).permute((1, 0)), d, is_async=True)
        d = warpgroup_mma(_plane(codes, 2), qb.slice(64, 32, dim=1).permute((1, 0)), d, is_async=True)
        d = warpgroup_mma(_plane(codes, 3), qb.slice(96, 32, dim=1).permute((1, 0)), d, is_async=True)
        ws = ws_next.to(gl.float32)
        ws_next = gl.load(s_ptrs + (g + 1), mask=rmask & (g + 1 < G), other=0.0)
        d = warpgroup_mma_wait(num_outstanding=0, deps=[d])
        xs = x_s.index(st).load(mma)            # [1, BT]
        if DOTS:
            d_off = (gl.expand_dims(cols.to(gl.int64), 0) * N + gl.expand_dims(rows, 1)) * G + g
            gl.store(d_ptr + d_off, d, mask=gl.expand_dims(rmask, 1) & gl.expand_dims(cols < M, 0))
        # every warp of this group has read the stage (registers, and its MMAs are complete)
        gl.thread_barrier()
        mbarrier.arrive(empty.index(st))
        acc = acc + d.to(gl.float32) * xs * gl.expand_dims(ws, 1)
    y_ptrs = y_ptr + gl.expand_dims(cols.to(gl.int64), 0) * stride_ym + gl.expand_dims(rows, 1)
    gl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=gl.expand_dims(rmask, 1) & gl.expand_dims(cols < M, 0))


@gluon.jit
def _consumer1(q_s, c_s, x_s, ready, empty, s_ptr, y_ptr, d_ptr, M, N, stride_ym, scale_off, scale_row, off_t,
               off_w, G):
    _consumer(q_s, c_s, x_s, ready, empty, s_ptr, y_ptr, d_ptr, M, N, stride_ym, scale_off, scale_row, off_t, off_w,
              G, 1)


@gluon.jit
def _consumer2(q_s, c_s, x_s, ready, empty, s_ptr, y_ptr, d_ptr, M, N, stride_ym, scale_off, scale_row, off_t,
               off_w, G):
    _consumer(q_s, c_s, x_s, ready, empty, s_ptr, y_ptr, d_ptr, M, N, stride_ym, scale_off, scale_row, off_t, off_w,
              G, 2)


@gluon.jit
def _consumer0(q_s, c_s, x_s, ready, empty, s_ptr, y_ptr, d_ptr, M, N, stride_ym, scale_off, scale_row, off_t,
               off_w, G):
    _consumer(q_s, c_s, x_s, ready, empty, s_ptr, y_ptr, d_ptr, M, N, stride_ym, scale_off, scale_row, off_t, off_w,
              G, 0)


@gluon.jit
def _ws_kernel(q_desc, c_desc, x_desc, s_ptr, y_ptr, d_ptr, M, N, stride_ym, scale_off, scale_row,
               G: gl.constexpr, BT: gl.constexpr, S: gl.constexpr, NC: gl.constexpr,
               REGS_C: gl.constexpr, REGS_P: gl.constexpr):
    off_t = gl.program_id(0) * BT
    off_w = gl.program_id(1) * (NC * 64)
    q_s = gl.allocate_shared_memory(gl.int8, [S, BT, 128], q_desc.layout)
    c_s = gl.allocate_shared_memory(gl.uint8, [S * NC, 64, 32], c_desc.layout)
    x_s = gl.allocate_shared_memory(gl.float32, [S, 1, BT], x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(S):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=NC)
    fence_async_shared()
    cargs = (q_s, c_s, x_s, ready, empty, s_ptr, y_ptr, d_ptr, M, N, stride_ym, scale_off, scale_row, off_t, off_w, G)
    pargs = (q_desc, c_desc, x_desc, ready, empty, q_s, c_s, x_s, off_t, off_w, G)
    if NC == 3:
        gl.warp_specialize([(_consumer0, cargs), (_consumer1, cargs), (_consumer2, cargs), (_producer, pargs)],
                           [4, 4, 4], [REGS_C, REGS_C, REGS_P])
    elif NC == 2:
        gl.warp_specialize([(_consumer0, cargs), (_consumer1, cargs), (_producer, pargs)], [4, 4], [REGS_C, REGS_P])
    else:
        gl.warp_specialize([(_consumer0, cargs), (_producer, pargs)], [4], [REGS_P])


# BM: tokens a tile (the MMA's N side); NC: consumer warp groups, 64 weight rows each;
# num_stages: the TMA ring's depth; REGS_C / REGS_P: registers a thread of a consumer / the
# producer after reallocation (the two worker counts must fit the register file with the default).
FIELDS = {"BM": tiles.pow2(64, 128), "NC": tiles.integer(1, 3), "num_stages": tiles.integer(2),
          "REGS_C": tiles.integer(24, 256), "REGS_P": tiles.integer(24, 256)}


def config(n: int, k: int, m: int, interpret: bool | None = None) -> dict:
    """{BM, NC, num_stages, REGS_C, REGS_P} from shapes only (the twin reads BM alone, with
    64-row tiles)."""
    return dict(BM=64 if m <= 64 else 128, NC=3, num_stages=4, REGS_C=160, REGS_P=32)


def configs(interpret: bool) -> list[dict]:
    return tiles.sweep("mmq_ws", lambda n, k, m: config(n, k, m, interpret))


def _resolve(n, k, m, interpret, cfg) -> dict:
    return tiles.force("mmq_ws", config(n, k, m, interpret), cfg, FIELDS)


def fold(n: int, k: int, m: int, interpret: bool | None = None, config: dict | None = None) -> dict:
    """mmq's FP32 order whatever the tiles: one split, one lane, groups ascending from 0.0."""
    _resolve(n, k, m, interpret, config)
    return dict(groups_per_split=k // 128, lanes=1, splits=1)


def kernel_args(q, codes, xs_t, groups: int, cfg: dict) -> tuple[dict, dict]:
    """(TMA descriptors, constexprs) of _ws_kernel for Q8 activations q [M, K], code bytes [N, K/4]
    and scales [G, M]."""
    bt = cfg["BM"]
    q_desc, x_desc = mmq_wgmma._act_descs(q, xs_t, bt)
    descs = dict(q_desc=q_desc, c_desc=mmq_wgmma._codes_desc(codes, 64), x_desc=x_desc)
    return descs, _consts(groups, cfg)


def _consts(groups: int, cfg: dict) -> dict:
    return dict(G=groups, BT=cfg["BM"], S=cfg["num_stages"], NC=cfg["NC"], REGS_C=cfg["REGS_C"],
                REGS_P=cfg["REGS_P"], num_warps=4)


def run(x, w, *, out=None, dots=None, check=True, config=None):
    """The Gluon kernel on sm_90, mmq_wgmma's twin elsewhere (the interpreter, other GPUs)."""
    y = validate.kernel_out("mmq_ws", x, w, out, dots, check)
    m, n = y.shape
    if m == 0 or n == 0:
        return y
    cfg = _resolve(n, w.k, m, None, config)
    if not mmq_wgmma._hopper(x.device):
        return mmq_wgmma.twin(x, w, out=y, dots=dots, check=False, config={"BM": cfg["BM"]})
    st = w.strides
    q, xs_t, _ = prepare.quantize_q8(x, order="plane", by_group=True)
    descs, cx = kernel_args(q, w.codes_u8[: n * w.k // 4].view(n, w.k // 4), xs_t, w.groups, cfg)
    _ws_kernel[(triton.cdiv(m, cfg["BM"]), triton.cdiv(n, 64 * cfg["NC"]))](
        descs["q_desc"], descs["c_desc"], descs["x_desc"], w.scales_f16, y, dots if dots is not None else y, m, n,
        y.stride(0), st["scale_off"], st["scale_row"], **cx)
    return y
