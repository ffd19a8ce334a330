"""One kernel file at one shape and M, called repeatedly with a forced config: the target of an
ncu run (tuning aid, not a gate). The weight is the step's random ternary weight of that shape,
prepared; the activations are seeded.

    ncu --kernel-name regex:_wgmma_kernel --launch-skip 5 --launch-count 1 --section SchedulerStats \
        --section WarpStateStats python tools/profile/decode_kernel.py mmq_wgmma lm_head 16 '{"BM": 32}'

mmq_wgmma takes BM 32-128 here (tools/tune/step_ab.py: its rule allows the prefill tiles only).
"""
import argparse
import importlib
import json
import runpy
from pathlib import Path

import torch

from pq2verify import inputs
from pq2verify.bench import plan
from pq2verify.cli import positive_int

# the Ms each kernel file can run at decode (gemv: one row; the others: up to the decode 16)
MS = {"gemv": (1, 1), "small_mma": (1, 16), "mmq_wgmma": (1, 16)}


def _object(text: str) -> dict:
    try:
        v = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON: {e}") from None
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object of config fields, got {text!r}")
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path", choices=sorted(MS))
    ap.add_argument("shape", help="a PQ2 shape of the decode step, e.g. lm_head")
    ap.add_argument("m", type=positive_int)
    ap.add_argument("config", nargs="?", default="{}", type=_object, help="config fields over the chooser's")
    ap.add_argument("--calls", type=positive_int, default=10)
    args = ap.parse_args()
    lo, hi = MS[args.path]
    if not lo <= args.m <= hi:
        ap.error(f"argument m: {args.path} runs M {lo}-{hi} here, got {args.m}")
    shapes = {nm: sh for nm, sh in plan.step_shapes().items() if not sh.dense}
    if args.shape not in shapes:
        ap.error(f"argument shape: expected one of {', '.join(shapes)}, got {args.shape!r}")
    sh = shapes[args.shape]
    mod = importlib.import_module(f"kernels.{args.path}")
    tool = runpy.run_path(str(Path(__file__).resolve().parents[1] / "tune" / "step_ab.py"))
    with tool["narrow_token_tiles"]():
        cfg = {**mod.config(sh.n, sh.k, args.m, interpret=False), **args.config}
        try:    # the kernel's own config rule, before any GPU work
            mod.fold(sh.n, sh.k, args.m, interpret=False, config=cfg)
        except ValueError as e:
            ap.error(f"argument config: {e}")
        w = inputs.ternary_weight(sh.n, sh.k, seed=1, device="cuda")
        x = inputs.activations(args.m, sh.k, seed=1, device="cuda")
        out = torch.empty(args.m, sh.n, dtype=x.dtype, device="cuda")
        for _ in range(args.calls):
            mod.run(x, w, out=out, check=False, config=cfg)
    torch.cuda.synchronize()
    print(f"{args.path} {args.shape} {sh.n}x{sh.k} M={args.m} config {cfg}: {args.calls} calls")


if __name__ == "__main__":
    main()
