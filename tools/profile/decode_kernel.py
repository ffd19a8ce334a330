"""One kernel file at one shape and M, called repeatedly with a forced config: the target of an
ncu run (tuning aid, not a gate). The weight is the step's random ternary weight of that shape,
prepared; the activations are seeded.

    ncu --kernel-name regex:_wgmma_kernel --launch-skip 5 --launch-count 1 --section SchedulerStats \
        --section WarpStateStats python tools/profile/decode_kernel.py mmq_wgmma lm_head 16 '{"BM": 32}'

mmq_wgmma takes BM 32-128 here (tools/tune/step_ab.py: its rule allows the prefill tiles only).
"""
import argparse
import json

import torch

from pq2verify import inputs
from pq2verify.bench import plan


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path", choices=("gemv", "small_mma", "mmq_wgmma"))
    ap.add_argument("shape", help="a PQ2 shape of the decode step, e.g. lm_head")
    ap.add_argument("m", type=int)
    ap.add_argument("config", nargs="?", default="{}", type=json.loads)
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args()
    import importlib
    import runpy
    from pathlib import Path
    mod = importlib.import_module(f"kernels.{args.path}")
    tool = runpy.run_path(str(Path(__file__).resolve().parents[1] / "tune" / "step_ab.py"))
    shapes = {nm: sh for nm, sh in plan.step_shapes().items() if not sh.dense}
    if args.shape not in shapes:
        ap.error(f"argument shape: expected one of {', '.join(shapes)}, got {args.shape!r}")
    sh = shapes[args.shape]
    w = inputs.ternary_weight(sh.n, sh.k, seed=1, device="cuda")
    x = inputs.activations(args.m, sh.k, seed=1, device="cuda")
    out = torch.empty(args.m, sh.n, dtype=x.dtype, device="cuda")
    with tool["narrow_token_tiles"]():
        cfg = {**mod.config(sh.n, sh.k, args.m, interpret=False), **args.config}
        for _ in range(args.calls):
            mod.run(x, w, out=out, check=False, config=cfg)
    torch.cuda.synchronize()
    print(f"{args.path} {args.shape} {sh.n}x{sh.k} M={args.m} config {cfg}: {args.calls} calls")


if __name__ == "__main__":
    main()
