"""Config A/B of the tuned decode paths on a GPU (tuning, not a gate: the bench measures what is
chosen). Variants are config fields forced over the chooser's (gemv at M = 1, small_mma at
M = 2..16), timed in one process, in alternating rounds, as CUDA graphs:

- the chained step: the 257 PQ2 projections in model order, each on its own weight, each
  reading the previous one's output (quantize kernels included);
- per shape (with --shapes): calls on rotated weight copies; with --sol beside the bench's
  speed-of-light reads of the same bytes (pq2verify.bench.sol, plain and PDL), so each shape's
  gap to a pure read with the same launch structure is measured in the same rounds.

Each variant's outputs are compared with the first variant's bit for bit (a variant that only
changes scheduling, e.g. num_stages, must give the same bits), and each row lists the variants
whose bits it equals. Ratios are per round, against the first variant: median [min-max].
Writes JSON as it goes.

Tool fields (no kernel's): "SPLIT1": true runs every shape unsplit; "PATH": "mmq_wgmma" times
that kernel at decode M instead of the chooser's path (the structure issue 27 asks about:
weights on the MMA's M side, tokens on its N side). Its rule allows token tiles BM of 64-128
(the prefill tiles it serves); here BM may be 32-128, in this process only, so a narrower token
tile can be timed before the path is changed. Warpgroup MMA takes N down to 8, but BM 8 and 16
stopped the first launch with a misaligned address on the H200
(results/2026-12-02-decode-wgmma-structure/), so they are refused.

    python tools/tune/step_ab.py $OUT/ab.json --m 1,2,16 --shapes gate_up,out --sol \
        --variants '{"chooser": {}, "stages4": {"num_stages": 4}}'
"""
import argparse
import contextlib
import json
import statistics
import time

import torch

from kernels import config as tiles
from kernels import gemv, gemv_pair, mmq_wgmma, small_mma
from pq2verify import inputs
from pq2verify.bench import plan
from pq2verify.bench.contestants import scaled_clone, weight_bytes
from pq2verify.bench.sol import read_call
from pq2verify.bench.step import exponents, gain_log2
from pq2verify.bench.sweep import capture, clocks, pq2_shape_names, replay_s, rotated_weights, stream_bw
from pq2verify.cli import positive_int, positive_ints


def path_of(m):
    return gemv if m == 1 else small_mma


PATHS = {"gemv": gemv, "gemv_pair": gemv_pair, "small_mma": small_mma, "mmq_wgmma": mmq_wgmma}
# kernels that compute only the rows of their table's M range (gemv one, gemv_pair two): a PATH
# of one of them at another M would time a wrong call, so it is refused before any work
TABLE_MS_ONLY = {"gemv": 1, "gemv_pair": 2}


def module_of(m, fields: dict):
    """The kernel module a variant times at M: its PATH, else the chooser's decode path."""
    return PATHS[fields["PATH"]] if "PATH" in fields else path_of(m)


@contextlib.contextmanager
def narrow_token_tiles():
    """mmq_wgmma's BM rule widened to 32-128 while the tool runs (module docstring)."""
    rule = mmq_wgmma.FIELDS
    mmq_wgmma.FIELDS = {**rule, "BM": tiles.pow2(32, 128)}
    try:
        yield
    finally:
        mmq_wgmma.FIELDS = rule


def variants_arg(text: str) -> dict:
    """argparse type: a JSON object {label: {field: value}}, at least one label."""
    try:
        v = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(v, dict) or not v or not all(isinstance(f, dict) for f in v.values()):
        raise argparse.ArgumentTypeError(f"expected {{label: {{field: value}}}}, got {text!r}")
    return v


def variant_config(n, k, m, fields: dict) -> dict:
    """The chooser's config at (N, K, M) with a variant's fields over it. "SPLIT1": true (this
    tool's field, not a kernel's) runs every shape unsplit."""
    mod = module_of(m, fields)
    fields = dict(fields)
    fields.pop("PATH", None)
    unsplit = fields.pop("SPLIT1", False)
    cfg = {**mod.config(n, k, m, interpret=False), **fields}
    if unsplit:
        cfg.update(SPLIT=1, groups_per_split=k // 128)
    return cfg


def variant_errors(variants: dict, ms: list, shapes=((5120, 5120),)) -> list:
    """Why a variant cannot run: a field unknown to the path of some M, or out of its rule on
    one of the (N, K) shapes it will time (each kernel's config protocol checks it)."""
    bad = []
    for lab, fields in variants.items():
        if type(fields.get("SPLIT1", False)) is not bool:
            bad.append(f"variant {lab!r}: SPLIT1={fields['SPLIT1']!r}: expected true or false")
            continue
        if "PATH" in fields and fields["PATH"] not in PATHS:
            bad.append(f"variant {lab!r}: PATH={fields['PATH']!r}: expected one of {', '.join(sorted(PATHS))}")
            continue
        if fields.get("SPLIT1") and module_of(1, fields) is mmq_wgmma:
            bad.append(f"variant {lab!r}: SPLIT1 with PATH mmq_wgmma: it never splits")
            continue
        only = TABLE_MS_ONLY.get(fields.get("PATH"))
        if only is not None and any(m != only for m in ms):
            bad.append(f"variant {lab!r}: PATH={fields['PATH']!r} computes M={only} only, got --m {','.join(map(str, ms))}")
            continue
        for m in ms:
            for n, k in shapes:   # the first shape that refuses it
                try:
                    module_of(m, fields).fold(n, k, m, interpret=False, config=variant_config(n, k, m, fields))
                except ValueError as e:
                    bad.append(f"variant {lab!r} at M={m}: {e} (at N={n} K={k})")
                    break
    return bad


def call(x, w, out, m, fields):
    mod = module_of(m, fields)
    cfg = variant_config(w.n, w.k, m, fields)
    return lambda: mod.run(x, w, out=out, check=False, config=cfg)


def alternate(graphs: dict, rounds: int, reps: int, per: int = 1) -> dict:
    """{label: [seconds per pass]} over rounds, labels alternating inside each round; a pass
    is `per` calls (seconds are divided by it)."""
    out = {lab: [] for lab in graphs}
    for _ in range(rounds):
        for lab, g in graphs.items():
            out[lab].append(replay_s(g, reps) / per)
    return out


def summary(times: dict) -> dict:
    first = next(iter(times))
    res = {}
    for lab, ts in times.items():
        ratios = [a / b for a, b in zip(times[first], ts)]
        res[lab] = {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts),
                    "speedup_vs_first": statistics.median(ratios), "speedup_range": [min(ratios), max(ratios)]}
    return res


def line(what, lab, s, unit, scale, extra=""):
    return (f"{what:22s} {lab:12s} {s['median_s'] * scale:9.3f} {unit} [{s['min_s'] * scale:.3f}-{s['max_s'] * scale:.3f}]"
            f"  x{s['speedup_vs_first']:.3f} [{s['speedup_range'][0]:.3f}-{s['speedup_range'][1]:.3f}] {extra}")


def report(s: dict, outs: dict, first: str, nbytes: int, bw: float, what: str, unit: str, scale: float, t0: float):
    """Adds to each row of summary s its bits against the first variant's output (None for a
    row without one, e.g. a speed-of-light read), GB/s and fraction of the floor; prints it."""
    for lab in s:
        s[lab]["bits_equal_first"] = (bool(torch.equal(outs[lab].view(torch.int16), outs[first].view(torch.int16)))
                                      if lab in outs else None)
        s[lab]["bits_equal"] = ([o for o in outs if o != lab and torch.equal(outs[lab].view(torch.int16),
                                                                             outs[o].view(torch.int16))]
                                if lab in outs else None)
        s[lab]["gbs"] = nbytes / s[lab]["median_s"] / 1e9
        s[lab]["floor_frac"] = nbytes / s[lab]["median_s"] / bw
        print(line(what, lab, s[lab], unit, scale,
                   f"{s[lab]['gbs']:6.0f} GB/s {s[lab]['floor_frac']:6.1%} of floor (floor {nbytes / bw * scale:.3f} {unit}) "
                   f"=first {s[lab]['bits_equal_first']} ={','.join(s[lab]['bits_equal'] or ()) or '-'} "
                   f"[{time.time() - t0:.0f}s]"), flush=True)


def time_shape(name, sh, ms, makers: dict, *, rounds: int, reps: int, sol: bool, bw: float, t0: float) -> dict:
    """One shape alone, per M: each maker's calls (maker(x, w, out, m) -> thunk; the first is
    the baseline of the ratios and the bits) on rotated weight copies as one CUDA graph, in
    alternating rounds; with sol, the bench's speed-of-light reads of the same bytes (plain,
    PDL) beside them. {"<name> M=<m>": summary rows} (printed as they come)."""
    ws, nbytes = rotated_weights(sh.n, sh.k)
    res = {}
    for m in ms:
        x = inputs.activations(m, sh.k, seed=1, device="cuda")
        graphs, outs, keep = {}, {}, []
        for lab, make in makers.items():
            o = [torch.empty(m, sh.n, dtype=x.dtype, device="cuda") for _ in ws]
            keep.append(o)      # a graph writes these on every replay: alive while it is
            try:
                graphs[lab] = capture([make(x, w, oo, m) for w, oo in zip(ws, o)])
            except Exception as e:   # a variant that cannot run is reported; the others are timed
                print(f"{name} M={m} {lab}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                res[f"{name} M={m} {lab} failed"] = f"{type(e).__name__}: {e}"
                continue
            outs[lab] = o[0]
        if not outs:
            continue
        if sol:
            for lab, pdl in (("SOL read", False), ("SOL read+PDL", True)):
                graphs[lab] = capture([read_call(weight_bytes(w), pdl)[0] for w in ws])
        s = summary(alternate(graphs, rounds, reps, len(ws)))
        report(s, outs, next(iter(outs)), nbytes, bw, f"{name} M={m}", "us", 1e6, t0)
        res[f"{name} M={m}"] = s
        del graphs, outs, keep
    del ws
    torch.cuda.empty_cache()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dest", nargs="?", default="step_ab.json")
    ap.add_argument("--m", type=positive_ints, default=[1, 2, 16], help="Ms (1: gemv; 2-16: small_mma)")
    ap.add_argument("--variants", type=variants_arg, required=True,
                    help='JSON {label: {field: value}} over the chooser\'s config; the first is the baseline')
    ap.add_argument("--shapes", type=pq2_shape_names, default=None, help="also time these shapes alone")
    ap.add_argument("--rounds", type=positive_int, default=7)
    ap.add_argument("--no-step", action="store_true", help="only the per-shape timings")
    ap.add_argument("--reps", type=positive_int, default=10, help="graph replays per sample of a shape")
    ap.add_argument("--sol", action="store_true",
                    help="per shape, also the bench's speed-of-light reads of the same bytes (plain and PDL)")
    args = ap.parse_args()
    with narrow_token_tiles():
        run(ap, args)


def run(ap, args):
    if any(m > 16 for m in args.m):
        ap.error(f"argument --m: decode Ms are 1-16, got {args.m}")
    if args.no_step and not args.shapes:
        ap.error("argument --no-step: without --shapes nothing would be timed")
    shapes = {nm: sh for nm, sh in plan.step_shapes().items() if not sh.dense}
    timed = [(shapes[nm].n, shapes[nm].k) for nm in (args.shapes or [])]
    if not args.no_step:
        timed += sorted({(sh.n, sh.k) for sh in shapes.values()})
    bad = variant_errors(args.variants, args.m, timed or [(5120, 5120)])
    if bad:
        ap.error("argument --variants: " + "; ".join(bad))
    t0 = time.time()
    bw = stream_bw()
    res = {"bw": bw, "clocks_start": clocks(), "variants": args.variants, "step": {}, "shapes": {}}

    def save():
        with open(args.dest, "w") as f:
            json.dump(res, f, indent=1)
    makers = {lab: (lambda x, w, o, m, fields=fields: call(x, w, o, m, fields)) for lab, fields in args.variants.items()}
    for name in args.shapes or []:
        res["shapes"].update(time_shape(name, shapes[name], args.m, makers, rounds=args.rounds, reps=args.reps,
                                        sol=args.sol, bw=bw, t0=t0))
        save()
    if args.no_step:
        return
    order = plan.step_order()
    # each weight scaled by 2^e (fp16 scales, exact) so the chained values stay near unit RMS,
    # with the bench's rule (pq2verify.bench.step.exponents): no inf or NaN along 257 projections
    step_w = [inputs.ternary_weight(shapes[nm].n, shapes[nm].k, seed=1000 + i, device="cuda")
              for i, nm in enumerate(order)]
    gains = {nm: gain_log2(step_w[order.index(nm)]) for nm in set(order)}
    exps, _ = exponents([(nm, i - 1) for i, nm in enumerate(order)], gains)
    step_w = [scaled_clone(w, e) for w, e in zip(step_w, exps)]
    total = sum(w.nbytes for w in step_w)
    res["step_bytes"] = total
    for m in args.m:
        graphs, last, keep = {}, {}, []
        for lab, fields in args.variants.items():
            th, prev = [], inputs.activations(m, 5120, seed=7, device="cuda")
            for w in step_w:
                o = torch.empty(m, w.n, dtype=torch.bfloat16, device="cuda")
                th.append(call(prev.reshape(-1)[:m * w.k].view(m, w.k), w, o, m, fields))
                prev = o
            keep.append(th)     # the thunks hold the graph's inputs and outputs alive
            try:
                graphs[lab] = capture(th)
            except Exception as e:
                print(f"step M={m} {lab}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                res.setdefault("failed", {})[f"step M={m} {lab}"] = f"{type(e).__name__}: {e}"
                continue
            last[lab] = prev
        if not last:
            continue
        first = next(iter(last))
        s = summary(alternate(graphs, args.rounds, 5))
        for lab in s:
            s[lab]["last_rms"] = float(last[lab].float().pow(2).mean().sqrt())
        report(s, last, first, total, bw, f"step M={m}", "ms", 1e3, t0)
        res["step"][f"M={m}"] = s
        save()
        del graphs, last, keep
    res["clocks_end"] = clocks()
    save()
    print("clocks", res["clocks_start"], "->", res["clocks_end"])


if __name__ == "__main__":
    main()
