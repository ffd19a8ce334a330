"""pq2verify check: reference self-checks, then every registry path's numerics checks, as a
verdict table; non-zero exit on any failure, each with a one-line reproduction command."""
import argparse
import json
import time

from rich import box
from rich.console import Console
from rich.table import Table

from .cli import UsageError, check_writable, positive_int, positive_ints
from .progress import Progress


def register(sub):
    ap = sub.add_parser("check", help="numerics checks of every kernel path against FP64 references")
    ap.add_argument("--kernels", default=None, help="kernel set to check: legacy, exact or tuned (default: all paths)")
    ap.add_argument("--paths", default=None, help="comma-separated path names (default: all)")
    ap.add_argument("--shapes", default="auto", choices=("auto", "small", "bonsai27b"),
                    help="auto: bonsai27b on a GPU, small on the interpreter")
    ap.add_argument("--m", default=None, type=positive_ints, help="comma-separated M values (default: the shape set's)")
    ap.add_argument("--dtype", default=None, help="bf16, fp16 or both (default)")
    ap.add_argument("--layout", default=None, help="raw, prepared or dense (default: each path's)")
    ap.add_argument("--case", action="append", default=[], help="run exactly this case id (repeatable)")
    ap.add_argument("--reruns", type=positive_int, default=5, help="determinism reruns per case (default 5)")
    ap.add_argument("--json", default=None, help="write all results (with provenance) to this file")
    ap.add_argument("--derive-exact", action="store_true",
                    help="test each tuned path's bit-identity to its legacy counterpart (all tuned paths, "
                         "or --paths); prints the verdict, and writes it to --json if given")
    ap.add_argument("--record", action="store_true",
                    help="with --derive-exact: write the verdict to pq2verify/verified/exact-<backend>.json, "
                         "which the exact set reads (with --paths: replace only those entries)")
    ap.add_argument("--skip-selfcheck", action="store_true", help="skip the reference self-checks")
    ap.add_argument("--markdown", default=None, help="also write the table as Markdown to this file")
    ap.add_argument("--html", default=None, help="also write a self-contained HTML report (worst cases first)")
    ap.add_argument("--shard", default=None, type=shard_spec, metavar="I/N",
                    help="run only shard I of N (1-based) of the selected cases, e.g. one GPU each; "
                         "`--render` of the shards' --json gives the whole table")
    ap.add_argument("--render", nargs="+", default=None, metavar="JSON",
                    help="render saved --json results (e.g. from a GPU run) as Markdown to --markdown; runs nothing")
    ap.set_defaults(func=run)


def shard_spec(s: str) -> tuple[int, int]:
    """'I/N' with 1 <= I <= N."""
    try:
        i, n = (int(v) for v in s.split("/"))
    except ValueError:
        i = n = 0
    if not 1 <= i <= n:
        raise argparse.ArgumentTypeError(f"expected I/N with 1 <= I <= N, got {s!r}")
    return i, n


def shard(todo: list, spec) -> list:
    """Shard I of N: cases I-1, I-1+N, ... of the selection (interleaved, so each shard gets
    every path and shape); the N shards together are the selection, each case once."""
    if spec is None:
        return todo
    i, n = spec
    return todo[i - 1::n]


def worst_first(results: list[dict]) -> list[dict]:
    """Failures first, then by how close each case came to its bounds."""
    def closeness(r):
        ratios = [r.get("elem_ratio") or 0.0]
        for w in ("quantized", "dense"):
            if r.get(f"rel_rms_{w}") is not None and r.get(f"tol_{w}"):
                ratios.append(r[f"rel_rms_{w}"] / r[f"tol_{w}"])
        return max(ratios)
    return sorted(results, key=lambda r: (r["ok"], -closeness(r)))


def html(results: list[dict], prov: list[dict], note: str = "") -> str:
    from . import html_report as h
    n_ok = sum(r["ok"] for r in results)
    body = [h.meta(p) for p in prov]
    body.append(h.verdict(n_ok == len(results), f"{n_ok} of {len(results)} cases passed"))
    if note:
        body.append(f"<p>{h.esc(note)}</p>")
    body.append("<h2>Per path</h2>")
    head, *rows = [line.strip("|").split("|") for line in summary(results) if not line.startswith("|---")]
    body.append(h.table([c.strip() for c in head], [[c.strip() for c in r] for r in rows]))
    body.append("<h2>Cases, worst first</h2>")
    cols = ("verdict", "case", "relRMS q (tol)", "relRMS d (tol)", "elem/bound", "max ulp", "dots", "claim",
            "determ.", "written", "guards", "batch", "NaN", "failures / reproduce")

    def f(v, t=None):
        return "-" if v is None else (f"{v:.2e}" if t is None else f"{v:.2e} ({t:.0e})")

    def b(v):
        return "-" if v is None else ("yes" if v else "NO")
    rows, cls = [], []
    for r in worst_first(results):
        claim = "-" if r["claim_held"] is None else f"{r['claim']}: {b(r['claim_held'])}"
        rows.append(["PASS" if r["ok"] else "FAIL", r["case"], f(r["rel_rms_quantized"], r["tol_quantized"]),
                     f(r["rel_rms_dense"], r["tol_dense"]), f(r.get("elem_ratio")), r.get("max_ulp", "-"),
                     b(r["dots_exact"]), claim, b(r["deterministic"]), b(r["written"]), b(r.get("guards_intact")),
                     b(r.get("batch_invariant")), b(r.get("nan_exact")),
                     "" if r["ok"] else "; ".join(r["failures"]) + " | " + r["repro"]])
        cls.append("" if r["ok"] else "fail")
    body.append(h.table(list(cols), rows, cls))
    return h.page("pq2verify check", body)


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
              "| elem/bound | max ulp | dots exact | claim | deterministic | written | guards | batch | NaN "
              "| verdict |", "|" + "---|" * 18]

    def f(v, t):
        return "-" if v is None else f"{v:.2e} ({t:.0e})"

    def b(v):
        return "-" if v is None else ("yes" if v else "**NO**")
    for r in results:
        claim = "-" if r["claim_held"] is None else f"{r['claim']}: {b(r['claim_held'])}"
        lines.append(f"| {r['path']} | {r['shape']} {r['n']}x{r['k']} | {r['m']} | {r['dtype']} | {r['layout']} "
                     f"| {r['kind']}{' strided' if r['strided'] else ''} "
                     f"| {f(r['rel_rms_quantized'], r['tol_quantized'])} | {f(r['rel_rms_dense'], r['tol_dense'])} "
                     f"| {'-' if r.get('elem_ratio') is None else format(r['elem_ratio'], '.3f')} "
                     f"| {r.get('max_ulp', '-') if r.get('max_ulp') is not None else '-'} "
                     f"| {b(r['dots_exact'])} | {claim} | {b(r['deterministic'])} | {b(r['written'])} "
                     f"| {b(r.get('guards_intact'))} | {b(r.get('batch_invariant'))} | {b(r.get('nan_exact'))} "
                     f"| {'PASS' if r['ok'] else '**FAIL** ' + '; '.join(r['failures'])} |")
    return "\n".join(lines) + "\n"


def summary(results: list[dict]) -> list[str]:
    """One row per path: cases, worst relative RMS, and how many held each property."""
    lines = ["| path | cases | pass | max relRMS vs quantized FP64 | max vs dense FP64 | max elem/bound | max ulp "
             "| dots exact | claim held | deterministic | written | guards intact | batch invariant | NaN exact |",
             "|" + "---|" * 14]
    by = {}
    for r in results:
        by.setdefault(r["path"], []).append(r)

    def mx(rs, k, fmt="{:.2e}"):
        v = [r.get(k) for r in rs if r.get(k) is not None]
        return fmt.format(max(v)) if v else "-"

    def held(rs, k):
        v = [r.get(k) for r in rs if r.get(k) is not None]
        return f"{sum(v)}/{len(v)}" if v else "-"
    for path, rs in by.items():
        lines.append(f"| {path} | {len(rs)} | {sum(r['ok'] for r in rs)} | {mx(rs, 'rel_rms_quantized')} "
                     f"| {mx(rs, 'rel_rms_dense')} | {mx(rs, 'elem_ratio', '{:.3f}')} | {mx(rs, 'max_ulp', '{}')} "
                     f"| {held(rs, 'dots_exact')} | {held(rs, 'claim_held')} "
                     f"| {held(rs, 'deterministic')} | {held(rs, 'written')} | {held(rs, 'guards_intact')} "
                     f"| {held(rs, 'batch_invariant')} | {held(rs, 'nan_exact')} |")
    return lines


def render(args) -> int:
    by_id, prov, again = {}, [], 0
    for fn in args.render:
        try:
            with open(fn) as fh:
                d = json.load(fh)
        except OSError as e:
            raise UsageError(f"--render {fn}: cannot read it: {e.strerror or e}") from None
        except ValueError as e:     # json.JSONDecodeError, a UnicodeDecodeError
            raise UsageError(f"--render {fn}: not a JSON file ({e})") from None
        if not isinstance(d, dict) or not {"cases", "provenance"} <= d.keys():
            raise UsageError(f"--render {fn}: not a `check --json` file (no 'cases' and 'provenance')")
        for r in d["cases"]:
            again += r["case"] in by_id
            by_id[r["case"]] = r          # a case run again in a later file: the later result
        prov.append(d["provenance"])
    results = list(by_id.values())
    note = (f"{again} case(s) ran in more than one of these runs; the table shows each case once, "
            "from the latest run." if again else "")
    text = markdown(results, prov, note)
    if args.html:
        with open(args.html, "w") as fh:
            fh.write(html(results, prov, note))
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


def _flags(r) -> str:
    """One letter per property: lower case held, upper case (red) failed, '.' not applicable."""
    out = ""
    for letter, v in (("d", r.dots_exact), ("c", r.claim_held), ("r", r.deterministic), ("w", r.written),
                      ("g", r.guards_intact), ("b", r.batch_invariant), ("n", r.nan_exact)):
        out += "." if v is None else letter if v else f"[red]{letter.upper()}[/]"
    return out


def _filters(args) -> list[str]:
    """The case filters given on the command line, as typed."""
    m = None if args.m is None else ",".join(map(str, args.m))
    return [f"{o} {v}" for o, v in (("--kernels", args.kernels), ("--paths", args.paths), ("--m", m),
                                    ("--dtype", args.dtype), ("--layout", args.layout)) if v is not None]


def select(args, shapes: str) -> list:
    """The cases to run; a filter that is unknown or selects nothing is a usage error (an empty
    selection would otherwise read PASS: 0 of 0)."""
    from . import backend, cases, registry
    if args.case:
        if _filters(args):
            raise UsageError("--case runs exactly the cases named; it does not combine with "
                             + ", ".join(_filters(args)))
        try:
            return [cases.Case.parse(s) for s in args.case]
        except ValueError as e:
            raise UsageError(str(e)) from None
    try:
        todo = cases.check_cases(shapes, paths=_csv(args.paths), kset=args.kernels, ms=args.m,
                                 dtypes=_csv(args.dtype), layouts=_csv(args.layout), key=backend.golden_key())
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not todo:
        sel = [registry.get(n) for n in _csv(args.paths) or registry.BY_NAME]
        raise UsageError(f"no case matches {' '.join(_filters(args))} (shapes {shapes}); the paths: " + "; ".join(
            f"{p.name} in the {p.kset} set, M {p.m_range()}, layouts {'/'.join(p.layouts)}" for p in sel))
    return todo


def _derive(args, shapes: str, dev, console) -> int:
    from . import derive
    other = [f for f in _filters(args) if not f.startswith("--paths")]
    other += [o for o, v in (("--case", args.case), ("--markdown", args.markdown)) if v]
    if other:
        raise UsageError(f"--derive-exact tests every case of each tuned path (all, or those in --paths); "
                         f"it does not take {', '.join(other)}")
    try:
        paths = derive.tuned_paths(_csv(args.paths))
    except ValueError as e:
        raise UsageError(str(e)) from None
    return derive.derive_exact(shapes, dev, console, paths=paths, record=args.record, json_out=args.json)


def run(args) -> int:
    for opt, fn in (("--json", args.json), ("--markdown", args.markdown), ("--html", args.html)):
        if fn:
            check_writable(fn, opt)        # before the work, not after it
    if args.record and not args.derive_exact:
        raise UsageError("--record goes with --derive-exact")
    if args.render:
        return render(args)
    from . import backend, checks, provenance, selfcheck
    console = Console(highlight=False, width=100)
    dev = backend.device()
    shapes = args.shapes if args.shapes != "auto" else ("bonsai27b" if dev == "cuda" else "small")
    if args.derive_exact:
        return _derive(args, shapes, dev, console)
    todo = shard(select(args, shapes), args.shard)
    if not todo:
        raise UsageError(f"--shard {args.shard[0]}/{args.shard[1]}: no case left in this shard")
    prov = provenance.collect()
    if args.shard:
        prov["shard"] = f"{args.shard[0]}/{args.shard[1]}"
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
    # the console table fits 100 columns; every figure is in --json, --markdown and --html
    table = Table(title=f"kernel paths ({len(todo)} cases)", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("path", "shape", "M", "dtype", "layout", "input", "relRMS/tol", "elem", "checks", "verdict"):
        table.add_column(col, no_wrap=True)
    failures = []
    t0 = time.time()
    progress = Progress(len(todo))
    for i, c in enumerate(todo):
        try:
            r = checks.evaluate(c, dev, reruns=args.reruns)
        except Exception as e:  # a crash is a failure of that case, never of the whole table
            r = checks.Result(c)
            r.fail(f"raised {type(e).__name__}: {e}")
        rel, tol = ((r.rel_rms_quantized, r.tol_quantized) if r.rel_rms_quantized is not None
                    else (r.rel_rms_dense, r.tol_dense))
        table.add_row(c.path, c.shape, str(c.m), c.dtype, c.layout[:4], c.kind[:8] + ("/s" if c.strided else ""),
                      _fmt(rel, tol), "-" if r.elem_ratio is None else f"{r.elem_ratio:.2f}", _flags(r),
                      "PASS" if r.ok else "[red bold]FAIL[/]")
        out["cases"].append(r.to_json())
        if not r.ok:
            failures.append(r)
        if args.json:  # written as it goes: a crash keeps what was measured
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1, default=str)
        progress.update(i + 1, c.id[:60])
    progress.close()
    console.print(table)
    console.print("checks: d dots exact, c claim held, r reruns identical, w written, g guard bands intact, "
                  "b batch invariant, n NaN exact (upper case: failed, '.': not applicable)")
    ok_all &= not failures
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(markdown(out["cases"], [prov]))
    if args.html:
        with open(args.html, "w") as fh:
            fh.write(html(out["cases"], [prov]))
    for r in failures:
        console.print(f"[red]FAIL[/] {r.message()}", soft_wrap=True)
    n_pass = len(todo) - len(failures)
    console.print(f"[bold]{'PASS' if ok_all else 'FAIL'}[/]: {n_pass} of {len(todo)} cases passed "
                  f"in {time.time() - t0:.0f}s on {prov['backend']}")
    return 0 if ok_all else 1
