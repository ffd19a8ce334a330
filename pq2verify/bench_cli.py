"""pq2verify bench: kernel set A against kernel set B (and cuBLAS BF16), each (path, shape, M)
timed only after its numerics gate passed on the very inputs that are timed."""
import json
import sys
from pathlib import Path

from .cli import UsageError, check_writable, nonneg_int, positive_int, positive_ints


def register(sub):
    ap = sub.add_parser("bench", help="benchmarks gated on passing numerics (A vs B vs cuBLAS BF16)")
    ap.add_argument("--a", default="legacy", help="control kernel set: legacy, exact or tuned (default legacy)")
    ap.add_argument("--b", default="tuned", help="candidate kernel set (default tuned)")
    ap.add_argument("--shapes", default="auto",
                    help="bonsai27b, small, or shape names (gate_up,down,...); "
                         "auto: bonsai27b on a GPU, small on the interpreter")
    ap.add_argument("--m", default=None, type=_ints,
                    help="comma-separated M (default 1,2,4,8,16,128,2048; --quick 1,16,2048; "
                         "interpreter 1,2,17)")
    ap.add_argument("--step-m", default=None, type=_ints,
                    help="M of the whole chained decode step (default 1,2,4,8,16; --quick 1,16; none: skip)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--layout", default="prepared", choices=("prepared", "raw"), help="PQ2 weight layout timed")
    ap.add_argument("--quick", action="store_true", help="the targets' M only, 7 rounds, --budget-s 180")
    ap.add_argument("--budget-s", type=float, default=None, help="start no new item after this many seconds")
    ap.add_argument("--pairs", type=positive_int, default=None,
                    help="alternating rounds after warm-up (>= 7; default 9)")
    ap.add_argument("--warmup", type=nonneg_int, default=None, help="warm-up rounds (default 3)")
    ap.add_argument("--rotate-gb", type=float, default=1.0, help="weight copies per shape total at least this (GB)")
    ap.add_argument("--bw-gb", type=float, default=2.0, help="bandwidth probe buffer (GB)")
    ap.add_argument("--min-sample-ms", type=float, default=1.0, help="replays per timed sample last about this long")
    ap.add_argument("--reruns", type=positive_int, default=None,
                    help="determinism reruns in the gate (default 2; --quick 1)")
    ap.add_argument("--bf16-step", default="auto", choices=("auto", "graph", "sum"),
                    help="BF16 decode step: one graph of 257 bf16 copies (51 GB), or per-shape medians x calls")
    ap.add_argument("--json", default=None, help="write all results (provenance, rows, targets) to this file")
    ap.add_argument("--jsonl", default=None, help="results as they come, one JSON line per item "
                                                  "(default: --json's name with .jsonl, else runs/bench.jsonl)")
    ap.add_argument("--resume", action="store_true", help="keep the items already in --jsonl and run the rest")
    ap.add_argument("--report", default=None, help="Markdown report; its plot is written beside it as .png")
    ap.add_argument("--html", default=None, help="also a self-contained HTML page: the report with its plot")
    ap.add_argument("--dry-run", action="store_true",
                    help="fake gates and timings, no kernel runs (not a measurement): exercises table, "
                         "report, plot, resume; the only mode without a CUDA GPU")
    ap.set_defaults(func=run)


def _ints(s):
    """argparse type of --m and --step-m: integers >= 1, or 'none' (no item)."""
    if s.strip().lower() == "none":
        return ()
    return tuple(positive_ints(s))


def config(args):
    from .bench import PRESETS, Config
    preset = PRESETS["quick" if args.quick else "full"]
    pick = lambda v, key: preset[key] if v is None else v  # noqa: E731
    return Config(a=args.a, b=args.b, shapes=args.shapes, ms=pick(args.m, "ms"),
                  step_ms=pick(args.step_m, "step_ms"), dtype=args.dtype, layout=args.layout,
                  pairs=pick(args.pairs, "pairs"), warmup=pick(args.warmup, "warmup"), rotate_gb=args.rotate_gb,
                  min_sample_ms=args.min_sample_ms, bw_gb=args.bw_gb, reruns=pick(args.reruns, "reruns"),
                  budget_s=pick(args.budget_s, "budget_s"), bf16_step=args.bf16_step)


def jsonl_path(args) -> Path:
    if args.jsonl:
        return Path(args.jsonl)
    return Path(args.json).with_suffix(".jsonl") if args.json else Path("runs/bench.jsonl")


def run(args) -> int:
    from rich.console import Console

    from . import backend, bench, bench_report
    if not args.dry_run and backend.device() != "cuda":
        raise UsageError("bench times kernels on a CUDA GPU, and this run is on the CPU (no GPU, or --device "
                         "cpu); --dry-run exercises the table, report and plot on fake gates and timings "
                         "(not a measurement)")
    for opt, fn in (("--json", args.json), ("--report", args.report), ("--html", args.html),
                    ("--jsonl", jsonl_path(args))):
        if fn:
            check_writable(fn, opt, make_parents=True)     # before the run, not after it
    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=220)
    try:
        cfg = config(args)
    except ValueError as e:
        print(f"pq2verify bench: {e}", file=sys.stderr)
        return 2
    kind = "dry-run" if args.dry_run else backend.device()
    env = bench.make_env(kind)
    jsonl = jsonl_path(args)
    console.print(f"[bold]pq2verify bench[/] A={cfg.a} B={cfg.b} env={env.kind} dtype={cfg.dtype} "
                  f"layout={cfg.layout} rounds={cfg.pairs} budget={cfg.budget_s} s; rows -> {jsonl}")
    try:
        res = bench.run(cfg, env, jsonl=jsonl, resume=args.resume,
                        progress=lambda i, n, row: print(bench_report.progress_line(i, n, row), flush=True))
    except ValueError as e:
        print(f"pq2verify bench: {e}", file=sys.stderr)
        return 2
    for t in bench_report.console_tables(res):
        console.print(t)
    for line in bench_report.summary_lines(res):
        console.print(line, soft_wrap=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
        console.print(f"wrote {args.json}")
    if args.report or args.html:
        import tempfile
        from . import html_report as h
        with tempfile.TemporaryDirectory() as tmp:
            md, png = bench_report.write(res, Path(args.report) if args.report else Path(tmp) / "bench.md")
            if args.html:
                body = [h.from_markdown(Path(md).read_text())]
                if png:
                    body.append(h.image(Path(png).read_bytes(), "bench plot"))
                Path(args.html).write_text(h.page("pq2verify bench", body))
        if args.report:
            console.print(f"wrote {md}" + (f" and {png}" if png else " (no plot)"))
    bad = res["blocked"] or res["errors"]
    console.print(f"[bold]{'FAIL' if bad else 'OK'}[/]: {len(res['blocked'])} blocked, {len(res['errors'])} errors, "
                  f"{len(res['not_run'])} not run, {res['elapsed_s']:.0f} s"
                  + (" (dry run: fake gates and timings, not a measurement)" if args.dry_run else ""))
    return 1 if bad else 0
