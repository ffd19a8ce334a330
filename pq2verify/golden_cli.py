"""pq2verify golden capture | verify: frozen output bytes per backend (pq2verify.golden).

  pq2verify golden capture [--kernels SET] [--paths a,b] [--backend auto] [--force] [--model]
  pq2verify golden verify  [--kernels SET] [--paths a,b] [--backend auto] [--case ID] [--json F] [--allow-missing] [--model]

A missing capture, and a capture that lacks a case the code expects, are failures (exit 1).
"""
import argparse
import json
import sys
from pathlib import Path

from .cli import UsageError, check_writable


def register(sub):
    ap = sub.add_parser("golden", help="golden captured outputs: capture them, or verify them bit for bit")
    gs = ap.add_subparsers(dest="golden_command", required=True)
    for name, text in (("capture", "run the fixed cases of every path and record inputs and output bytes"),
                       ("verify", "recompute every captured case and require identical bytes")):
        p = gs.add_parser(name, help=text)
        p.add_argument("--kernels", default=None, help="only paths the set can serve: legacy, exact or tuned")
        p.add_argument("--paths", default=None, help="comma-separated path names (default: all)")
        p.add_argument("--backend", default="auto", choices=("auto", "interpreter", "cuda"),
                       help="auto: the --device choice; interpreter: the CPU with TRITON_INTERPRET=1")
        p.add_argument("--dir", "--out", dest="dir", default=None,
                       help="capture directory (default: golden/<backend key>, e.g. golden/sm90)")
        p.add_argument("--model", action="store_true",
                       help="the GSM8K model's PQ2 projections at decode positions 1, 32, 128 (needs pq2verify.gsm8k.model)")
        p.set_defaults(func=run)
    cap = gs.choices["capture"]
    cap.add_argument("--force", action="store_true", help="capture even cases whose numerics check fails")
    ver = gs.choices["verify"]
    ver.add_argument("--case", action="append", default=[], help="verify only this case id (repeatable)")
    ver.add_argument("--json", default=None, help="write every outcome to this file")
    ver.add_argument("--html", default=None, help="also write a self-contained HTML report (failures first)")
    ver.add_argument("--allow-missing", action="store_true",
                     help="a missing capture directory or manifest is a SKIP (exit 0) instead of a failure")
    ver.add_argument("--strict", action="store_true", help=argparse.SUPPRESS)   # the default now; kept for old scripts


def _csv(s):
    return None if s is None else [v.strip() for v in s.split(",") if v.strip()]


def _select_backend(choice: str) -> str:
    from . import backend
    if choice == "auto":
        return backend.device()
    try:
        return backend.select("cpu" if choice == "interpreter" else "cuda")
    except (RuntimeError, ValueError) as e:
        raise UsageError(f"--backend {choice}: {e}") from None


def _check_args(args):
    from . import registry
    names = _csv(args.paths)
    for n in names or ():
        if n not in registry.BY_NAME:
            raise UsageError(f"--paths: unknown path {n!r}; known paths: {', '.join(registry.BY_NAME)}")
    if args.kernels is not None:
        from .kernelsets import check_name
        try:
            check_name(args.kernels, "--kernels ")
        except ValueError as e:
            raise UsageError(str(e)) from None
    return names


def run(args) -> int:
    names = _check_args(args)
    device = _select_backend(args.backend)
    from . import backend, golden
    asked = names
    names = [p.name for p in golden.select_paths(names, args.kernels)]
    if not names:      # an empty selection must not verify nothing (or everything) and pass
        raise UsageError(f"no path matches --kernels {args.kernels} --paths {','.join(asked)}")
    key = backend.golden_key()
    dest = Path(args.dir) if args.dir else golden.default_dir(key)
    # output paths before any work: a run must not be lost at its end
    if args.golden_command == "capture":
        check_writable(dest / "model" if args.model else dest, "--dir", directory=True, make_parents=True)
    else:
        for opt, fn in (("--json", args.json), ("--html", getattr(args, "html", None))):
            if fn:
                check_writable(fn, opt)
    if args.model:
        from . import golden_model
        try:
            if args.golden_command == "capture":
                golden_model.capture_model(dest / "model", device)
                return 0
            return _verify_model(dest / "model", device, args)
        except golden_model.ModelRunnerMissing as e:
            print(f"pq2verify golden: {e}", file=sys.stderr)
            return 2
    if args.golden_command == "capture":
        return _capture(dest, key, names, device, args)
    return _verify(dest, names, device, args)


def _importable(names):
    from . import registry
    ok, missing = [], []
    for n in names:
        try:
            registry.get(n).kernel()
            ok.append(n)
        except ModuleNotFoundError as e:
            missing.append(f"{n} ({e.name} not found)")
    return ok, missing


def _progress(s: str) -> None:
    if sys.stderr.isatty():
        print(f"\r{s[:100]:100s}", end="", file=sys.stderr, flush=True)
    elif s.startswith("refused"):
        print(s, file=sys.stderr)


def _capture(dest, key, names, device, args) -> int:
    from . import golden
    ok, missing = _importable(names)
    todo = golden.cases(key, ok)
    print(f"golden capture: {len(todo)} cases of {len(ok)} paths on {key} into {dest}", file=sys.stderr)
    try:
        man = golden.capture(dest, todo, device, force=args.force,
                             log=_progress)
    except golden.GoldenIntegrityError as e:
        print(f"\nERROR: the existing capture is broken, not merging into it: {e}", file=sys.stderr)
        return 1
    print(file=sys.stderr)
    size = sum(f.stat().st_size for f in dest.iterdir() if f.is_file())
    captured = sorted({e["path"] for e in man["cases"]})
    print(f"captured: {len(man['cases'])} cases of {', '.join(captured)}; {size / 1e6:.2f} MB in {dest}")
    for r in man["refused"]:
        print(f"REFUSED {r['id']}: {r['why']}  (fix the kernel, or --force to capture anyway)")
    for m in missing:
        print(f"MISSING kernel {m}: not captured")
    return 1 if man["refused"] or missing else 0


def _missing_capture(console_print, e, args) -> int:
    """A capture that is not there: a failure, a SKIP only with --allow-missing."""
    if args.allow_missing:
        console_print(f"SKIP (--allow-missing): {e}")
        return 0
    console_print(f"FAIL: {e}\n  (a missing capture is a failure; --allow-missing makes it a skip)")
    return 1


def _verify(dest, names, device, args) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from . import golden
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)   # logs: no squeezed table
    try:
        g = golden.load(dest)
    except golden.NoCapture as e:
        return _missing_capture(lambda m: console.print(escape(m), soft_wrap=True), e, args)
    except golden.GoldenIntegrityError as e:
        console.print(f"[red bold]ERROR[/] (integrity): {escape(str(e))}", soft_wrap=True)
        return 1
    key = g.manifest["backend_key"]
    known = {e["id"] for e in g.manifest["cases"]} | {c.id for c in golden.cases(key, names)}
    unknown = [i for i in args.case if i not in known]
    if unknown:
        raise UsageError(f"--case {unknown[0]!r}: not a golden case of backend {key} (captured or expected)")
    outcomes = golden.verify(g, device, paths=names, ids=args.case or None)
    table = Table(title=f"golden {dest} (captured {g.manifest.get('date', '?')} on {g.manifest.get('backend', '?')}, "
                        f"commit {g.manifest.get('commit', '?')})")
    for col in ("path", "cases", "identical", "within bound", "different", "missing", "errors", "compared",
                "source", "verdict"):
        table.add_column(col)
    by_path = {}
    for o in outcomes:
        by_path.setdefault(o.case.path, []).append(o)
    for path, os_ in by_path.items():
        bad = [o for o in os_ if not o.ok]
        src = "changed" if os_[0].source_changed else "unchanged"      # which files: printed below
        count = lambda *st: str(sum(o.status in st for o in os_))     # noqa: E731
        how = sorted({o.comparison.split(" (")[0] for o in os_ if o.status != "missing"})
        table.add_row(path, str(len(os_)), count("identical"), count("within bound"), count("different"),
                      count("missing"), count("error", "integrity"), ", ".join(how) or "-", src,
                      "[red bold]FAIL[/]" if bad else "PASS")
    console.print(table)
    for why in sorted({o.comparison for o in outcomes if o.comparison.startswith("bound")}):
        console.print(f"isa-dependent paths compared within the derived bound: {escape(why)}", soft_wrap=True)
    for path, os_ in by_path.items():
        if os_[0].source_changed and all(o.ok for o in os_):
            console.print(f"[yellow]{path}: source changed, output identical[/] ({', '.join(os_[0].source_changed)})",
                          soft_wrap=True)
    for o in outcomes:
        if not o.ok:
            console.print(f"[red]FAIL[/] {escape(o.message())}\n  reproduce: {golden.repro(key, o.case.id, dest)}",
                          soft_wrap=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"manifest": {k: v for k, v in g.manifest.items() if k != "cases"}, "isa": golden.isa(),
                       "outcomes": [{"case": o.case.id, "status": o.status, "comparison": o.comparison,
                                     "detail": o.detail, "source_changed": o.source_changed} for o in outcomes]},
                      f, indent=1)
    if args.html:
        with open(args.html, "w") as f:
            f.write(_html(g, outcomes, key, dest))
    n_bad = sum(not o.ok for o in outcomes)
    if not outcomes:
        console.print("[bold]FAIL[/]: no golden case was verified (nothing captured or expected for this selection)")
        return 1
    console.print(f"[bold]{'PASS' if not n_bad else 'FAIL'}[/]: {len(outcomes) - n_bad} of {len(outcomes)} "
                  "golden cases identical or within their bound")
    return 1 if n_bad else 0


def _html(g, outcomes, key, dest) -> str:
    from . import golden
    from . import html_report as h
    bad = sum(not o.ok for o in outcomes)
    body = [h.meta({k: g.manifest.get(k) for k in ("backend", "date", "commit", "torch", "triton")}),
            h.verdict(not bad and bool(outcomes), f"{len(outcomes) - bad} of {len(outcomes)} golden cases identical "
                                                   "or within their bound")]
    rows = [[o.status, o.case.id, o.comparison, "; ".join(o.source_changed) or "-",
             "" if o.ok else f"{o.detail} | {golden.repro(key, o.case.id, dest)}"]
            for o in sorted(outcomes, key=lambda o: (o.ok, o.case.path, o.case.id))]
    body.append(h.table(["status", "case", "compared", "source changed", "detail / reproduce"], rows,
                        ["" if o.ok else "fail" for o in sorted(outcomes, key=lambda o: (o.ok, o.case.path, o.case.id))]))
    return h.page(f"pq2verify golden verify ({key})", body)


def _verify_model(dest, device, args) -> int:
    from . import golden, golden_model
    try:
        res = golden_model.verify_model(dest, device)
    except golden.NoCapture as e:
        return _missing_capture(print, e, args)
    except golden.GoldenIntegrityError as e:
        print(f"ERROR (integrity): {e}")
        return 1
    bad = [r for r in res if r[1] != "identical"]
    for key, status, detail in bad:
        print(f"FAIL {key}: {status} {detail}")
    print(f"{'PASS' if not bad else 'FAIL'}: {len(res) - len(bad)} of {len(res)} model projections identical")
    return 1 if bad else 0
