"""gemv's GEMV kernel with its work switched on stage by stage (a measurement aid, not a path):
which part of the M = 1 call costs the microseconds beyond a pure read of its bytes. Each stage
keeps gemv's tiles, chunks, DEPTH ring (1 or 2), PDL order and grid, and adds to the one before:

  read  the weight code words and scales, XOR-folded (the loads kept live, no arithmetic)
  act   + each chunk's activation words, sums and scales (loaded after the look-ahead chunk's
        weights: gemv's order with ACT_FIRST false; folded)
  dot   + the DP4A plane dots and the sum correction (int32, summed)
  fold  + the FP32 fold (common.scale_accumulate) and the lane tree; the partial stored
  full  + the split-K sum by the tile's last program: gemv's output, bit for bit

Stages read, act and dot write a sum that means nothing; fold equals gemv where a shape has one
split, full equals gemv everywhere (tools/profile/decode_boundary.py --stages checks both).

The stages compile to different register counts, so they may run more or fewer programs an SM
than full (in the sm_90 compile: read and act fewer registers on every shape; dot more than
full on in_proj and qkv, one program an SM instead of two). A stage's time is its work at its
own occupancy: decode_boundary.py records each stage's registers and programs an SM beside it."""
import torch
import triton
import triton.language as tl

from kernels import common, gemv, prepare, splitk

STAGES = ("read", "act", "dot", "fold", "full")


@triton.jit
def _stage_kernel(a_ptr, xs_ptr, t_ptr, codes_ptr, scales_ptr, out_ptr, out_sn, part_ptr, count_ptr,
                  N, G, code_row, code_group, code_off, scale_row, scale_group, scale_off, per,
                  BN: tl.constexpr, GC: tl.constexpr, LOG_GC: tl.constexpr, CHUNKS: tl.constexpr,
                  DEPTH: tl.constexpr, SPLIT: tl.constexpr, MASKED: tl.constexpr, PREPARED: tl.constexpr,
                  STAGE: tl.constexpr, PDL: tl.constexpr, INTERP: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    tile = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = tile * BN + tl.arange(0, BN)
    n_ok = rn < N
    gi = tl.arange(0, GC)
    j = tl.arange(0, 8)
    g_begin = pid_k * per
    g_end = tl.minimum(g_begin + per, G)
    w1, s1 = gemv._chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, 0, g_end, G, code_row, code_group,
                         code_off, scale_row, scale_group, scale_off, GC, CHUNKS, PREPARED, MASKED)
    if DEPTH == 2:
        w2, s2 = gemv._chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, 1, g_end, G, code_row, code_group,
                             code_off, scale_row, scale_group, scale_off, GC, CHUNKS, PREPARED, MASKED)
    if PDL:
        tl.extra.cuda.gdc_wait()
    lanes = tl.zeros([BN, GC], dtype=tl.float32)
    # [BN, GC] like the fold's lanes: a [BN, GC * 8] one held more registers than the full kernel
    bits = tl.zeros([BN, GC], dtype=tl.int32)
    idot = tl.zeros([BN, GC], dtype=tl.int32)
    plane0 = tl.full([], 0x03030303, tl.int32)
    for i in range(0, CHUNKS):
        g = g_begin + i * GC + gi
        g_ok = g < g_end
        wc = w1
        ws = s1.to(tl.float32)
        if DEPTH == 1:
            w1, s1 = gemv._chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, i + 1, g_end, G, code_row,
                                 code_group, code_off, scale_row, scale_group, scale_off, GC, CHUNKS,
                                 PREPARED, MASKED)
        else:
            w1, s1 = w2, s2
            w2, s2 = gemv._chunk(codes_ptr, scales_ptr, rn, n_ok, g_begin, i + 2, g_end, G, code_row,
                                 code_group, code_off, scale_row, scale_group, scale_off, GC, CHUNKS,
                                 PREPARED, MASKED)
        if STAGE == 0:
            bits ^= tl.xor_sum(tl.reshape(wc, (BN, GC, 8)), axis=2)
            lanes += ws
        else:
            if MASKED:
                t = tl.load(t_ptr + g, mask=g_ok, other=0)
                xs = tl.load(xs_ptr + g, mask=g_ok, other=0.0)
            else:
                t = tl.load(t_ptr + g)
                xs = tl.load(xs_ptr + g)
            if STAGE == 1:
                w = tl.reshape(wc, (BN, GC, 8))
                for s in tl.static_range(4):
                    w = w ^ gemv._act(a_ptr, g, g_ok, s, j, MASKED)[None, :, :]
                bits ^= tl.xor_sum(w, axis=2)
                idot += t[None, :]
                lanes += ws * xs[None, :]
            else:
                w = tl.reshape(wc, (BN, GC, 8))
                dot = tl.zeros([BN, GC], dtype=tl.int32)
                for s in tl.static_range(4):
                    a = gemv._act(a_ptr, g, g_ok, s, j, MASKED)
                    acc = common.dp4a(w & (plane0 << (2 * s)), a[None, :, :],
                                      tl.zeros([BN, GC, 8], dtype=tl.int32), INTERP, True)
                    dot += tl.sum(acc, axis=2) >> (2 * s)
                dot = dot - t[None, :]
                if STAGE == 2:
                    idot += dot
                    lanes += ws * xs[None, :]
                else:
                    lanes = common.scale_accumulate(lanes, dot, xs[None, :], ws)
    if STAGE <= 2:
        # meaningless sums that keep every load and dot live
        y = tl.sum(lanes, axis=1) + (tl.sum(bits, axis=1) + tl.sum(idot, axis=1)).to(tl.float32)
    else:
        y = common.lane_tree(lanes, BN, GC, LOG_GC)
    if SPLIT == 1:
        tl.store(out_ptr + rn * out_sn, prepare.to_out(y, out_ptr.dtype.element_ty, INTERP), mask=n_ok)
    else:
        tl.store(part_ptr + pid_k * N + rn, y, mask=n_ok)
        if STAGE == 4:
            splitk.sum_if_last(part_ptr, count_ptr, tile, rn, n_ok, N, out_ptr, rn * out_sn, SPLIT, INTERP)


def launch(stage: str, q, xs, t, w, out, cfg, *, pdl: bool, count, part):
    """One call of stage `stage` (STAGES) on quantized activations (q, xs, t of
    prepare.quantize_q8(order="plane")); returns the launched kernel (its n_regs, n_spills and
    metadata.shared give its occupancy). cfg: gemv.config's; part: fp32 [SPLIT * N] partials and
    count: int32 [row tiles] zeroed counters where cfg["SPLIT"] > 1 (full puts them back to 0)."""
    if cfg["DEPTH"] not in (1, 2):
        raise ValueError(f"gemv_stages: DEPTH {cfg['DEPTH']} not supported (1 or 2)")
    n, g = w.n, w.groups
    bn, gc, split, per = cfg["BN"], cfg["GC"], cfg["SPLIT"], cfg["groups_per_split"]
    st = w.strides
    prepared = w.layout == "prepared"
    return _stage_kernel[(triton.cdiv(n, bn), split)](
        q[0].view(torch.int32), xs[0], t[0],
        w.codes_i32 if prepared else w.codes_u8, w.scales_f16, out, out.stride(1),
        part if split > 1 else out, count if split > 1 else t[0],
        n, g, st["code_row"], st["code_group"], st["code_off"],
        st["scale_row"], st["scale_group"], st["scale_off"], per,
        BN=bn, GC=gc, LOG_GC=gc.bit_length() - 1, CHUNKS=triton.cdiv(per, gc), DEPTH=cfg["DEPTH"], SPLIT=split,
        MASKED=not (prepared and n % bn == 0 and per % gc == 0 and g % per == 0),
        PREPARED=prepared, STAGE=STAGES.index(stage), PDL=pdl, INTERP=common.INTERPRET,
        num_warps=cfg["num_warps"], num_stages=1, **({"launch_pdl": True} if pdl else {}))
