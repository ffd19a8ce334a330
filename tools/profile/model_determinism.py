"""Is the GSM8K model runner deterministic run to run, and where does its time go?

A random-weight model of the default model's architecture (no checkpoint needed), batched
greedy generation twice per configuration on the same prompts, every step's top-k compared.
Configurations: the PQ2 runner (legacy set), the same model with plain bf16 linears, and the
PQ2 runner with SDPA forced to the math backend. Then a profile of one PQ2 batch.

    python tools/profile/model_determinism.py [--device cuda] [--steps 64] [--batches 2]
"""
import argparse
import contextlib
import cProfile
import os
import pstats
import time

import torch

from pq2verify.gsm8k.architecture import SMOLLM2_135M as CONFIG


class Tok:
    """Token ids as text: enough for Generator (decode, eos, pad)."""
    eos_token_id, pad_token_id = 2, 2

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def build(device, pq2: bool):
    from transformers import LlamaConfig, LlamaForCausalLM
    from pq2verify.gsm8k import model as mdl
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(torch.bfloat16)
    with torch.no_grad():   # weights of a trained model's size, so logits are not flat
        for p in m.parameters():
            p.mul_(3.0)
    m.to(device).eval()
    if pq2:
        mdl.pq2ify(m, 4)
    head = m.get_output_embeddings()
    m.set_output_embeddings(mdl.FP32Head(head))
    m.config.tie_word_embeddings = False
    return m


def prompts(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(3, 49152, (200,), generator=g).tolist()
    return [prefix + torch.randint(3, 49152, (int(torch.randint(30, 120, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def generate_all(model, ps, steps, batch):
    from pq2verify.gsm8k import generate
    # ~1.5% of tokens end a row, so decode M shrinks as rows stop, as in a real run
    eos = [t for t in range(49152) if t % 67 == 5]
    g = generate.Generator(model, Tok(), max_new_tokens=steps, stops=[], top_k=5, eos_ids=eos, pad_id=2)
    g.set_prefix(ps[0][:200])
    out = {}
    for i in range(0, len(ps), batch):
        reqs = [generate.Request(j, ps[j]) for j in range(i, min(i + batch, len(ps)))]
        g.run_batch(reqs, lambda r: out.__setitem__(r.qid, r))
    return out, g


def compare(a, b):
    diffs = []
    for q in sorted(a):
        for s, (x, y) in enumerate(zip(a[q].topk, b[q].topk)):
            if x != y:
                diffs.append((q, s, x[0], y[0]))
                break
    return diffs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    os.environ["PQ2_KERNELS"] = "legacy"
    dev = args.device
    ps = prompts(16 * args.batches)
    print(f"torch {torch.__version__}; sdpa backends: flash {torch.backends.cuda.flash_sdp_enabled()} "
          f"mem_efficient {torch.backends.cuda.mem_efficient_sdp_enabled()} "
          f"cudnn {torch.backends.cuda.cudnn_sdp_enabled()} math {torch.backends.cuda.math_sdp_enabled()}", flush=True)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for name, pq2, ctx in (("pq2 legacy", True, contextlib.nullcontext),
                           ("plain bf16", False, contextlib.nullcontext),
                           ("pq2 legacy, sdpa math", True, lambda: sdpa_kernel(SDPBackend.MATH))):
        model = build(dev, pq2)
        runs = []
        for r in range(args.repeats):
            t = time.perf_counter()
            with ctx():
                res, g = generate_all(model, ps, args.steps, 16)
            torch.cuda.synchronize() if dev == "cuda" else None
            el = time.perf_counter() - t
            runs.append(res)
            print(f"{name} run {r}: {g.tokens_out} tokens in {el:.1f}s ({g.tokens_out / el:.0f} tok/s)", flush=True)
        for r in range(1, len(runs)):
            d = compare(runs[0], runs[r])
            print(f"{name}: run 0 vs {r}: {len(d)} of {len(ps)} rows differ; first (row, step, top-k 0, top-k 0'): "
                  f"{d[:4]}", flush=True)
        del model
    model = build(dev, True)
    generate_all(model, ps[:16], args.steps, 16)
    pr = cProfile.Profile()
    pr.enable()
    generate_all(model, ps[:16], args.steps, 16)
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(30)
    per_call(model, dev)


def per_call(model, dev):
    """Wall time per projection call (launch-bound when it exceeds the kernels' time)."""
    from kernels import dispatch
    stack = model.model.layers[0].mlp.gate_proj.stack
    for m in (1, 16):
        x = torch.randn(m, 576, device=dev, dtype=torch.bfloat16)
        xp = torch.nn.functional.pad(x, (0, stack.w.k - 576))
        for label, fn in (("_Stack.run (pad, pq2_matmul, digit sum)", lambda: stack.run(x)),
                          ("pq2_matmul", lambda: dispatch.pq2_matmul(xp, stack.w)),
                          ("kernel wrapper", lambda: dispatch.resolve(m, stack.w, xp, "legacy").kernel()(xp, stack.w, check=False))):
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(300):
                fn()
            torch.cuda.synchronize()
            print(f"M={m} {label}: {(time.perf_counter() - t) / 300 * 1e6:.0f} us per call", flush=True)


if __name__ == "__main__":
    main()
