"""Where gemv's M = 1 call time goes (a measurement aid, not a gate): per shape, on rotated
weight copies as CUDA graphs in alternating rounds, in one process:

- gemv: the path as the step calls it, the quantize kernel then the GEMV kernel (PDL-chained);
- gemv_kernel: the GEMV kernel alone, PDL-chained to itself, on activations quantized once
  before the capture (its split-K counters zeroed once: the kernel puts them back to 0);
- quantize: the quantize kernel alone, PDL-chained to itself;
- the bench's speed-of-light reads of the same bytes: plain, PDL with one chunk before the wait,
  and PDL with every chunk before it (pq2verify.bench.sol).

gemv - gemv_kernel is what the quantize kernel and its boundary cost a call; gemv_kernel - the
PDL read is the GEMV kernel's own start, body and end beyond a pure read of its bytes. With
--stages, the GEMV kernel's work switched on stage by stage (tools/profile/gemv_stages.py) is
timed beside them, so each stage's share of that difference shows.

    python tools/profile/decode_boundary.py $OUT/boundary.json --shapes gate_up,down,out [--stages]
"""
import argparse
import json
import runpy
import sys
import time
from pathlib import Path

import torch

from kernels import gemv, prepare
from pq2verify import inputs
from pq2verify.bench import plan
from pq2verify.bench.contestants import weight_bytes
from pq2verify.bench.sol import ITERS, read_call
from pq2verify.bench.sweep import capture, clocks, pq2_shape_names, rotated_weights, stream_bw
from pq2verify.cli import positive_int

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gemv_stages  # noqa: E402  (beside this script, which may run through runpy)

# step_ab's alternating rounds and their summary (a script beside this one, not a package)
_AB = runpy.run_path(str(Path(__file__).resolve().parents[1] / "tune" / "step_ab.py"))
alternate, summary = _AB["alternate"], _AB["summary"]


def thunks(x, ws, outs, stages=False):
    """{label: [thunk per weight copy]} of the parts to time (module docstring), and the split-K
    counters."""
    n, k = ws[0].n, ws[0].k
    cfg = gemv.config(n, k, 1)
    split = cfg["SPLIT"]
    tiles = -(-n // cfg["BN"])
    count = torch.zeros(tiles, dtype=torch.int32, device=x.device) if split > 1 else None
    q, xs, t = prepare.quantize_q8(x, order="plane", pdl=True, zero=count)
    torch.cuda.synchronize()
    out = {
        "gemv": [lambda w=w, o=o: gemv.run(x, w, out=o, check=False) for w, o in zip(ws, outs)],
        "gemv_kernel": [lambda w=w, o=o: gemv.launch(q, xs, t, w, o, cfg, pdl=True, count=count)
                        for w, o in zip(ws, outs)],
        "quantize": [lambda: prepare.quantize_q8(x, order="plane", pdl=True) for _ in ws],
        "SOL read": [read_call(weight_bytes(w), False)[0] for w in ws],
        "SOL read+PDL": [read_call(weight_bytes(w), True)[0] for w in ws],
        "SOL read+PDL, all before wait": [read_call(weight_bytes(w), True, ITERS)[0] for w in ws],
    }
    if stages:
        part = torch.empty(split * n, dtype=torch.float32, device=x.device)
        for st in gemv_stages.STAGES:
            out["stage " + st] = [lambda w=w, o=o, st=st: gemv_stages.launch(st, q, xs, t, w, o, cfg, pdl=True,
                                                                             count=count, part=part)
                                  for w, o in zip(ws, outs)]
    return out, count


def occupancies(parts: dict, num_warps: int) -> dict:
    """{stage: registers, spills, programs an SM} of each gemv_stages kernel, from one call of its
    first thunk (a stage's time is its work at its own occupancy: gemv_stages.py's docstring)."""
    from pq2verify.sm90 import resources
    fit = {}
    for st in gemv_stages.STAGES:
        k = parts["stage " + st][0]()      # the thunk returns the launched kernel
        fit[st] = {"registers": k.n_regs, "spills": k.n_spills,
                   "programs_per_sm": resources.occupancy(k.n_regs, k.metadata.shared, num_warps)[0]}
    torch.cuda.synchronize()
    return fit


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dest")
    ap.add_argument("--shapes", type=pq2_shape_names, required=True)
    ap.add_argument("--rounds", type=positive_int, default=5)
    ap.add_argument("--reps", type=positive_int, default=10)
    ap.add_argument("--stages", action="store_true", help="also time gemv_stages.py's stages")
    args = ap.parse_args()
    dest = Path(args.dest)
    if dest.is_dir() or not dest.parent.is_dir():
        ap.error(f"argument dest: {args.dest!r} is a folder or in no existing folder; expected a JSON file path")
    if not torch.cuda.is_available():
        ap.error("this tool times kernels on a GPU; none is visible")
    shapes = {nm: sh for nm, sh in plan.step_shapes().items() if not sh.dense}
    t0 = time.time()
    bw = stream_bw()
    res = {"bw": bw, "clocks_start": clocks(), "shapes": {}}
    print(f"streaming read {bw / 1e12:.3f} TB/s; clocks {res['clocks_start']}", flush=True)
    for name in args.shapes:
        sh = shapes[name]
        ws, nbytes = rotated_weights(sh.n, sh.k)
        x = inputs.activations(1, sh.k, seed=1, device="cuda")
        outs = [torch.empty(1, sh.n, dtype=x.dtype, device="cuda") for _ in ws]
        parts, count = thunks(x, ws, outs, args.stages)
        graphs = {lab: capture(th) for lab, th in parts.items()}
        s = summary(alternate(graphs, args.rounds, args.reps, len(ws)))
        # the GEMV kernel alone on the same activations must give the path's bits
        gemv.run(x, ws[0], out=outs[0], check=False)
        ref = outs[0].clone()
        outs[0].fill_(float("nan"))     # so a replay that writes nothing cannot pass
        graphs["gemv_kernel"].graph.replay()
        torch.cuda.synchronize()
        same = bool(torch.equal(outs[0].view(torch.int16), ref.view(torch.int16)))
        # the stages that must give gemv's bits: full, and fold where the shape has one split
        stage_bits, stage_fit = {}, {}
        if args.stages:
            stage_fit = occupancies(parts, gemv.config(sh.n, sh.k, 1)["num_warps"])
            for st in ("fold", "full") if gemv.config(sh.n, sh.k, 1)["SPLIT"] == 1 else ("full",):
                outs[0].fill_(float("nan"))
                graphs["stage " + st].graph.replay()
                torch.cuda.synchronize()
                stage_bits[st] = bool(torch.equal(outs[0].view(torch.int16), ref.view(torch.int16)))
        floor = nbytes / bw
        for lab, row in s.items():
            row["floor_frac"] = floor / row["median_s"]
            print(f"{name:8s} {lab:30s} {row['median_s'] * 1e6:8.3f} us [{row['min_s'] * 1e6:.3f}-"
                  f"{row['max_s'] * 1e6:.3f}]  {row['floor_frac']:6.1%} of floor ({floor * 1e6:.3f} us)", flush=True)
        print(f"{name:8s} gemv_kernel's bits equal gemv's: {same}; "
              f"quantize + boundary a call: {(s['gemv']['median_s'] - s['gemv_kernel']['median_s']) * 1e6:.3f} us; "
              f"GEMV kernel beyond the PDL read: "
              f"{(s['gemv_kernel']['median_s'] - s['SOL read+PDL']['median_s']) * 1e6:.3f} us "
              f"[{time.time() - t0:.0f}s]", flush=True)
        if args.stages:
            prev = s["SOL read+PDL"]["median_s"]
            steps = []
            for st in gemv_stages.STAGES:
                cur = s["stage " + st]["median_s"]
                steps.append(f"{st} {(cur - prev) * 1e6:+.3f}")
                prev = cur
            print(f"{name:8s} stages, us a call each adds (read: over the PDL read): {'; '.join(steps)}; "
                  f"bits equal gemv's: {stage_bits}", flush=True)
            print(f"{name:8s} stages' registers, spills and programs an SM: "
                  + "; ".join(f"{st} {v['registers']}r {v['spills']}s {v['programs_per_sm']}/SM" for st, v in stage_fit.items()),
                  flush=True)
        res["shapes"][name] = {"rows": s, "bits_equal": same, "stage_bits_equal": stage_bits, "stage_occupancy": stage_fit, "floor_s": floor, "config": gemv.config(sh.n, sh.k, 1)}
        with open(args.dest, "w") as f:
            json.dump(res, f, indent=1)
        del graphs, parts, ws, outs, count
        torch.cuda.empty_cache()
    res["clocks_end"] = clocks()
    with open(args.dest, "w") as f:
        json.dump(res, f, indent=1)
    print("clocks", res["clocks_start"], "->", res["clocks_end"])


if __name__ == "__main__":
    main()
