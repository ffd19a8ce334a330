"""mmq_ws on the GPU: bits against mmq_wgmma and mmq, then paired graph timings at M = 2048."""
import json, statistics, sys, time
import torch
from kernels import cublas, mmq, mmq_wgmma, mmq_ws
from pq2verify import inputs
from pq2verify.bench import plan
from pq2verify.bench.sweep import clocks, graph_time

stage = sys.argv[1]
variants = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {"nc3": {}}
import importlib
MODS = {lab: importlib.import_module("kernels." + v.pop("MOD", "mmq_ws")) for lab, v in variants.items()}
print("clocks", clocks(), flush=True)
if stage == "bits":
    bad = 0
    cases = [(64, 256, 17), (5 * 192 + 50, 1024, 300), (5120, 6144, 2048), (1000, 512, 129), (192, 17408, 64)]
    for n, k, m in cases:
        w = inputs.ternary_weight(n, k, seed=n + k, device="cuda")
        for dt in (torch.bfloat16, torch.float16):
            x = inputs.activations(m, k, seed=m, dtype=dt, device="cuda")
            ref = mmq_wgmma.run(x, w, check=False)
            ref2 = mmq.run(x, w, check=False)
            for lab, v in variants.items():
                y = torch.full_like(ref, float("nan"))
                MODS[lab].run(x, w, out=y, check=False, config=v or None)
                torch.cuda.synchronize()
                eq, eq2 = torch.equal(y, ref), torch.equal(y, ref2)
                y2 = torch.full_like(ref, float("nan"))
                MODS[lab].run(x, w, out=y2, check=False, config=v or None)
                rerun = torch.equal(y, y2)
                bad += not (eq and eq2 and rerun)
                print(f"bits n={n} k={k} m={m} {dt} {lab}: =wgmma {eq} =mmq {eq2} rerun {rerun} "
                      f"nan {int(torch.isnan(y.float()).sum())}", flush=True)
    for n, k, m in [(5 * 192 + 50, 1024, 300), (64, 256, 17)]:
        w = inputs.ternary_weight(n, k, seed=3, device="cuda")
        x = inputs.activations(m, k, seed=4, device="cuda")
        d0 = torch.zeros(m, n, k // 128, dtype=torch.int32, device="cuda")
        d1 = torch.full_like(d0, -7)
        mmq_wgmma.run(x, w, dots=d0, check=False)
        mmq_ws.run(x, w, dots=d1, check=False)
        ok = torch.equal(d0, d1)
        bad += not ok
        print(f"dots n={n} k={k} m={m}: =wgmma {ok}", flush=True)
    print("BITS", "OK" if bad == 0 else f"{bad} BAD", flush=True)
else:
    ms = [int(v) for v in stage.split(",")]
    shapes = {nm: sh for nm, sh in plan.step_shapes().items() if not sh.dense}
    names = sys.argv[3].split(",") if len(sys.argv) > 3 else list(shapes)
    for name in names:
        sh = shapes[name]
        n, k = sh.n, sh.k
        ws = [inputs.ternary_weight(n, k, seed=i, device="cuda") for i in range(2)]
        ds = [inputs.dense_weight(n, k, seed=i, device="cuda") for i in range(2)]
        for m in ms:
            x = inputs.activations(m, k, seed=1, device="cuda")
            outs = [torch.empty(m, n, dtype=x.dtype, device="cuda") for _ in ws]
            conts = {"wgmma": (ws, lambda w, o: (lambda: mmq_wgmma.run(x, w, out=o, check=False)))}
            for lab, v in variants.items():
                conts[lab] = (ws, lambda w, o, v=v, f=MODS[lab].run: (lambda: f(x, w, out=o, check=False, config=v or None)))
            conts["cublas"] = (ds, lambda w, o: (lambda: cublas.run(x, w, out=o, check=False)))
            ref = mmq_wgmma.run(x, ws[0], check=False).clone()
            eq = {}
            for lab in variants:
                outs[0].fill_(float("nan"))
                conts[lab][1](ws[0], outs[0])()
                eq[lab] = bool(torch.equal(outs[0], ref))
            times = {lab: [] for lab in conts}
            for r in range(3):
                for lab, (wl, make) in conts.items():
                    times[lab].append(graph_time([make(w, o) for w, o in zip(wl, outs)], reps=3, samples=3) / 2)
            med = {lab: statistics.median(t) * 1e6 for lab, t in times.items()}
            line = " ".join(f"{lab} {med[lab]:8.1f}us ({med['cublas'] / med[lab]:.2f}x cuBLAS)" for lab in conts)
            print(f"{name:8s} M={m:5d} {line}  bits=wgmma {eq}", flush=True)
            del outs
        del ws, ds
        torch.cuda.empty_cache()
    print("clocks", clocks(), flush=True)
