"""Steady-state clock and power per kernel: each variant replays a graph of calls for ~SECS s while
nvidia-smi samples every 50 ms; the mean SM clock, power and throttle reasons inside the window."""
import datetime, json, statistics, subprocess, sys, time, importlib
import torch
from kernels import cublas
from pq2verify import inputs
from pq2verify.bench import plan
from pq2verify.bench.sweep import capture, replay_s

SECS = float(sys.argv[3]) if len(sys.argv) > 3 else 1.5
variants = json.loads(sys.argv[2])
mods = {lab: importlib.import_module("kernels." + v.pop("MOD")) for lab, v in variants.items() if "MOD" in v}
q = "timestamp,clocks.sm,power.draw,clocks_event_reasons.active,temperature.gpu"
smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits", "-lms", "50"],
                       stdout=subprocess.PIPE, text=True)
windows = []
shapes = {nm: sh for nm, sh in plan.step_shapes().items() if not sh.dense}
for name in sys.argv[1].split(","):
    sh = shapes[name]
    n, k, m = sh.n, sh.k, 2048
    ws = [inputs.ternary_weight(n, k, seed=i, device="cuda") for i in range(2)]
    ds = [inputs.dense_weight(n, k, seed=i, device="cuda") for i in range(2)]
    x = inputs.activations(m, k, seed=1, device="cuda")
    outs = [torch.empty(m, n, dtype=x.dtype, device="cuda") for _ in ws]
    for rnd in range(2):
        for lab, v in list(variants.items()) + [("cublas", None)]:
            if lab == "cublas":
                th = [lambda w=w, o=o: cublas.run(x, w, out=o, check=False) for w, o in zip(ds, outs)]
            else:
                f = mods[lab].run
                th = [lambda w=w, o=o, f=f, v=v: f(x, w, out=o, check=False, config=v or None) for w, o in zip(ws, outs)]
            g = capture(th * 5)
            per = replay_s(g, 3) / 10
            reps = max(1, int(SECS / (per * 10)))
            torch.cuda.synchronize()
            t0 = datetime.datetime.now()
            c0 = time.perf_counter()
            for _ in range(reps):
                g.graph.replay()
            torch.cuda.synchronize()
            el = (time.perf_counter() - c0) / (reps * 10)
            t1 = datetime.datetime.now()
            g.close()
            windows.append((name, rnd, lab, t0, t1, el))
            time.sleep(0.3)
    del ws, ds, outs
    torch.cuda.empty_cache()
time.sleep(0.2)
smi.terminate()
rows = []
for line in smi.stdout.read().splitlines():
    p = [s.strip() for s in line.split(",")]
    try:
        rows.append((datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f"), float(p[1]), float(p[2]), p[3], p[4]))
    except (ValueError, IndexError):
        print("smi:", line)
print(f"{'shape':8s} rnd {'variant':8s} {'us/call':>9s} {'SM MHz':>7s} {'W':>6s} {'mJ/call':>8s} {'Mcyc/call':>9s} samples reasons")
for name, rnd, lab, t0, t1, el in windows:
    # skip the first 0.2 s of the window (ramp), keep the rest
    s = [r for r in rows if t0 + datetime.timedelta(seconds=0.2) <= r[0] <= t1]
    if not s:
        print(name, rnd, lab, f"{el*1e6:9.1f}", "no samples"); continue
    mhz = statistics.mean(r[1] for r in s); w = statistics.mean(r[2] for r in s)
    reasons = sorted({r[3] for r in s})
    print(f"{name:8s} {rnd:3d} {lab:8s} {el*1e6:9.1f} {mhz:7.0f} {w:6.1f} {w*el*1e3:8.2f} {el*mhz*1e6/1e6:9.3f} {len(s):4d} {','.join(reasons)}")
