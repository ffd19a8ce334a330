"""pq2verify check: reference self-checks, then every registry path's numerics checks, as a
verdict table; non-zero exit on any failure, each with a one-line reproduction command."""
import json
import sys
import time

from rich.console import Console
from rich.table import Table


def register(sub):
    ap = sub.add_parser("check", help="numerics checks of every kernel path against FP64 references")
    ap.add_argument("--kernels", default=None, help="kernel set to check: legacy, exact or tuned (default: all paths)")
    ap.add_argument("--paths", default=None, help="comma-separated path names (default: all)")
    ap.add_argument("--shapes", default="auto", choices=("auto", "small", "bonsai27b"),
                    help="auto: bonsai27b on a GPU, small on the interpreter")
    ap.add_argument("--m", default=None, help="comma-separated M values (default: the shape set's)")
    ap.add_argument("--dtype", default=None, help="bf16, fp16 or both (default)")
    ap.add_argument("--layout", default=None, help="raw, prepared or dense (default: each path's)")
    ap.add_argument("--case", action="append", default=[], help="run exactly this case id (repeatable)")
    ap.add_argument("--reruns", type=int, default=5, help="determinism reruns per case (default 5)")
    ap.add_argument("--json", default=None, help="write all results (with provenance) to this file")
    ap.add_argument("--derive-exact", action="store_true",
                    help="test each tuned path's bit-identity to its legacy counterpart and record which hold")
    ap.add_argument("--skip-selfcheck", action="store_true", help="skip the reference self-checks")
    ap.add_argument("--markdown", default=None, help="also write the table as Markdown to this file")
    ap.add_argument("--render", nargs="+", default=None, metavar="JSON",
                    help="render saved --json results (e.g. from a GPU run) as Markdown to --markdown; runs nothing")
    ap.set_defaults(func=run)


def markdown(results: list[dict], prov: list[dict], note: str = "") -> str:
    """A per-path summary and the results table from to_json() rows, with the provenance of
    each run they came from."""
    lines = ["# pq2verify check", ""]
    for p in prov:
        lines.append("- " + ", ".join(f"{k}: {v}" for k, v in p.items()))
    n_ok = sum(r["ok"] for r in results)
    lines += ["", f"**{n_ok} of {len(results)} cases passed.**"] + ([note] if note else []) + [""]
    lines += summary(results) + ["",
              "| path | shape | M | dtype | layout | input | relRMS quantized (tol) | relRMS dense (tol) "
              "| dots exact | claim | deterministic | written | verdict |", "|" + "---|" * 13]

    def f(v, t):
        return "-" if v is None else f"{v:.2e} ({t:.0e})"

    def b(v):
        return "-" if v is None else ("yes" if v else "**NO**")
    for r in results:
        claim = "-" if r["claim_held"] is None else f"{r['claim']}: {b(r['claim_held'])}"
        lines.append(f"| {r['path']} | {r['shape']} {r['n']}x{r['k']} | {r['m']} | {r['dtype']} | {r['layout']} "
                     f"| {r['kind']}{' strided' if r['strided'] else ''} "
                     f"| {f(r['rel_rms_quantized'], r['tol_quantized'])} | {f(r['rel_rms_dense'], r['tol_dense'])} "
                     f"| {b(r['dots_exact'])} | {claim} | {b(r['deterministic'])} | {b(r['written'])} "
                     f"| {'PASS' if r['ok'] else '**FAIL** ' + '; '.join(r['failures'])} |")
    return "\n".join(lines) + "\n"


def summary(results: list[dict]) -> list[str]:
    """One row per path: cases, worst relative RMS, and how many held each property."""
    lines = ["| path | cases | pass | max relRMS vs quantized FP64 | max vs dense FP64 | dots exact | claim held "
             "| deterministic | written |", "|" + "---|" * 9]
    by = {}
    for r in results:
        by.setdefault(r["path"], []).append(r)

    def mx(rs, k):
        v = [r[k] for r in rs if r[k] is not None]
        return f"{max(v):.2e}" if v else "-"

    def held(rs, k):
        v = [r[k] for r in rs if r[k] is not None]
        return f"{sum(v)}/{len(v)}" if v else "-"
    for path, rs in by.items():
        lines.append(f"| {path} | {len(rs)} | {sum(r['ok'] for r in rs)} | {mx(rs, 'rel_rms_quantized')} "
                     f"| {mx(rs, 'rel_rms_dense')} | {held(rs, 'dots_exact')} | {held(rs, 'claim_held')} "
                     f"| {held(rs, 'deterministic')} | {held(rs, 'written')} |")
    return lines


def render(args) -> int:
    by_id, prov, again = {}, [], 0
    for fn in args.render:
        with open(fn) as fh:
            d = json.load(fh)
        for r in d["cases"]:
            again += r["case"] in by_id
            by_id[r["case"]] = r          # a case run again in a later file: the later result
        prov.append(d["provenance"])
    results = list(by_id.values())
    note = (f"{again} case(s) ran in more than one of these runs; the table shows each case once, "
            "from the latest run." if again else "")
    text = markdown(results, prov, note)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(text)
    else:
        print(text)
    return 0 if all(r["ok"] for r in results) else 1


def _csv(s):
    return None if s is None else [v.strip() for v in s.split(",") if v.strip()]


def _fmt(v, tol=None):
    if v is None:
        return "-"
    s = f"{v:.1e}"
    return s if tol is None else f"{s}/{tol:.0e}" if v <= tol else f"[red]{s}>{tol:.0e}[/]"


def _mark(b):
    return "-" if b is None else ("yes" if b else "[red]NO[/]")


def run(args) -> int:
    if args.render:
        return render(args)
    from . import backend, checks, provenance, selfcheck
    console = Console(highlight=False, width=max(Console().width, 190))
    dev = backend.device()
    shapes = args.shapes if args.shapes != "auto" else ("bonsai27b" if dev == "cuda" else "small")
    if args.derive_exact:
        from .derive import derive_exact
        return derive_exact(shapes, dev, console)
    prov = provenance.collect()
    console.print(f"[bold]pq2verify check[/] backend={prov['backend']} shapes={shapes} "
                  f"torch={prov['torch']} triton={prov['triton']} commit={prov['commit']}")
    ok_all = True
    out = {"provenance": prov, "selfcheck": [], "cases": []}
    if not args.skip_selfcheck and not args.case:
        t = Table(title="reference self-checks")
        for col in ("check", "result", "detail"):
            t.add_column(col)
        for name, ok, detail in selfcheck.run_all():
            ok_all &= ok
            t.add_row(name, "PASS" if ok else "[red]FAIL[/]", detail)
            out["selfcheck"].append({"check": name, "ok": ok, "detail": detail})
        console.print(t)
    if args.case:
        todo = [checks.Case.parse(s) for s in args.case]
    else:
        ms = [int(v) for v in _csv(args.m)] if args.m else None
        todo = checks.cases(shapes, paths=_csv(args.paths), kset=args.kernels, ms=ms,
                            dtypes=_csv(args.dtype), layouts=_csv(args.layout))
    table = Table(title=f"kernel paths ({len(todo)} cases)")
    for col in ("path", "shape", "M", "dtype", "layout", "input", "relRMS/tol quantized",
                "relRMS/tol dense", "dots exact", "claim held", "determ.", "written", "verdict"):
        table.add_column(col, no_wrap=True)
    failures = []
    t0 = time.time()
    for i, c in enumerate(todo):
        try:
            r = checks.evaluate(c, dev, reruns=args.reruns)
        except Exception as e:  # a crash is a failure of that case, never of the whole table
            r = checks.Result(c)
            r.fail(f"raised {type(e).__name__}: {e}")
        claim = "-" if r.claim_held is None else f"{r.claim}: {_mark(r.claim_held)}"
        table.add_row(c.path, f"{c.shape} {c.n}x{c.k}", str(c.m), c.dtype, c.layout,
                      c.kind + (" strided" if c.strided else ""),
                      _fmt(r.rel_rms_quantized, r.tol_quantized), _fmt(r.rel_rms_dense, r.tol_dense),
                      _mark(r.dots_exact), claim, _mark(r.deterministic), _mark(r.written),
                      "PASS" if r.ok else "[red bold]FAIL[/]")
        out["cases"].append(r.to_json())
        if not r.ok:
            failures.append(r)
        if args.json:  # written as it goes: a crash keeps what was measured
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1, default=str)
        print(f"\r[{i + 1}/{len(todo)}] {time.time() - t0:.0f}s {c.id[:70]:70s}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    console.print(table)
    ok_all &= not failures
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(markdown(out["cases"], [prov]))
    for r in failures:
        console.print(f"[red]FAIL[/] {r.message()}", soft_wrap=True)
    n_pass = len(todo) - len(failures)
    console.print(f"[bold]{'PASS' if ok_all else 'FAIL'}[/]: {n_pass} of {len(todo)} cases passed "
                  f"in {time.time() - t0:.0f}s on {prov['backend']}")
    return 0 if ok_all else 1
