"""pq2verify golden capture | verify: frozen output bytes per backend (pq2verify.golden).

  pq2verify golden capture [--kernels SET] [--paths a,b] [--backend auto] [--force] [--model]
  pq2verify golden verify  [--kernels SET] [--paths a,b] [--backend auto] [--case ID] [--json F] [--strict] [--model]
"""
import json
import sys
from pathlib import Path

from .cli import UsageError


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
    ver.add_argument("--strict", action="store_true", help="a missing capture is a failure, not a skip")


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
    if args.kernels is not None and args.kernels not in registry.KERNEL_SETS:
        raise UsageError(f"--kernels: {args.kernels!r} is not a kernel set; expected one of "
                         f"{', '.join(registry.KERNEL_SETS)}")
    return names


def run(args) -> int:
    names = _check_args(args)
    device = _select_backend(args.backend)
    from . import backend, golden
    names = [p.name for p in golden.select_paths(names, args.kernels)]
    key = backend.golden_key()
    dest = Path(args.dir) if args.dir else golden.default_dir(key)
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


def _verify(dest, names, device, args) -> int:
    from rich.console import Console
    from rich.table import Table

    from . import golden
    console = Console(highlight=False)
    try:
        g = golden.load(dest)
        outcomes = golden.verify(g, device, paths=names, ids=args.case or None)
    except golden.NoCapture as e:
        console.print(f"SKIP: {e}")
        return 1 if args.strict else 0
    except golden.GoldenIntegrityError as e:
        console.print(f"[red bold]ERROR[/] (integrity): {e}")
        return 1
    table = Table(title=f"golden {dest} (captured {g.manifest.get('date', '?')} on {g.manifest.get('backend', '?')}, "
                        f"commit {g.manifest.get('commit', '?')})")
    for col in ("path", "cases", "identical", "different", "errors", "source since capture", "verdict"):
        table.add_column(col)
    by_path = {}
    for o in outcomes:
        by_path.setdefault(o.case.path, []).append(o)
    for path, os_ in by_path.items():
        bad = [o for o in os_ if not o.ok]
        src = ", ".join(os_[0].source_changed) or "unchanged"
        table.add_row(path, str(len(os_)), str(sum(o.ok for o in os_)),
                      str(sum(o.status == "different" for o in os_)), str(sum(o.status == "error" for o in os_)),
                      src, "[red bold]FAIL[/]" if bad else "PASS")
    console.print(table)
    for path, os_ in by_path.items():
        if os_[0].source_changed and all(o.ok for o in os_):
            console.print(f"[yellow]{path}: source changed, output identical[/] ({', '.join(os_[0].source_changed)})")
    for o in outcomes:
        if not o.ok:
            console.print(f"[red]FAIL[/] {o.message()}\n  reproduce: pq2verify golden verify --case '{o.case.id}'",
                          soft_wrap=True)
    uncaptured = sorted(set(names) - {e["path"] for e in g.manifest["cases"]})
    if uncaptured:
        console.print(f"not captured on this backend: {', '.join(uncaptured)} (capture with "
                      f"pq2verify golden capture --paths {','.join(uncaptured)})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"manifest": {k: v for k, v in g.manifest.items() if k != "cases"},
                       "outcomes": [{"case": o.case.id, "status": o.status, "detail": o.detail,
                                     "source_changed": o.source_changed} for o in outcomes]}, f, indent=1)
    n_bad = sum(not o.ok for o in outcomes)
    console.print(f"[bold]{'PASS' if not n_bad else 'FAIL'}[/]: {len(outcomes) - n_bad} of {len(outcomes)} "
                  "golden cases identical")
    return 1 if n_bad else 0


def _verify_model(dest, device, args) -> int:
    from . import golden, golden_model
    try:
        res = golden_model.verify_model(dest, device)
    except golden.NoCapture as e:
        print(f"SKIP: {e}")
        return 1 if args.strict else 0
    except golden.GoldenIntegrityError as e:
        print(f"ERROR (integrity): {e}")
        return 1
    bad = [r for r in res if r[1] != "identical"]
    for key, status, detail in bad:
        print(f"FAIL {key}: {status} {detail}")
    print(f"{'PASS' if not bad else 'FAIL'}: {len(res) - len(bad)} of {len(res)} model projections identical")
    return 1 if bad else 0
