"""Steady-state cost of one decode forward of the GSM8K default model's architecture
(SmolLM2-135M: 30 layers, hidden 576, 120 PQ2 calls per forward), random weights, per kernel
set and M, against the same model with BF16 nn.Linear; and the cost of the PQ2 calls alone.
No checkpoint needed (the GPU machine cannot download one). Tuning aid, not a gate.

    python tools/profile/forward_cost.py [--device cuda] [--steps 20] [--m 16,8,4,2,1] [--graphs] [--profile]

--graphs adds each kernel set's forward with its decode calls replayed from CUDA graphs
(pq2verify/gsm8k/graphs.py, what `gsm8k` does on CUDA).
"""
import argparse
import cProfile
import os
import pstats
import sys
import time

import torch

from pq2verify.cli import positive_int, positive_ints


def build(device):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                      num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=2048)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(torch.bfloat16).to(device).eval()


def time_forwards(model, m, steps, device, ctx=200):
    from pq2verify.gsm8k.generate import _cache_kw, _new_cache
    kw = _cache_kw(model)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    cache = _new_cache(model)
    ids = torch.randint(0, 49152, (m, ctx), device=device, generator=None)
    with torch.no_grad():
        model(input_ids=ids, use_cache=True, logits_to_keep=1, **{kw: cache})
        tok = torch.randint(0, 49152, (m, 1), device=device)
        for _ in range(3):
            model(input_ids=tok, use_cache=True, logits_to_keep=1, **{kw: cache})
        sync()
        ts = []
        for _ in range(steps):
            t0 = time.perf_counter()
            model(input_ids=tok, use_cache=True, logits_to_keep=1, **{kw: cache})
            sync()
            ts.append(time.perf_counter() - t0)
    ts.sort()
    return 1e3 * ts[len(ts) // 2], 1e3 * ts[0], 1e3 * ts[-1]


def call_costs(device, reps=200):
    """Per PQ2 call at the model's shapes: µs issued back to back (what the host spends), µs with a
    sync after each call, and µs per call replayed from a CUDA graph (what the GPU spends)."""
    import importlib
    from pq2verify.bench.timing import GraphTimer
    from pq2verify.inputs import ternary_weight
    shapes = [(960, 2560), (576, 2560), (3072, 2560), (576, 6144)]
    print("path       M  shape        issue µs  sync µs  graph µs")
    for label, m in [("gemv", 1), ("gemv-nopdl", 1), ("single", 1), ("int_gemv", 1), ("small_mma", 8),
                     ("int_gemv", 8)]:
        mod = importlib.import_module(f"kernels.{label.split('-')[0]}")
        for n, k in shapes:
            w = ternary_weight(n, k, 1, device, "raw")
            x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
            cfg = dict(mod.config(n, k, m, False), PDL=False) if label.endswith("nopdl") else None

            def call(mod=mod, x=x, w=w, cfg=cfg):
                return mod.run(x, w, check=False, config=cfg)
            for _ in range(20):
                call()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                call()
            issue = (time.perf_counter() - t0) / reps
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                call()
                torch.cuda.synchronize()
            sync = (time.perf_counter() - t0) / reps
            timer = GraphTimer([call] * 50, per=50)     # the bench's graph timer, host clock
            timer.replay_sync()
            graph = timer.wall(4) / 1e6
            timer.close()
            print(f"{label:10s} {m:2d} {n}x{k:<6d} {issue * 1e6:8.1f} {sync * 1e6:8.1f} {graph * 1e6:8.1f}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=positive_int, default=20)
    p.add_argument("--m", type=positive_ints, default=[16, 8, 4, 2, 1], help="decode Ms (default 16,8,4,2,1)")
    p.add_argument("--sets", default="legacy,tuned")
    p.add_argument("--profile", action="store_true", help="cProfile 10 tuned forwards at the first M")
    p.add_argument("--calls", action="store_true", help="also time single PQ2 calls at the model's shapes")
    p.add_argument("--graphs", action="store_true", help="also time each set with the decode calls in CUDA graphs")
    a = p.parse_args(argv)
    from kernels import sets as kernelsets
    ms = a.m
    try:
        for kset in a.sets.split(","):
            kernelsets.check_name(kset, "--sets ")
    except ValueError as e:
        p.error(str(e))
    if (a.calls or a.graphs) and a.device != "cuda":
        p.error("--calls and --graphs time CUDA launches and graphs: need --device cuda")
    if a.calls:
        call_costs(a.device)
    torch.set_grad_enabled(False)
    from pq2verify.gsm8k import model as gm
    gm.deterministic_attention(a.device)
    model = build(a.device)
    print(f"# forward cost, {torch.cuda.get_device_name() if a.device == 'cuda' else 'cpu'}; ms per decode "
          "forward (median, min, max of %d), context 200" % a.steps)
    for m in ms:
        print(f"bf16 nn.Linear  M={m:2d}: %.2f (%.2f-%.2f)" % time_forwards(model, m, a.steps, a.device))
    t0 = time.perf_counter()
    usage = gm.Usage()
    gm.pq2ify(model, 4, usage=usage)
    print(f"pq2ify: {time.perf_counter() - t0:.1f} s")
    from pq2verify.gsm8k.graphs import CallGraphs
    for graphs in (False, True) if a.graphs else (False,):
        usage.graphs = CallGraphs() if graphs else None
        for kset in a.sets.split(","):
            os.environ["PQ2_KERNELS"] = kset
            for m in ms:
                usage.calls.clear()
                t0 = time.perf_counter()
                med, lo, hi = time_forwards(model, m, a.steps, a.device)
                paths = sorted({name for (name, mm) in usage.calls if mm == m})
                print(f"{kset:6s} PQ2{' graphs' if graphs else '       '} M={m:2d}: {med:.2f} ({lo:.2f}-{hi:.2f})  "
                      f"paths {','.join(paths)}; first use incl. compile {time.perf_counter() - t0:.1f} s")
    usage.graphs = None
    if a.profile:
        os.environ["PQ2_KERNELS"] = "tuned"
        pr = cProfile.Profile()
        pr.runcall(time_forwards, model, ms[0], 10, a.device)
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
