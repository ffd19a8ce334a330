"""Scratch: gemv at M=1 with the quantize kernel's programs resized (BU units a program, warps)."""
import runpy, sys, time, torch
from pathlib import Path
from kernels import gemv, prepare
from pq2verify import inputs
from pq2verify.bench import plan
from pq2verify.bench.sweep import capture, rotated_weights, stream_bw
ab = runpy.run_path("tools/tune/step_ab.py")
alternate, summary = ab["alternate"], ab["summary"]
orig = prepare._quantize_config
VARS = {"chooser": None, "bu1w1": (1, 1), "bu2w1": (2, 1), "bu1w4": (1, 4), "bu4w4": (4, 4), "bu16w4": (16, 4)}
def wrap(fn, v):
    def th():
        if v is not None:
            prepare._quantize_config = lambda units: (min(v[0], triton_next(units)), v[1])
        try:
            fn()
        finally:
            prepare._quantize_config = orig
    return th
def triton_next(u):
    p = 1
    while p < u: p *= 2
    return p
bw = stream_bw()
shapes = {nm: sh for nm, sh in plan.step_shapes().items() if not sh.dense}
for name in sys.argv[1].split(","):
    sh = shapes[name]
    ws, nbytes = rotated_weights(sh.n, sh.k)
    x = inputs.activations(1, sh.k, seed=1, device="cuda")
    graphs, outs, keep = {}, {}, []
    for lab, v in VARS.items():
        o = [torch.empty(1, sh.n, dtype=x.dtype, device="cuda") for _ in ws]
        keep.append(o)
        graphs[lab] = capture([wrap(lambda w=w, oo=oo: gemv.run(x, w, out=oo, check=False), v) for w, oo in zip(ws, o)])
        outs[lab] = o[0]
    s = summary(alternate(graphs, 5, 10, len(ws)))
    for lab, r in s.items():
        eq = torch.equal(outs[lab].view(torch.int16), outs["chooser"].view(torch.int16))
        print(f"{name:8s} {lab:8s} {r['median_s']*1e6:8.3f} us [{r['min_s']*1e6:.3f}-{r['max_s']*1e6:.3f}] x{r['speedup_vs_first']:.3f} "
              f"[{r['speedup_range'][0]:.3f}-{r['speedup_range'][1]:.3f}] {nbytes/bw/r['median_s']:.1%} of floor bits=chooser:{eq}", flush=True)
    del graphs, outs, keep, ws
    torch.cuda.empty_cache()
