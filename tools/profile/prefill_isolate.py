"""Where mmq_wgmma's prefill call time goes (a measurement aid, not a gate): per PQ2 shape at
M = 2048 (--m), on 2 weight copies, each row one CUDA graph of calls on the copies, timed in
alternating rounds in one process:

- path: mmq_wgmma.run as called (the Q8 quantize kernel, then the Gluon kernel);
- full, nofold, noplanes, mma_only: a copy of mmq_wgmma's _wgmma_kernel (the same tiles, TMA
  ring, barriers and launch grid, kernels.mmq_wgmma.config) with two constexpr flags, launched
  alone on activations quantized once before timing:
    PLANES=1: each of the four K=32 MMAs a group takes code plane s minus 1, built in registers
      from the staged code bytes (kernels.mmq_wgmma._plane), as mmq_wgmma does;
    PLANES=0: no plane building: all four MMAs read the staged [BW, 32] code bytes straight
      from shared memory as int8 (A from shared memory; the code descriptor is built over the
      bytes viewed as int8). Wrong values on purpose: the same MMAs, TMA traffic and barriers.
      The code bytes' load from shared memory into registers goes too, and the tensor cores
      read A from shared memory instead (2 KB an MMA beside B's 4 KB).
    FOLD=1: per group acc + dot * xs * ws with the weight-scale load, as mmq_wgmma does;
    FOLD=0: per group an int32 acc += dot, no scale read (the xs tile is still staged by TMA),
      the store converts acc to float then to the output dtype. Wrong values on purpose.
  full = PLANES 1 FOLD 1 (must give mmq_wgmma's bits: checked and printed per shape and M, the
  sign that the copy is faithful), nofold = 1 0, noplanes = 0 1, mma_only = 0 0;
- cublas: kernels.cublas (torch.matmul then a copy into out, as the bench's baseline) in BF16
  on dense weights of the same shape.

Per row: median µs a call over the rounds [min-max], int8 Top/s (2MNK/t), the fraction of
plan.INT8_PEAK_TOPS (the H200's dense int8 peak at 1980 MHz), cuBLAS's time over the row's, the
SM clock and cycles a call (µs x MHz). Per shape and M: the fold's share (full - nofold), the
planes' share (full - noplanes), the quantize's (path - full), and mma_only against the MMA work
at peak scaled to the clock read while mma_only ran (2MNK / 1979e12 * 1980 / MHz).

The SM clock is read by the bench's instruments (pq2verify.bench.timing: nvml_reader, and a
Sampler tagged with the row while its sample's replays run, reading every --clock-ms). A row's
clock is the median of its readings over all rounds (their count and range are recorded;
without NVML the clock columns read n/a and the JSON says why). nvidia-smi's clocks are
recorded at start and end too.

Each round times every row once (the order reversed every other round), so drift hits all
rows alike. Writes JSON after each shape; shapes not started once --budget-s has passed are
skipped (and listed).

    python tools/profile/prefill_isolate.py $OUT/isolate.json --shapes gate_up,down --m 2048
"""
import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from kernels import cublas, mmq_wgmma, prepare
from kernels.mmq_wgmma import _issue, _plane
from pq2verify import inputs, registry
from pq2verify.bench import plan
from pq2verify.bench.plan import INT8_PEAK_TOPS
from pq2verify.bench.sweep import capture, clocks, pq2_shape_names
from pq2verify.bench.timing import Sampler, nvml_reader
from pq2verify.cli import positive_float, positive_int, positive_ints

PEAK_MHZ = 1980.0       # the clock INT8_PEAK_TOPS is quoted at
MAX_REPS = 1000
COPIES = 2
# label -> (PLANES, FOLD) of the variant kernel
VARIANTS = {"full": (1, 1), "nofold": (1, 0), "noplanes": (0, 1), "mma_only": (0, 0)}
ROWS = ("path", *VARIANTS, "cublas")


@gluon.jit
def _group_v(acc, g, S: gl.constexpr, bar, q_s, c_s, x_s, s_ptrs, zero, rows, N,
             mma: gl.constexpr, la: gl.constexpr, PLANES: gl.constexpr, FOLD: gl.constexpr):
    # mmq_wgmma._group with the plane building and the fold each switchable (module docstring)
    st = g % S
    mbarrier.wait(bar.index(st), (g // S) & 1)
    qb = q_s.index(st)
    if PLANES:
        codes = c_s.index(st).load(la)
        d = warpgroup_mma(_plane(codes, 0), qb.slice(0, 32, dim=1).permute((1, 0)), zero, use_acc=False,
                          is_async=True)
        d = warpgroup_mma(_plane(codes, 1), qb.slice(32, 32, dim=1).permute((1, 0)), d, is_async=True)
        d = warpgroup_mma(_plane(codes, 2), qb.slice(64, 32, dim=1).permute((1, 0)), d, is_async=True)
        d = warpgroup_mma(_plane(codes, 3), qb.slice(96, 32, dim=1).permute((1, 0)), d, is_async=True)
    else:
        # the staged int8 code tile itself as A, from shared memory: no register work for A
        cb = c_s.index(st)
        d = warpgroup_mma(cb, qb.slice(0, 32, dim=1).permute((1, 0)), zero, use_acc=False, is_async=True)
        d = warpgroup_mma(cb, qb.slice(32, 32, dim=1).permute((1, 0)), d, is_async=True)
        d = warpgroup_mma(cb, qb.slice(64, 32, dim=1).permute((1, 0)), d, is_async=True)
        d = warpgroup_mma(cb, qb.slice(96, 32, dim=1).permute((1, 0)), d, is_async=True)
    if FOLD:
        # the scale load issued before the wait, as in mmq_wgmma, so it overlaps the MMAs
        ws = gl.load(s_ptrs + g, mask=rows < N, other=0.0).to(gl.float32)
        d = warpgroup_mma_wait(num_outstanding=0, deps=[d])
        xs = x_s.index(st).load(mma)            # [1, BT]
        acc = acc + d.to(gl.float32) * xs * gl.expand_dims(ws, 1)
    else:
        d = warpgroup_mma_wait(num_outstanding=0, deps=[d])
        acc = acc + d
    return acc


@gluon.jit
def _variant_kernel(q_desc, c_desc, x_desc, s_ptr, y_ptr, M, N, stride_ym, scale_off, scale_row,
                    G: gl.constexpr, BT: gl.constexpr, S: gl.constexpr, PLANES: gl.constexpr, FOLD: gl.constexpr,
                    num_warps: gl.constexpr):
    # mmq_wgmma._wgmma_kernel without DOTS, with _group_v's two switches
    BW: gl.constexpr = 16 * num_warps
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BT, 32])
    la: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    off_t = gl.program_id(0) * BT
    off_w = gl.program_id(1) * BW
    q_s = gl.allocate_shared_memory(gl.int8, [S, BT, 128], q_desc.layout)
    # uint8 for PLANES=1 (as mmq_wgmma), int8 for PLANES=0 (a wgmma operand): the descriptor's dtype
    c_s = gl.allocate_shared_memory(c_desc.dtype, [S, BW, 32], c_desc.layout)
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
    if FOLD:
        acc = gl.zeros([BW, BT], gl.float32, mma)
    else:
        acc = gl.zeros([BW, BT], gl.int32, mma)
    zero = gl.zeros([BW, BT], gl.int32, mma)
    for g in range(G):
        acc = _group_v(acc, g, S, bar, q_s, c_s, x_s, s_ptrs, zero, rows, N, mma, la, PLANES, FOLD)
        gl.thread_barrier()   # every warp is done with stage g % S before TMA refills it
        if g + S < G:
            _issue(q_desc, c_desc, x_desc, bar, q_s, c_s, x_s, g + S, g % S, off_t, off_w)
    for i in gl.static_range(S):
        mbarrier.invalidate(bar.index(i))
    y_ptrs = y_ptr + gl.expand_dims(cols.to(gl.int64), 0) * stride_ym + gl.expand_dims(rows, 1)
    out = acc.to(gl.float32).to(y_ptr.dtype.element_ty)
    gl.store(y_ptrs, out, mask=gl.expand_dims(rows < N, 1) & gl.expand_dims(cols < M, 0))


def code_desc(w, bw: int, planes: int):
    """The weight's code-byte descriptor: uint8 as mmq_wgmma builds it, or over the same bytes
    viewed as int8 (PLANES=0 hands the shared tile to the MMA as its int8 A operand)."""
    codes = w.codes_u8[: w.n * w.k // 4].view(w.n, w.k // 4)
    if planes:
        return mmq_wgmma._codes_desc(codes, bw)
    return mmq_wgmma._desc(codes.view(torch.int8), (bw, 32), gl.int8)


def variant_call(q, xs_t, w, out, cfg: dict, planes: int, fold: int):
    """A thunk launching the variant kernel on pre-quantized activations (descriptors built once)."""
    m, n = out.shape
    bt, bw = cfg["BM"], cfg["BN"]
    q_desc, x_desc = mmq_wgmma._act_descs(q, xs_t, bt)
    c_desc = code_desc(w, bw, planes)
    st = w.strides
    grid = (triton.cdiv(m, bt), triton.cdiv(n, bw))

    def call():
        _variant_kernel[grid](q_desc, c_desc, x_desc, w.scales_f16, out, m, n, out.stride(0), st["scale_off"],
                              st["scale_row"], G=w.groups, BT=bt, S=cfg["num_stages"], PLANES=planes, FOLD=fold,
                              num_warps=bw // 16)
    return call


def time_rows(timers: dict, rounds: int, sample_ms: float, smp: Sampler) -> dict:
    """{label: {"times_s": [seconds a call per round], "reps": n}}: one warm-up sample sizes each
    row's replays to about sample_ms, then every row once a round (the order reversed every
    other round), the sampler tagged with the row while its replays run."""
    reps = {}
    for lab, t in timers.items():
        est_us = t.sample(1)
        reps[lab] = min(MAX_REPS, max(1, math.ceil(sample_ms * 1e3 / max(est_us, 1e-3))))
    res = {lab: {"times_s": [], "reps": reps[lab]} for lab in timers}
    labels = list(timers)
    for r in range(rounds):
        for lab in (labels if r % 2 == 0 else labels[::-1]):
            smp.mark(lab)
            us = timers[lab].sample(reps[lab], during=smp.poll)
            smp.mark(None)
            res[lab]["times_s"].append(us / 1e6 / COPIES)
    return res


def bits_equal(a, b) -> bool:
    return bool(torch.equal(a.view(torch.int16), b.view(torch.int16)))


def measure(name, n, k, m, ws, ds, args, smp, t0) -> dict:
    """Every row of one shape at one M: build, check full's bits, time, summarize."""
    x = inputs.activations(m, k, seed=1, device="cuda")
    outs = [torch.empty(m, n, dtype=x.dtype, device="cuda") for _ in range(COPIES)]
    cfg = mmq_wgmma.config(n, k, m)
    # quantized once for the kernel-alone rows, as run() would quantize x
    q, xs_t, _ = prepare.quantize_q8(x, order="plane", by_group=True)
    thunks = {"path": [lambda w=w, o=o: mmq_wgmma.run(x, w, out=o, check=False) for w, o in zip(ws, outs)]}
    for lab, (pl, fo) in VARIANTS.items():
        thunks[lab] = [variant_call(q, xs_t, w, o, cfg, pl, fo) for w, o in zip(ws, outs)]
    thunks["cublas"] = [lambda d=d, o=o: cublas.run(x, d, out=o, check=False) for d, o in zip(ds, outs)]

    # the faithful-copy check: full's bits against the path's on the same weight
    mmq_wgmma.run(x, ws[0], out=outs[0], check=False)
    ref = outs[0].clone()
    errors, same = {}, None
    try:
        outs[0].fill_(float("nan"))     # a launch that writes nothing cannot pass
        thunks["full"][0]()
        torch.cuda.synchronize()
        same = bits_equal(outs[0], ref)
    except Exception as e:
        errors["full"] = repr(e)[:300]
    del ref

    timers = {}
    for lab in ROWS:
        if lab in errors:
            continue
        try:
            timers[lab] = capture(thunks[lab])
        except Exception as e:   # a variant the compiler or the GPU refuses: report, go on
            errors[lab] = repr(e)[:300]
            torch.cuda.synchronize()
    for lab, e in errors.items():
        print(f"{name:8s} M={m:5d} {lab:9s} ERROR {e}", flush=True)
    raw = time_rows(timers, args.rounds, args.sample_ms, smp) if timers else {}
    for t in timers.values():
        t.close()
    del timers, thunks, outs, q, xs_t
    torch.cuda.empty_cache()
    rows, derived = summarize(name, m, n, k, raw, {lab: smp.summary(lab) for lab in raw}, same, t0)
    return {"n": n, "k": k, "m": m, "config": cfg, "bits_equal_path": same, "rows": rows, "derived": derived,
            "errors": errors}


def summarize(name, m, n, k, raw: dict, reads: dict, same, t0: float) -> tuple[dict, dict]:
    """(rows, derived) of time_rows' result and each row's clock readings (Sampler.summary),
    printed: one line a row, then the shares."""
    work = 2 * m * n * k
    rows = {}
    for lab, r in raw.items():
        ts = r["times_s"]
        t = statistics.median(ts)
        clk = reads[lab].get("sm_mhz")
        mhz = clk["median"] if clk else None
        rows[lab] = {"us": t * 1e6, "min_us": min(ts) * 1e6, "max_us": max(ts) * 1e6,
                     "us_rounds": [v * 1e6 for v in ts],
                     "tops": work / t / 1e12, "peak": work / t / 1e12 / INT8_PEAK_TOPS,
                     "sm_mhz": mhz, "sm_mhz_range": [clk["min"], clk["max"]] if clk else None,
                     "clock_reads": reads[lab]["n"], "cycles": t * 1e6 * mhz if mhz else None, "reps": r["reps"]}
    base = rows.get("cublas", {}).get("us")
    for row in rows.values():
        row["x_cublas"] = base / row["us"] if base else None

    def diff(a, b):
        return rows[a]["us"] - rows[b]["us"] if a in rows and b in rows else None
    derived = {"fold_us": diff("full", "nofold"), "planes_us": diff("full", "noplanes"),
               "quantize_us": diff("path", "full")}
    mo = rows.get("mma_only")
    if mo and mo["sm_mhz"]:
        peak_s = work / (INT8_PEAK_TOPS * 1e12) * PEAK_MHZ / mo["sm_mhz"]
        derived.update(mma_peak_us_at_clock=peak_s * 1e6, mma_only_of_peak_at_clock=peak_s * 1e6 / mo["us"])
    for lab, row in rows.items():
        mhz = f"{row['sm_mhz']:6.0f} MHz ({row['clock_reads']} reads) {row['cycles'] / 1e3:9.1f} kcycles" \
            if row["sm_mhz"] else "  clock n/a"
        xc = f"{row['x_cublas']:5.2f}x cuBLAS" if row["x_cublas"] else "   - cuBLAS"
        print(f"{name:8s} M={m:5d} {lab:9s} {row['us']:9.1f} us [{row['min_us']:.1f}-{row['max_us']:.1f}] "
              f"{row['tops']:7.1f} Top/s {row['peak']:6.1%} {xc}  {mhz}", flush=True)

    def fmt(v):
        return "n/a" if v is None else f"{v:.1f} us"
    peak = "mma_only vs peak n/a"
    if "mma_peak_us_at_clock" in derived:
        peak = (f"mma_only {derived['mma_only_of_peak_at_clock']:.1%} of the MMA at peak at its clock "
                f"({derived['mma_peak_us_at_clock']:.1f} us)")
    print(f"{name:8s} M={m:5d} full's bits equal the path's: {same}; fold {fmt(derived['fold_us'])}, "
          f"planes {fmt(derived['planes_us'])}, quantize {fmt(derived['quantize_us'])}; {peak} "
          f"[{time.time() - t0:.0f}s]", flush=True)
    return rows, derived


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dest", help="JSON file to write (rewritten after each shape)")
    ap.add_argument("--shapes", type=pq2_shape_names, default=None, help="PQ2 shape names (default: all six)")
    ap.add_argument("--m", type=positive_ints, default=[2048], help="token counts, comma-separated")
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--sample-ms", type=positive_float, default=50.0,
                    help="replays of a timed sample last about this long (capped at 1000 replays)")
    ap.add_argument("--clock-ms", type=positive_float, default=2.0,
                    help="SM clock reads this far apart during a sample")
    ap.add_argument("--budget-s", type=positive_float, default=300.0,
                    help="no new shape started once this many seconds have passed")
    args = ap.parse_args()
    low = registry.get("mmq_wgmma").m_min
    if min(args.m) < low:
        ap.error(f"argument --m: mmq_wgmma serves M {low}+, got {min(args.m)}")
    dest = Path(args.dest)
    if dest.is_dir() or not dest.parent.is_dir():
        ap.error(f"argument dest: {args.dest!r} is a folder or in no existing folder; expected a JSON file path")
    if not torch.cuda.is_available():
        ap.error("this tool times kernels on a GPU (sm_90); none is visible")
    if torch.cuda.get_device_capability()[0] != 9:
        ap.error(f"the variant kernel is Hopper's warpgroup MMA (sm_90); this GPU is "
                 f"sm_{''.join(map(str, torch.cuda.get_device_capability()))}")
    shapes = {nm: sh for nm, sh in plan.step_shapes().items() if not sh.dense}
    names = args.shapes or list(shapes)
    layout = registry.get("mmq_wgmma").layouts[-1]
    read, why = nvml_reader()
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(), "clocks_start": clocks(), "clock_read_by": "NVML" if read else why,
           "args": {"m": args.m, "rounds": args.rounds, "sample_ms": args.sample_ms, "clock_ms": args.clock_ms,
                    "copies": COPIES},
           "shapes": {}, "skipped": []}
    print(f"{res['device']}; clocks {res['clocks_start']}; SM clock read by {res['clock_read_by']}", flush=True)
    for i, name in enumerate(names):
        if time.time() - t0 > args.budget_s:
            res["skipped"] = names[i:]
            print(f"budget of {args.budget_s:.0f} s passed: skipping {', '.join(names[i:])}", flush=True)
            break
        sh = shapes[name]
        n, k = sh.n, sh.k
        ws = [inputs.ternary_weight(n, k, seed=c, device="cuda", layout=layout) for c in range(COPIES)]
        ds = [inputs.dense_weight(n, k, seed=c, device="cuda") for c in range(COPIES)]
        with Sampler(read, args.clock_ms / 1e3, why) as smp:
            res["shapes"][name] = {str(m): measure(name, n, k, m, ws, ds, args, smp, t0) for m in args.m}
        del ws, ds
        torch.cuda.empty_cache()
        print(f"{name:8s} done [{time.time() - t0:.0f}s]", flush=True)
        with open(dest, "w") as f:
            json.dump(res, f, indent=1)
    res["clocks_end"] = clocks()
    with open(dest, "w") as f:
        json.dump(res, f, indent=1)
    print("clocks", res["clocks_start"], "->", res["clocks_end"])


if __name__ == "__main__":
    main()
