"""pq2verify golden capture | verify: frozen output bytes per backend (pq2verify.golden).

  ./pq2 golden capture [--kernels SET] [--paths a,b] [--backend auto] [--dir D] [--force] [--model]
  ./pq2 golden verify  [--kernels SET] [--paths a,b] [--backend auto] [--dir D] [--case ID] [--json F] [--html F] [--model]

A missing capture, a capture that lacks a case the code expects, and a run that verified nothing
are failures (exit 1); bad input, an option the mode cannot honour and a --dir that holds no
capture are usage errors (exit 2), refused before any work; an output file that cannot be written
after the verdict is printed is exit 3.
"""
import argparse
import json
import sys
from pathlib import Path

from . import cli, outputs
from .cli import UsageError, check_writable, nonempty


def register(sub):
    ap = sub.add_parser("golden", help="golden captured outputs: capture them, or verify them bit for bit")
    gs = ap.add_subparsers(dest="golden_command", required=True)
    for name, text in (("capture", "run the fixed cases of every path and record inputs and output bytes"),
                       ("verify", "recompute every captured case and require identical bytes")):
        p = gs.add_parser(name, help=text)
        p.add_argument("--kernels", default=None, type=nonempty,
                       help="only paths the set can serve: legacy, exact or tuned")
        cli.add_paths_option(p, help="comma-separated path names (default: all)")
        p.add_argument("--backend", default="auto", choices=("auto", "interpreter", "cuda"),
                       help="auto: the --device choice; interpreter: the CPU with TRITON_INTERPRET=1")
        p.add_argument("--dir", "--out", dest="dir", default=None, type=nonempty,
                       help="capture directory (default: golden/<backend key>, e.g. golden/sm90)")
        p.add_argument("--model", action="store_true",
                       help="the GSM8K model's PQ2 projections at decode positions 1, 32, 128 (needs pq2verify.gsm8k.model)")
        p.set_defaults(func=run)
    cap = gs.choices["capture"]
    cap.add_argument("--force", action="store_true", help="capture even cases whose numerics check fails")
    ver = gs.choices["verify"]
    ver.add_argument("--case", action="append", default=[], type=nonempty,
                     help="verify only this case id (repeatable; ids as --list-cases golden prints them)")
    cli.add_output(ver, "--json", help="write every outcome to this file")
    cli.add_output(ver, "--html", help="also write a self-contained HTML report (failures first)")
    # refused (see _check_args): a run that verified nothing is never a pass
    ver.add_argument("--allow-missing", action="store_true", help=argparse.SUPPRESS)
    ver.add_argument("--strict", action="store_true", help=argparse.SUPPRESS)   # the default now; kept for old scripts


def _select_backend(choice: str) -> str:
    from kernels import backend
    if choice == "auto":
        return backend.device()
    try:
        return backend.select("cpu" if choice == "interpreter" else "cuda")
    except (RuntimeError, ValueError) as e:
        raise UsageError(f"--backend {choice}: {e}") from None


# options that --model cannot honour: a model capture records every PQ2 projection of the model
_NOT_WITH_MODEL = (("paths", "--paths"), ("kernels", "--kernels"), ("case", "--case"), ("force", "--force"),
                   ("json", "--json"), ("html", "--html"))


def _check_args(args):
    if getattr(args, "allow_missing", False):
        raise UsageError("--allow-missing: refused; a missing capture verifies nothing, and a run that verified "
                         "nothing is a failure, never a skip that exits 0")
    if args.model:
        for attr, opt in _NOT_WITH_MODEL:
            if getattr(args, attr, None):
                raise UsageError(f"{opt}: not honoured with --model (a model capture holds every PQ2 projection "
                                 "of the model, verified as a whole)")
    cli.parse_paths(args.paths)
    if args.kernels is not None:
        from kernels.sets import check_name
        try:
            check_name(args.kernels, "--kernels ")
        except ValueError as e:
            raise UsageError(str(e)) from None
    return args.paths


def _no_capture_dir(d: Path, kind: str) -> None:
    """An explicit --dir must hold a capture: a typo is bad input, said as such, with what exists."""
    from . import golden
    if not (d / golden.MANIFEST).exists():
        raise UsageError(f"--dir {golden._no_capture(d, kind)}")


def _enclosing_capture(p) -> Path | None:
    """The nearest folder above p that holds a capture manifest, if any."""
    from . import golden
    for a in Path(p).resolve().parents:
        if (a / golden.MANIFEST).is_file():
            return a
    return None


def _not_inside_a_capture(opt: str, p, allowed: Path | None = None) -> None:
    """A file written inside a capture folder is one its manifest does not list, which breaks
    that capture (verify fails it): refused, except `allowed` (a case capture's model/)."""
    if p is None:
        return
    enc = _enclosing_capture(p)
    if enc is not None and (allowed is None or enc != Path(allowed).resolve()):
        raise UsageError(f"{opt} {p}: inside the golden capture {enc}, whose manifest would not list it; "
                         "choose a path outside it")


def _capture_target(d: Path, key: str, model: bool) -> None:
    """Refuse a capture that would merge into another backend's capture (or another kind of
    capture), land inside another capture, or scatter its files into a folder that holds other
    things."""
    from . import golden
    _not_inside_a_capture("--dir", d, allowed=d.parent if model and d.name == "model" else None)
    if (d / golden.MANIFEST).exists():
        try:
            man = json.loads((d / golden.MANIFEST).read_text())
            there, kind = man.get("backend_key"), man.get("kind", "cases")
        except (json.JSONDecodeError, AttributeError):
            return                                    # golden.capture reports the broken manifest
        if (kind == "model") != model:
            raise UsageError(f"--dir {d}: holds a {kind} capture; a {'model' if model else 'cases'} capture "
                             "needs its own folder")
        if there != key:
            raise UsageError(f"--dir {d}: holds the capture of backend {there!r}; this run is on {key!r}, and "
                             "merging would mix two backends' bits; choose another folder")
    elif model and d.name == "model" and (d.parent / golden.MANIFEST).is_file():
        try:
            there = json.loads((d.parent / golden.MANIFEST).read_text()).get("backend_key")
        except (json.JSONDecodeError, AttributeError):
            there = None
        if there != key:
            raise UsageError(f"--dir {d.parent}: holds the capture of backend {there!r}; this run is on {key!r}, "
                             "and its model/ must be that backend's; choose another folder")
    elif d.is_dir() and any(d.iterdir()):
        raise UsageError(f"--dir {d}: holds files and no {golden.MANIFEST}; a capture needs a new or empty folder")


def run(args) -> int:
    asked = _check_args(args)
    device = _select_backend(args.backend)
    from kernels import backend
    from . import golden
    names_ = [p.name for p in golden.select_paths(asked, args.kernels)]
    if not names_:      # an empty selection must not verify nothing (or everything) and pass
        raise UsageError(f"no path matches --kernels {args.kernels} --paths {','.join(asked or ())}")
    key = backend.golden_key()
    dest = Path(args.dir) if args.dir else golden.default_dir(key)
    target = dest / "model" if args.model else dest
    # every input and output before any work: a run must not be lost, or destroy its input, at its end
    if args.golden_command == "capture":
        check_writable(target, "--dir", directory=True, make_parents=True)
        _capture_target(target, key, args.model)
    else:
        if args.dir:
            _no_capture_dir(target, "model" if args.model else "cases")
        outs = cli.output_paths(args)
        outputs.check(outs, [("--dir", dest)])
        for opt, p in outs:
            _not_inside_a_capture(opt, p)
    if args.model:
        from . import golden_model
        try:
            if args.golden_command == "capture":
                golden_model.capture_model(target, device, model_runner())
                return 0
            return _verify_model(target, device, args, key)
        except golden_model.ModelRunnerMissing as e:
            raise UsageError(str(e)) from None
    if args.golden_command == "capture":
        return _capture(dest, key, names_, device, args)
    return _verify(dest, names_, device, args, key)


def model_runner():
    """The GSM8K app's model runner, which the model capture, verify and replay are given."""
    from .golden_model import CONTRACT, ModelRunnerMissing
    try:
        from .gsm8k import model
    except ModuleNotFoundError as e:
        if e.name not in ("pq2verify.gsm8k", "pq2verify.gsm8k.model"):
            raise
        raise ModelRunnerMissing("golden --model: the GSM8K model runner pq2verify.gsm8k.model is not there.\n"
                                 f"{CONTRACT}") from None
    return model


def _importable(names_):
    from . import registry
    ok, missing = [], []
    for n in names_:
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


def _capture(dest, key, names_, device, args) -> int:
    from . import golden
    ok, missing = _importable(names_)
    todo = golden.cases(key, ok)
    print(f"golden capture: {len(todo)} cases of {len(ok)} paths on {key} into {dest}", file=sys.stderr)
    try:
        man = golden.capture(dest, todo, device, force=args.force,
                             log=_progress)
    except golden.GoldenIntegrityError as e:
        print(f"\nERROR: the existing capture is broken, not merging into it: {e}\n"
              f"  reproduce: {_verify_repro(key, dest)}", file=sys.stderr)
        return 1
    print(file=sys.stderr)
    size = sum(f.stat().st_size for f in dest.iterdir() if f.is_file())
    captured = sorted({e["path"] for e in man["cases"]})
    print(f"captured: {len(man['cases'])} cases of {', '.join(captured) or 'no path'}; {size / 1e6:.2f} MB in {dest}")
    for r in man["refused"]:
        print(f"REFUSED {r['id']}: {r['why']}  (fix the kernel, or --force to capture anyway)\n"
              f"  reproduce: {golden.capture_hint(key, [r['id'].split(':', 1)[0]], dest)}")
    for m in missing:
        print(f"MISSING kernel {m}: not captured\n  reproduce: {golden.capture_hint(key, [m.split()[0]], dest)}")
    return 1 if man["refused"] or missing or not man["cases"] else 0


def _verify_repro(key, dest, model=False) -> str:
    from . import golden
    dest = Path(dest)
    if model and dest.name == "model":        # --dir names the folder that holds model/
        dest = dest.parent
    where = "" if golden._is_default(dest, key) else f" --dir {dest}"
    return f"./pq2 --device {golden._dev(key)} golden verify{' --model' if model else ''}{where}"


def _load(dest, args, key, kind, say):
    """(Golden, None) or (None, exit code) with the failure said: a missing default capture is a
    failure (exit 1), a damaged one an error (exit 1), another backend's a usage error."""
    from . import golden
    try:
        g = golden.load(dest, kind=kind)
        golden.check_backend(g)
        return g, None
    except golden.NoCapture as e:
        say(f"FAIL: {e}\n  nothing was verified; a missing capture is a failure{_first_steps(key, args)}\n"
            f"  reproduce: {_verify_repro(key, dest, kind == 'model')}")
        return None, 1
    except golden.OtherBackend as e:
        if args.dir:
            raise UsageError(f"--dir {e}") from None
        say(f"ERROR (integrity): {e}\n  reproduce: {_verify_repro(key, dest, kind == 'model')}")
        return None, 1
    except golden.GoldenIntegrityError as e:
        msg = str(e)
        if "reproduce:" not in msg:
            msg += f"\n  reproduce: {_verify_repro(key, dest, kind == 'model')}"
        say(f"ERROR (integrity): {msg}")
        return None, 1


def _first_steps(key, args) -> str:
    """For this backend's own capture folder: the steps that give a new backend its records."""
    from . import backend_status
    st = backend_status.status(key)
    if args.dir or not st["missing"]:
        return ""
    return (f"\n  first steps on a new backend ({st['doc']}): "
            + "; ".join(f"{i}. {s}" for i, s in enumerate(st["steps"], 1)))


def known_ids(g, key: str, names_) -> set[str]:
    """The case ids `--case` accepts for this selection: captured, or expected by the code (the
    ids `--list-cases golden` prints)."""
    from . import golden
    return {e["id"] for e in g.manifest["cases"] if e["path"] in names_} | {c.id for c in golden.cases(key, names_)}


def _verify(dest, names_, device, args, key) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from . import golden
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)   # logs: no squeezed table
    said = []
    g, rc = _load(dest, args, key, "cases", lambda m: (said.append(m), console.print(escape(m), soft_wrap=True)))
    if g is None:      # verified nothing: a failure, and the --json/--html say so too
        outputs.write_all([("--json", args.json, lambda: _json(None, [], key, dest, False, "\n".join(said))),
                           ("--html", args.html, lambda: _html(None, [], key, dest, "\n".join(said)))])
        return rc
    if g.manifest.get("kind") == "model":
        raise UsageError(f"--dir {dest}: holds a model capture; verify it with --model --dir {Path(dest).parent}")
    known = known_ids(g, key, names_)
    unknown = [i for i in args.case if i not in known]
    if unknown:
        anywhere = known_ids(g, key, [p.name for p in golden.select_paths()])
        why = ("outside the selected paths" if unknown[0] in anywhere
               else f"not a golden case of backend {key} (captured or expected)")
        raise UsageError(f"--case {unknown[0]!r}: {why}; ./pq2 --list-cases golden prints the ids")
    outcomes = golden.verify(g, device, paths=names_, ids=args.case or None)
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
            console.print(f"[red]FAIL[/] {escape(o.message())}\n"
                          f"  reproduce: {escape(golden.repro(key, o.case.id, dest))}", soft_wrap=True)
    n_bad = sum(not o.ok for o in outcomes)
    if not outcomes:
        console.print("[bold]FAIL[/]: no golden case was verified (nothing captured or expected for this selection)")
    else:
        console.print(f"[bold]{'PASS' if not n_bad else 'FAIL'}[/]: {len(outcomes) - n_bad} of {len(outcomes)} "
                      "golden cases identical or within their bound")
    ok = bool(outcomes) and not n_bad
    # the verdict is printed: a failed write below is exit 3 and loses nothing else
    outputs.write_all([("--json", args.json, lambda: _json(g, outcomes, key, dest, ok)),
                       ("--html", args.html, lambda: _html(g, outcomes, key, dest))])
    return 0 if ok else 1


def _json(g, outcomes, key, dest, ok, error=None) -> str:
    from . import golden, provenance
    return json.dumps({"provenance": provenance.collect(),
                       "manifest": g and {k: v for k, v in g.manifest.items() if k != "cases"}, "isa": golden.isa(),
                       **({"error": error} if error else {}),
                       "ok": ok, "complete": True, "verified": len(outcomes),
                       "failed": sum(not o.ok for o in outcomes),
                       "outcomes": [{"case": o.case.id, "status": o.status, "comparison": o.comparison,
                                     "detail": o.detail, "source_changed": o.source_changed,
                                     **({} if o.ok else {"reproduce": golden.repro(key, o.case.id, dest)})}
                                    for o in outcomes]}, indent=1) + "\n"


def _html(g, outcomes, key, dest, error=None) -> str:
    from . import backend_status, golden
    from .report import html as h
    bad = sum(not o.ok for o in outcomes)
    body = [h.meta({**{k: (g.manifest if g else {}).get(k) for k in ("backend", "date", "commit", "torch", "triton")},
                    "backend_status": backend_status.status(key)})] + ([h.pre(error)] if error else []) + [
            h.verdict(not bad and bool(outcomes), f"{len(outcomes) - bad} of {len(outcomes)} golden cases identical "
                                                   "or within their bound")]
    rows = [[o.status, o.case.id, o.comparison, "; ".join(o.source_changed) or "-",
             "" if o.ok else f"{o.detail} | {golden.repro(key, o.case.id, dest)}"]
            for o in sorted(outcomes, key=lambda o: (o.ok, o.case.path, o.case.id))]
    body.append(h.table(["status", "case", "compared", "source changed", "detail / reproduce"], rows,
                        ["" if o.ok else "fail" for o in sorted(outcomes, key=lambda o: (o.ok, o.case.path, o.case.id))]))
    return h.page(f"pq2verify golden verify ({key})", body)


def _verify_model(dest, device, args, key) -> int:
    from . import golden_model
    g, rc = _load(dest, args, key, "model", print)
    if g is None:
        return rc
    if g.manifest.get("kind") != "model":
        raise UsageError(f"--dir: {dest} holds a capture of cases, not of the model; verify it without --model")
    res = golden_model.verify_model(dest, device, model_runner())
    bad = [r for r in res if r[1] != "identical"]
    for k, status, detail in bad:
        print(f"FAIL {k}: {status} {detail}\n  reproduce: {_verify_repro(key, dest, True)}")
    if not res:
        print("FAIL: the model capture holds no projection call; nothing was verified")
        return 1
    print(f"{'PASS' if not bad else 'FAIL'}: {len(res) - len(bad)} of {len(res)} model projections identical")
    return 1 if bad else 0
