"""pq2verify bench: kernel set A against kernel set B (and cuBLAS BF16), each (path, shape, M)
timed only after its numerics gate passed on the very inputs that are timed.

Verdict and exit code: OK (0) when every item ran, passed its gate and its checks after
timing, and nothing was faster than the speed of light by more than the noise; FAIL (1) on a
blocked gate, an error, a failed check after timing, a suspicious row or a regression against
--baseline; PARTIAL (1) when the budget ended before every item ran (--resume finishes it); 2:
bad input, refused before any work (an A/B whose A and B resolve to the same path everywhere
among them); 3: an output file could not be written (the verdict printed before it stands)."""
import argparse
import json
from pathlib import Path

from . import cli
from .cli import (UsageError, existing_file, finite_float, names, nonempty, nonneg_float, nonneg_int,
                  positive_float, positive_int, positive_ints)


def register(sub):
    ap = sub.add_parser("bench", help="benchmarks gated on passing numerics (A vs B vs cuBLAS BF16)",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", default="legacy", type=nonempty,
                    help="control kernel set: legacy, exact or tuned (default legacy)")
    ap.add_argument("--b", default="tuned", type=nonempty, help="candidate kernel set (default tuned)")
    ap.add_argument("--shapes", default="auto", type=_shapes,
                    help="bonsai27b, small, or shape names (gate_up,down,...); "
                         "auto: bonsai27b on a GPU, small on the interpreter")
    cli.add_m_option(ap, type=_ints,
                     help="comma-separated M (default 1,2,4,8,16,128,2048; --quick 1,16,2048; "
                         "interpreter 1,2,17)")
    ap.add_argument("--step-m", default=None, type=_ints,
                    help="M of the whole chained decode step (default 1,2,4,8,16; --quick 1,16; none: skip)")
    ap.add_argument("--spin-us", type=_nonneg, default=5.0,
                    help="power proxy of the decode step: a low-power spin of this many µs after each of its calls "
                         "(torch.cuda._sleep; cycles = µs x the SM clock measured in the run), the step reported "
                         "with and without it (default 5; 0: none)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--layout", default="prepared", choices=("prepared", "raw"), help="PQ2 weight layout timed")
    ap.add_argument("--quick", action="store_true", help="the targets' M only, 7 rounds, --budget-s 180")
    ap.add_argument("--budget-s", type=_positive, default=None,
                    help="start no new item after this many seconds (> 0); items left are listed and the "
                         "run is PARTIAL (exit 1) until --resume finishes it")
    ap.add_argument("--pairs", type=positive_int, default=None,
                    help="alternating rounds after warm-up (>= 7; default 9)")
    ap.add_argument("--warmup", type=nonneg_int, default=None, help="warm-up rounds (default 3)")
    ap.add_argument("--rotate-gb", type=_positive, default=1.0, help="weight copies per shape total at least this (GB)")
    ap.add_argument("--bw-gb", type=_positive, default=2.0, help="bandwidth probe buffer (GB)")
    ap.add_argument("--min-sample-ms", type=_positive, default=1.0, help="replays per timed sample last about this long")
    ap.add_argument("--ci-width", type=_positive, default=0.02,
                    help="rounds go on until every compared ratio's 95%% bootstrap interval is at most this wide, "
                         "relative to its median (default 0.02), or --max-pairs rounds, or the budget ends")
    ap.add_argument("--max-pairs", type=positive_int, default=None,
                    help="most rounds a ratio's interval may take (default 25; --quick 11)")
    ap.add_argument("--reruns", type=positive_int, default=None,
                    help="determinism reruns in the gate (default 2; --quick 1)")
    ap.add_argument("--bf16-step", default="auto", choices=("auto", "graph", "sum"),
                    help="BF16 decode step: one graph of 257 bf16 copies (51 GB), or per-shape medians x calls")
    cli.add_output(ap, "--json", help="write all results (provenance, rows, targets) to this file")
    ap.add_argument("--jsonl", default=None, help="results as they come, one JSON line per item "
                                                  "(default: --json's name with .jsonl, else runs/bench.jsonl)")
    ap.add_argument("--baseline", default=None, type=existing_file,
                    help="a stored bench --json of the same GPU: fail on a row slower than it beyond --baseline-tol "
                         "(the interval of old/new time wholly below 1 - tol)")
    ap.add_argument("--baseline-tol", type=_fraction, default=0.0,
                    help="run-to-run allowance of the regression gate, a fraction in [0, 1) (default 0: any "
                         "slowdown whose interval excludes 1)")
    ap.add_argument("--selftest", action="store_true",
                    help="plant timing faults (cached output, half the weights, work on another stream, A == B, "
                         "a clock drop) and show which check catches each (CUDA GPU; about a minute)")
    ap.add_argument("--resume", action="store_true", help="keep the items already in --jsonl and run the rest")
    cli.add_output(ap, "--report", help="Markdown report; its plot is written beside it as .png")
    cli.add_output(ap, "--html", help="also a self-contained HTML page: the report with its plot")
    ap.add_argument("--dry-run", action="store_true",
                    help="fake gates and timings, no kernel runs (not a measurement): exercises table, "
                         "report, plot, resume; the only mode without a CUDA GPU")
    ap.set_defaults(func=run)


def _ints(s):
    """argparse type of --m and --step-m: integers >= 1, or 'none' (no item)."""
    if s.strip().lower() == "none":
        return ()
    return tuple(positive_ints(s))


def _shapes(s):
    """argparse type of --shapes: a set name or shape names, none empty, none twice."""
    return ",".join(names(s))


_positive = positive_float
_nonneg = nonneg_float
_fraction = finite_float(lambda v: 0 <= v < 1, "a fraction in [0, 1)")


def config(args):
    from .bench import PRESETS, Config
    preset = PRESETS["quick" if args.quick else "full"]
    pick = lambda v, key: preset[key] if v is None else v  # noqa: E731
    return Config(a=args.a, b=args.b, shapes=args.shapes, ms=pick(args.m, "ms"),
                  step_ms=pick(args.step_m, "step_ms"), dtype=args.dtype, layout=args.layout,
                  pairs=pick(args.pairs, "pairs"), warmup=pick(args.warmup, "warmup"), rotate_gb=args.rotate_gb,
                  min_sample_ms=args.min_sample_ms, bw_gb=args.bw_gb, reruns=pick(args.reruns, "reruns"),
                  budget_s=pick(args.budget_s, "budget_s"), bf16_step=args.bf16_step,
                  ci_width=args.ci_width, max_pairs=pick(args.max_pairs, "max_pairs"), spin_us=args.spin_us)


def jsonl_path(args) -> Path:
    if args.jsonl is not None:
        return Path(args.jsonl)
    return Path(args.json).with_suffix(".jsonl") if args.json is not None else Path("runs/bench.jsonl")


def _check_outputs(args) -> None:
    """Every output on its own file, none on an input, each writable: before any work."""
    from . import outputs
    outs = cli.output_paths(args)
    if args.jsonl is not None:
        outs.append(("--jsonl", args.jsonl))
    elif args.json is None or args.json.strip():
        outs.append(("--jsonl", jsonl_path(args)))
    if args.report is not None and args.report.strip():
        outs.append(("--report's plot", str(Path(args.report).with_suffix(".png"))))
    outputs.check(outs, inputs=[("--baseline", args.baseline)])


def _selftest(args, console) -> int:
    from kernels import backend
    from .bench import selftest
    if args.dry_run or backend.device() != "cuda":
        raise UsageError("--selftest times planted faults on a CUDA GPU; it has no dry run (its logic is "
                         "tested on the CPU by tests/test_bench_stats.py)")
    res = selftest.run(selftest.GpuKit())
    for line in selftest.lines(res):
        console.print(line, soft_wrap=True)
    console.print(f"[bold]{'OK' if res['ok'] else 'FAIL'}[/]: bench self-test, "
                  f"{sum(r['ok'] for r in res['rows'])} of {len(res['rows'])} rows as expected")
    if args.json is not None:
        from . import outputs
        outputs.write_text(args.json, json.dumps(res, indent=1, default=str), "--json")
    return 0 if res["ok"] else 1


def run(args) -> int:
    from rich.console import Console

    from kernels import backend
    from . import bench, outputs
    from .bench import report as bench_report
    if args.selftest:
        for opt, v in (("--baseline", args.baseline), ("--resume", args.resume or None), ("--report", args.report),
                       ("--html", args.html)):
            if v is not None:
                raise UsageError(f"{opt} does not go with --selftest")
    if not args.dry_run and backend.device() != "cuda" and not args.selftest:
        raise UsageError("bench times kernels on a CUDA GPU, and this run is on the CPU (no GPU, or --device "
                         "cpu); --dry-run exercises the table, report and plot on fake gates and timings "
                         "(not a measurement)")
    _check_outputs(args)           # before the run, not after it
    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=220)
    if args.selftest:
        return _selftest(args, console)
    try:
        cfg = config(args)
        kind = "dry-run" if args.dry_run else backend.device()
        env = bench.make_env(kind)
        bench.prepare(cfg, env)        # bad settings, or an A/B that compares nothing: refused here
        stored = None
        if args.baseline is not None:
            stored = bench.baseline.load(args.baseline)
            bench.baseline.check_comparable(stored, cfg.signature(env.kind, env.device_name()), args.baseline)
    except ValueError as e:
        raise UsageError(str(e)) from None
    jsonl = jsonl_path(args)
    console.print(f"[bold]pq2verify bench[/] A={cfg.a} B={cfg.b} env={env.kind} dtype={cfg.dtype} "
                  f"layout={cfg.layout} rounds={cfg.pairs} (up to {cfg.max_pairs}) budget={cfg.budget_s} s; "
                  f"rows -> {jsonl}")
    try:
        res = bench.run(cfg, env, jsonl=jsonl, resume=args.resume,
                        progress=lambda i, n, row: print(bench_report.progress_line(i, n, row), flush=True))
    except ValueError as e:
        raise UsageError(str(e)) from None
    if stored is not None:
        res["baseline"] = {"file": str(args.baseline), **bench.baseline.compare(res, stored, args.baseline_tol)}
    for t in bench_report.console_tables(res):
        console.print(t)
    for line in bench_report.summary_lines(res):
        console.print(line, soft_wrap=True)
    word, bad = verdict(res)
    console.print(f"[bold]{word}[/]: " + ", ".join(bad) + f", {res['elapsed_s']:.0f} s"
                  + (" (dry run: fake gates and timings, not a measurement)" if args.dry_run else ""))
    # the verdict is printed: now the files (a failed write is exit 3, the verdict above stands)
    items = [("--json", args.json, lambda: json.dumps(res, indent=1, default=str))]
    if args.report is not None or args.html is not None:
        items += _report_items(res, args)
    done, failed = [], list(res.get("write_errors") or [])
    for opt, path, data in items:      # each one it can; every failure named at the end
        if path is None:
            continue
        try:
            if isinstance(data, bytes):
                try:
                    Path(path).parent.mkdir(parents=True, exist_ok=True)
                    Path(path).write_bytes(data)
                except OSError as e:
                    raise outputs.WriteError(f"{opt} {path}: could not write: {e.strerror or e}") from None
            else:
                outputs.write_text(path, data() if callable(data) else data, opt)
            done.append(path)
        except outputs.WriteError as e:
            failed.append(str(e))
    for p in done:
        console.print(f"wrote {p}")
    if failed:
        raise outputs.WriteError("; ".join(failed))
    return 0 if word == "OK" else 1


def verdict(res: dict) -> tuple:
    """('OK' | 'FAIL' | 'PARTIAL', the counts that decide it)."""
    reg = (res.get("baseline") or {}).get("regressions") or []
    counts = [("blocked", res["blocked"]), ("errors", res["errors"]), ("failed checks after timing", res.get("suspect")),
              ("suspicious", res.get("suspicious")), ("regressions", reg if res.get("baseline") else None)]
    bad = any(v for _, v in counts)
    word = "FAIL" if bad else "PARTIAL" if res["not_run"] else "OK"
    parts = [f"{len(v)} {k}" for k, v in counts if v is not None]
    parts.append(f"{len(res['not_run'])} not run" + (" (budget spent: --resume continues)" if res["not_run"] else ""))
    if res.get("drift") or res.get("throttled"):
        parts.append(f"{len(res.get('drift') or [])} drift and {len(res.get('throttled') or [])} throttle warnings")
    return word, parts


def _report_items(res: dict, args) -> list:
    """The Markdown report (its plot beside it) and the HTML page, as write_all items."""
    import tempfile

    from .bench import report as bench_report
    from .report import html as h
    with tempfile.TemporaryDirectory() as tmp:
        png = Path(tmp) / "bench.png"
        note = bench_report.plot(res, png)
        png_bytes = None if note else png.read_bytes()
    name = Path(args.report).with_suffix(".png").name if args.report is not None else "bench.png"
    md = bench_report.markdown(res, None if note else name, note)
    items = [("--report", args.report, md)]
    if args.report is not None and png_bytes is not None:
        items.append(("--report's plot", str(Path(args.report).with_suffix(".png")), png_bytes))
    if args.html is not None:
        body = [h.from_markdown(md)] + ([h.image(png_bytes, "bench plot")] if png_bytes else [])
        items.append(("--html", args.html, h.page("pq2verify bench", body)))
    return items
