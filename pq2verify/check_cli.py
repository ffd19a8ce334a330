"""pq2verify check: reference self-checks, then every registry path's numerics checks, as a
verdict table; non-zero exit on any failure, each with a one-line reproduction command.

`--json` is rewritten after every case and ends with a completion record, so an interrupted
run's file says it is incomplete; `--render` of several files is green only for one whole
selection: every file complete, every shard present once, every reference self-check passed."""
import argparse
import hashlib
import json
import os
import sys
import time

from rich import box
from rich.console import Console
from rich.table import Table

from . import cli, outputs
from .cli import UsageError, check_writable, names, nonempty, positive_int, positive_ints  # noqa: F401
from .report.progress import Progress

FORMAT = "pq2verify-check/2"
RERUNS = 5
DESCRIPTION = """\
Numerics checks of every kernel path against FP64 references: first the reference's own
self-checks, then per (path, shape, M, dtype, layout) relative RMS against the quantized and the
dense reference, a per-element bound, exact integer group dots, exactness claims, determinism
over reruns, every output written, no write outside out/dots, batch invariance and NaN
propagation. Each failure prints a one-line command that reproduces it.

Three modes: a run (the default; filters select cases), --derive-exact (which tuned paths are
bit-identical to their legacy counterparts) and --render (saved --json files as one table; runs
nothing). An option a mode cannot honour is refused."""


def _epilog() -> str:
    codes = "\n".join(f"  {k:<4}{v}" for k, v in outputs.EXIT_CODES.items())
    return f"""\
exit codes:
{codes}
  --render exits 1 also when the files are not one complete run: a file of an interrupted run,
  a missing or repeated shard, shards of different selections, or self-checks failed or skipped.

output files: --json is rewritten after each case (an interrupted run keeps what it measured
and says it is incomplete); two outputs on one file, or an output on a --render input, are
refused before any work.

examples:
  ./pq2 check                              everything, on this machine's default shapes
  ./pq2 --device cpu check --paths native --m 1,17 --json r.json
  ./pq2 check --case native:a=200x640:m1:bf16:prepared:normal:seed4640
  ./pq2 check --shard 1/2 --json s1.json   on one GPU, --shard 2/2 --json s2.json on another, then
  ./pq2 check --render s1.json s2.json --markdown table.md --html table.html"""


def register(sub):
    ap = sub.add_parser("check", help="numerics checks of every kernel path against FP64 references",
                        description=DESCRIPTION, epilog=_epilog(),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", default=None, type=nonempty,
                    help="kernel set to check: legacy, exact or tuned (default: all paths)")
    cli.add_paths_option(ap, help="comma-separated path names (default: all)")
    ap.add_argument("--shapes", default="auto", choices=("auto", "small", "bonsai27b"),
                    help="auto: bonsai27b on a GPU, small on the interpreter")
    ap.add_argument("--allow-slow", action="store_true",
                    help="run --shapes bonsai27b on the interpreter anyway (hours; refused without it)")
    cli.add_m_option(ap, help="comma-separated M values (default: the shape set's)")
    ap.add_argument("--dtype", default=None, type=names, help="bf16, fp16 or both (default)")
    ap.add_argument("--layout", default=None, type=names, help="raw, prepared or dense (default: each path's)")
    ap.add_argument("--case", action="append", default=[], type=nonempty,
                    help="run exactly this case id (repeatable); the ids of --list-cases check, golden, "
                         "bench and selftest all run here")
    ap.add_argument("--reruns", type=positive_int, default=None,
                    help=f"determinism reruns per case (default {RERUNS})")
    cli.add_output(ap, "--json",
                   help="write all results (with provenance, the selection, the self-checks and whether "
                         "the run completed) to this file, rewritten after each case")
    ap.add_argument("--derive-exact", action="store_true",
                    help="test each tuned path's bit-identity to its legacy counterpart (all tuned paths, "
                         "or --paths); prints the verdict, and writes it to --json if given")
    ap.add_argument("--record", action="store_true",
                    help="with --derive-exact: write the verdict to pq2verify/verified/exact-<backend>.json, "
                         "which the exact set reads (with --paths: replace only those entries)")
    ap.add_argument("--skip-selfcheck", action="store_true",
                    help="skip the reference self-checks (the --json says so; its --render is not green)")
    cli.add_output(ap, "--markdown", help="also write the table as Markdown to this file")
    cli.add_output(ap, "--html", help="also write a self-contained HTML report (worst cases first)")
    ap.add_argument("--shard", default=None, type=shard_spec, metavar="I/N",
                    help="run only shard I of N (1-based) of the selected cases, e.g. one GPU each; "
                         "`--render` of all N shards' --json gives the whole table")
    ap.add_argument("--render", nargs="+", default=None, metavar="JSON",
                    help="render saved --json results (e.g. from a GPU run) as Markdown to --markdown "
                         "(else stdout) and --html; runs nothing")
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


def _failed(r: dict) -> list[str]:
    """The names of the checks a result row failed (its 'failed' list; rows of older files: from
    its fields)."""
    if r.get("failed") is not None:
        return list(dict.fromkeys(r["failed"]))
    out = [n for n, k in (("rms quantized", "rel_rms_quantized"), ("rms dense", "rel_rms_dense"))
           if r.get(k) is not None and r.get(k.replace("rel_rms", "tol")) is not None
           and not r[k] <= r[k.replace("rel_rms", "tol")]]
    out += ["per-element"] if r.get("elem_ratio") is not None and not r["elem_ratio"] <= 1.0 else []
    out += [n for n, k in (("dots", "dots_exact"), ("exactness claim", "claim_held"), ("determinism", "deterministic"),
                           ("written", "written"), ("guard band", "guards_intact"),
                           ("batch invariance", "batch_invariant"), ("nan propagation", "nan_exact"))
            if r.get(k) is False]
    return out or (["error"] if not r["ok"] else [])


# each result field, the check it belongs to: a failed check highlights its own figure
_FIELD_CHECK = {"rel_rms_quantized": "rms quantized", "rel_rms_dense": "rms dense", "elem_ratio": "per-element",
                "max_ulp": "per-element", "dots_exact": "dots", "claim_held": "exactness claim",
                "deterministic": "determinism", "written": "written", "guards_intact": "guard band",
                "batch_invariant": "batch invariance", "nan_exact": "nan propagation"}


def case_table(results: list[dict], maps: dict | None = None):
    """The per-case table model (report.table) of to_json() rows: the figure of each failed check
    highlighted, the checks that failed named, the repro command in its own cell."""
    from .report.table import Cell, Table, code
    maps = maps or {}
    cols = ("verdict", "path", "shape", "M", "dtype", "layout", "input", "relRMS q (tol)", "relRMS d (tol)",
            "elem/bound", "max ulp", "dots", "claim", "determ.", "written", "guards", "batch", "NaN",
            "failed checks", "reproduce") + (("error map",) if maps else ())
    t = Table(cols, title="cases, worst first")
    for r in worst_first(results):
        bad = set(_failed(r))

        def c(key, text):
            return Cell(text, bad=_FIELD_CHECK[key] in bad)

        def f(key, tol=None):
            v = r.get(key)
            return c(key, "-" if v is None else (f"{v:.2e}" if tol is None else f"{v:.2e} ({r.get(tol):.0e})"))

        def b(key):
            v = r.get(key)
            return c(key, "-" if v is None else ("yes" if v else "NO"))
        claim = "-" if r.get("claim_held") is None else f"{r['claim']}: {'yes' if r['claim_held'] else 'NO'}"
        er = r.get("elem_ratio")
        t.add(Cell("PASS" if r["ok"] else "FAIL", bad=not r["ok"]), r["path"], f"{r['shape']} {r['n']}x{r['k']}",
              r["m"], r["dtype"], r["layout"], r["kind"] + (" strided" if r["strided"] else ""),
              f("rel_rms_quantized", "tol_quantized"), f("rel_rms_dense", "tol_dense"),
              c("elem_ratio", "-" if er is None else f"{er:.3f}"), c("max_ulp", str(r.get("max_ulp", "-") if
                                                                         r.get("max_ulp") is not None else "-")),
              b("dots_exact"), c("claim_held", claim), b("deterministic"), b("written"), b("guards_intact"),
              b("batch_invariant"), b("nan_exact"), Cell(", ".join(sorted(bad)), bad=bool(bad)), code(r["repro"]),
              *((maps.get(r["case"], ""),) if maps else ()), status="" if r["ok"] else "fail")
    return t


def failure_lines(results: list[dict], maps: dict | None = None) -> list[str]:
    """Each failed case: its id, what failed (the engine's messages), the command, alone on its
    line, that reruns it, and its error map where one was drawn (maps: case id -> file name)."""
    out = []
    for r in results:
        if not r["ok"]:
            out += [f"- **{r['case']}** ({', '.join(_failed(r))}): " + "; ".join(r["failures"]), "",
                    "  ```", f"  {r['repro']}", "  ```", ""]
            if (maps or {}).get(r["case"]):
                out += [f"  ![error map of {r['case']}]({maps[r['case']]})", ""]
    return out


def html(results: list[dict], prov: list[dict], note: str = "", problems=(), maps: dict | None = None) -> str:
    """problems: why these results are not one complete run (then the verdict is not green);
    maps: case id -> PNG path of its error map, shown inline."""
    from .report import html as h
    n_ok = sum(r["ok"] for r in results)
    body = [h.meta(p) for p in prov]
    body.append(h.verdict(n_ok == len(results) and not problems, f"{n_ok} of {len(results)} cases passed"
                          + ("; not a complete result" if problems else "")))
    if problems:
        body.append(h.problems(INCOMPLETE, problems))
    if note:
        body.append(f"<p>{h.esc(note)}</p>")
    body.append("<h2>Per path</h2>")
    body.append(path_table(results).html())
    bad = [r for r in worst_first(results) if not r["ok"]]
    if bad:
        body.append("<h2>Failures</h2>")
        for r in bad:
            body.append(f"<p><b>{h.esc(r['case'])}</b> ({h.esc(', '.join(_failed(r)))}): "
                        f"{h.esc('; '.join(r['failures']))}</p>" + h.pre(r["repro"]))
            png = (maps or {}).get(r["case"])
            if png:
                with open(png, "rb") as fh:
                    body.append(h.image(fh.read(), f"error map of {r['case']}"))
    body.append("<h2>Cases, worst first</h2>")
    body.append(case_table(results).html())
    return h.page("pq2verify check", body)


INCOMPLETE = "Not a complete result (check --render exits 1):"


def markdown(results: list[dict], prov: list[dict], note: str = "", problems=(), maps: dict | None = None) -> str:
    """A per-path summary, the failures with their repro commands, and the results table from
    to_json() rows, with the provenance of each run they came from; problems: why they are not
    one complete run; maps: case id -> file name of its error map (beside the Markdown)."""
    lines = ["# pq2verify check", ""]
    from . import provenance
    for p in prov:
        lines += provenance.markdown_lines(p)      # with its backend's missing records, if any
    n_ok = sum(r["ok"] for r in results)
    lines += ["", f"**{n_ok} of {len(results)} cases passed.**"]
    if problems:
        lines += ["", f"**{INCOMPLETE}**", ""] + [f"- {p}" for p in problems]
    lines += ([note] if note else []) + [""]
    lines += summary(results) + [""]
    if n_ok < len(results):
        lines += ["## Failures", ""] + failure_lines(worst_first(results), maps)
    lines += case_table(results).markdown()
    return "\n".join(lines) + "\n"


def path_table(results: list[dict]):
    """One row per path: cases, worst relative RMS, how many held each property, and the checks
    that failed (a count below its total highlighted)."""
    from .report.table import Cell, Table
    t = Table(("path", "cases", "pass", "max relRMS vs quantized FP64", "max vs dense FP64", "max elem/bound",
               "max ulp", "dots exact", "claim held", "deterministic", "written", "guards intact",
               "batch invariant", "NaN exact", "failed checks"), title="per path")
    by = {}
    for r in results:
        by.setdefault(r["path"], []).append(r)
    for path, rs in by.items():
        bad = {n for r in rs for n in _failed(r)}

        def mx(k, fmt="{:.2e}"):
            v = [r.get(k) for r in rs if r.get(k) is not None]
            return Cell(fmt.format(max(v)) if v else "-", bad=_FIELD_CHECK[k] in bad)

        def held(k):
            v = [r.get(k) for r in rs if r.get(k) is not None]
            return Cell(f"{sum(v)}/{len(v)}" if v else "-", bad=bool(v) and sum(v) < len(v))
        n_ok = sum(r["ok"] for r in rs)
        t.add(path, len(rs), Cell(str(n_ok), bad=n_ok < len(rs)), mx("rel_rms_quantized"), mx("rel_rms_dense"),
              mx("elem_ratio", "{:.3f}"), mx("max_ulp", "{}"), held("dots_exact"), held("claim_held"),
              held("deterministic"), held("written"), held("guards_intact"), held("batch_invariant"),
              held("nan_exact"), Cell(", ".join(sorted(bad)) or "-", bad=bool(bad)),
              status="fail" if n_ok < len(rs) else "")
    return t


def summary(results: list[dict]) -> list[str]:
    """The per-path table as Markdown lines."""
    return path_table(results).markdown()


# --- render: saved --json files, green only as one whole run ---------------------------------
_NUM = (int, float, type(None))
_ROW = {"case": (str,), "repro": (str,), "ok": (bool,), "failures": (list,), "path": (str,), "shape": (str,),
        "n": (int,), "k": (int,), "m": (int,), "dtype": (str,), "layout": (str,), "kind": (str,),
        "strided": (bool,), "rel_rms_quantized": _NUM, "tol_quantized": _NUM, "rel_rms_dense": _NUM,
        "tol_dense": _NUM, "dots_exact": (bool, type(None)), "claim": (str,),
        "claim_held": (bool, type(None)), "deterministic": (bool, type(None)), "written": (bool, type(None))}
_OPTIONAL = {"elem_ratio": _NUM, "max_ulp": _NUM, "guards_intact": (bool, type(None)),
             "batch_invariant": (bool, type(None)), "nan_exact": (bool, type(None))}


def _type_name(types) -> str:
    return " or ".join("null" if t is type(None) else {"str": "a string", "bool": "true/false", "int": "an integer",
                                                       "float": "a number", "list": "a list"}[t.__name__]
                       for t in types)


def load(fn: str) -> dict:
    """One `check --json` file, its rows checked field by field: anything else is a UsageError
    naming the file (the table must not be built from rows it cannot read)."""
    try:
        with open(fn) as fh:
            d = json.load(fh)
    except OSError as e:
        raise UsageError(f"--render {fn}: cannot read it: {e.strerror or e}") from None
    except ValueError as e:     # json.JSONDecodeError, a UnicodeDecodeError
        raise UsageError(f"--render {fn}: not a JSON file ({e})") from None
    if not isinstance(d, dict) or not {"cases", "provenance"} <= d.keys():
        raise UsageError(f"--render {fn}: not a `check --json` file (no 'cases' and 'provenance')")
    if not isinstance(d["cases"], list) or not isinstance(d["provenance"], dict):
        raise UsageError(f"--render {fn}: not a `check --json` file ('cases' must be a list, 'provenance' an object)")
    for i, r in enumerate(d["cases"]):
        where = f"--render {fn}: case {i + 1}"
        if not isinstance(r, dict):
            raise UsageError(f"{where}: not an object")
        for key, types in {**_ROW, **_OPTIONAL}.items():
            if key not in r:
                if key in _ROW:
                    raise UsageError(f"{where} ({r.get('case', '?')}): no {key!r}")
                continue
            v = r[key]
            if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
                raise UsageError(f"{where} ({r.get('case', '?')}): {key!r} is {json.dumps(v)}, "
                                 f"expected {_type_name(types)}")
        if not all(isinstance(v, str) for v in r["failures"]):
            raise UsageError(f"{where} ({r['case']}): 'failures' must hold strings, got {json.dumps(r['failures'])}")
        if r["ok"] == bool(r["failures"]):
            raise UsageError(f"{where} ({r['case']}): 'ok' is {json.dumps(r['ok'])} but it lists "
                             f"{len(r['failures'])} failure(s)")
    for key, types in (("complete", (bool,)), ("selection", (dict,)), ("selfcheck", (dict, list))):
        if key in d and not isinstance(d[key], types):
            raise UsageError(f"--render {fn}: {key!r} is {json.dumps(d[key])}, expected {_type_name(types)}")
    sel = d.get("selection")
    if sel is not None:
        shard = sel.get("shard")
        ints = all(isinstance(sel.get(k), int) and not isinstance(sel.get(k), bool) for k in ("total", "cases"))
        good = (ints and isinstance(sel.get("fingerprint"), str) and 0 <= sel["cases"] <= sel["total"]
                and (shard is None or (isinstance(shard, list) and len(shard) == 2
                                       and all(isinstance(v, int) for v in shard) and 1 <= shard[0] <= shard[1])))
        if not good:
            raise UsageError(f"--render {fn}: 'selection' is {json.dumps(sel)}, expected total, fingerprint, "
                             "cases and shard [I, N] or null")
    return d


def problems(runs: list[tuple[str, dict]]) -> list[str]:
    """Why the files are not one complete, self-checked run of one selection (empty: they are)."""
    out = []
    for fn, d in runs:
        sel, n = d.get("selection"), len(d["cases"])
        if "complete" not in d or sel is None:
            out.append(f"{fn}: does not record whether its run completed, nor its selection (not written "
                       "by this version of `check --json`); run it again")
            continue
        if not d["complete"]:
            why = f" ({d['interrupted']})" if d.get("interrupted") else ""
            out.append(f"{fn}: incomplete: the run stopped after {n} of its {sel['cases']} cases{why}; "
                       "an interrupted or crashed run")
        elif n != sel["cases"]:
            out.append(f"{fn}: says complete but holds {n} of its {sel['cases']} cases")
        sc = d.get("selfcheck")
        status = sc.get("status") if isinstance(sc, dict) else None
        if status == "skipped":
            out.append(f"{fn}: reference self-checks skipped ({sc.get('reason') or 'no reason recorded'})")
        elif status == "failed":
            bad = [c.get("check", "?") for c in sc.get("checks", []) if not c.get("ok")]
            out.append(f"{fn}: reference self-checks failed: {', '.join(map(str, bad)) or 'no detail recorded'}")
        elif status != "passed":
            out.append(f"{fn}: no reference self-check outcome recorded")
        nr = [r["case"] for r in d["cases"] if r.get("not_run")]
        if nr:
            out.append(f"{fn}: {len(nr)} case(s) not run (inputs could not be set up), first {nr[0]}")
    known = [(fn, d["selection"]) for fn, d in runs if isinstance(d.get("selection"), dict)]
    prints = {}
    for fn, sel in known:
        prints.setdefault((sel["fingerprint"], sel["total"], sel.get("backend", "?")), []).append(fn)
    if len(prints) > 1:
        out.append("files of different selections, which do not add up to one table: " + "; ".join(
            f"{', '.join(fns)} (selection {fp}: {total} cases on {back})" for (fp, total, back), fns in prints.items()))
        return out
    if not known:
        return out
    counts = {(sel["shard"] or [1, 1])[1] for _, sel in known}
    if len(counts) > 1:
        out.append("files split the selection differently: " + "; ".join(
            f"{fn}: shard {'/'.join(map(str, sel['shard'] or [1, 1]))}" for fn, sel in known))
        return out
    of = counts.pop()
    by_shard = {}
    for fn, sel in known:
        by_shard.setdefault((sel["shard"] or [1, 1])[0], []).append(fn)
    for i, fns in sorted(by_shard.items()):
        if len(fns) > 1:
            what = f"shard {i}/{of}" if of > 1 else "the same unsharded run"
            out.append(f"{what} given {len(fns)} times: {', '.join(fns)}")
    # shard I of N is empty by construction when I > the selection's size: never run, never missing
    missing = [f"{i}/{of}" for i in range(1, min(of, known[0][1]["total"]) + 1) if i not in by_shard]
    if missing:
        have = ", ".join(f"{i}/{of} ({fns[0]})" for i, fns in sorted(by_shard.items()))
        out.append(f"missing shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} (given: {have})")
    if len(known) == len(runs) and not missing and all(len(f) == 1 for f in by_shard.values()):
        seen, total = {}, known[0][1]["total"]
        for fn, d in runs:
            for r in d["cases"]:
                if r["case"] in seen:
                    out.append(f"case {r['case']} in both {seen[r['case']]} and {fn}")
                seen[r["case"]] = fn
        if len(seen) != total and not any("incomplete" in p for p in out):
            out.append(f"the files hold {len(seen)} of the selection's {total} cases")
        elif not out:
            # shard I holds cases I-1, I-1+N, ... of the selection: rebuilt in order, they must
            # give its fingerprint (an edited case id, or rows from another run, do not)
            order = [None] * total
            for fn, d in runs:
                i = (d["selection"]["shard"] or [1, 1])[0]
                for pos, r in enumerate(d["cases"]):
                    j = i - 1 + of * pos
                    if j < total:
                        order[j] = r["case"]
            got = _digest([known[0][1].get("backend", "")] + order)
            if got != known[0][1]["fingerprint"]:
                out.append(f"the cases do not add up to the selection they name (fingerprint {got}, recorded "
                           f"{known[0][1]['fingerprint']}): a case id was edited, or rows come from another run")
    return out


def render(args) -> int:
    runs = [(fn, load(fn)) for fn in args.render]
    by_id, prov = {}, []
    for _, d in runs:
        for r in d["cases"]:
            by_id.setdefault(r["case"], r)
        prov.append(d["provenance"])
    from . import provenance
    prov = provenance.status_once(prov)       # one backend warning for N shards, not N
    results = list(by_id.values())
    why = problems(runs)
    text = markdown(results, prov, problems=why)
    if not args.markdown:
        print(text)
    ok = all(r["ok"] for r in results) and not why
    if why:
        print(f"pq2verify check --render: not a complete result ({sum(r['ok'] for r in results)} of "
              f"{len(results)} cases passed):\n  " + "\n  ".join(why), file=sys.stderr)
    outputs.write_all([("--markdown", args.markdown, text),
                       ("--html", args.html, lambda: html(results, prov, problems=why))])
    return 0 if ok else 1


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
    def j(v):
        return None if v is None else ",".join(map(str, v))
    return [f"{o} {v}" for o, v in (("--kernels", args.kernels), ("--paths", j(args.paths)), ("--m", j(args.m)),
                                    ("--dtype", j(args.dtype)), ("--layout", j(args.layout))) if v is not None]


def _given(args, *opts) -> list[str]:
    """Those of `opts` (option names) given on the command line."""
    def on(opt):
        v = getattr(args, opt.lstrip("-").replace("-", "_"))
        return v != "auto" if opt == "--shapes" else v not in (None, False, [])
    return [o for o in opts if on(o)]


RUN_ONLY = ("--kernels", "--paths", "--m", "--dtype", "--layout", "--case", "--reruns", "--shard", "--shapes",
            "--allow-slow", "--skip-selfcheck", "--derive-exact", "--record", "--json")


def _modes(args) -> None:
    """Options the chosen mode cannot honour are usage errors (silently ignoring one would
    report on something other than what was asked)."""
    if args.render:
        extra = _given(args, *RUN_ONLY)
        if extra:
            raise UsageError(f"--render renders saved results and runs nothing; it does not take {', '.join(extra)} "
                             "(select the cases when running them)")
        return
    if args.record and not args.derive_exact:
        raise UsageError("--record goes with --derive-exact")
    if args.derive_exact:
        other = [f for f in _filters(args) if not f.startswith("--paths")]
        other += _given(args, "--case", "--markdown", "--html", "--shard", "--reruns", "--skip-selfcheck")
        if other:
            raise UsageError(f"--derive-exact tests every case of each tuned path (all, or those in --paths); "
                             f"it does not take {', '.join(other)}")
    dup = sorted({c for c in args.case if args.case.count(c) > 1})
    if dup:
        raise UsageError(f"--case {dup[0]}: given twice; each case runs once")


def _slow(args, dev: str, shapes: str, what: str) -> None:
    if dev == "cpu" and shapes == "bonsai27b" and not args.allow_slow:
        from . import cases
        big = max(cases.SHAPES["bonsai27b"]["pq2"], key=lambda s: s[1] * s[2])
        raise UsageError(f"--shapes bonsai27b on the interpreter (no GPU here): {what} on shapes up to "
                         f"{big[1]}x{big[2]} ({big[0]}) through Triton's interpreter take hours (a GPU runs "
                         "them in minutes); run it on a GPU (--device cuda), use --shapes small, or add "
                         "--allow-slow to run it here anyway")


def fingerprint(todo: list, key: str = "") -> str:
    """Names the selection (before sharding) and the backend it runs on (`backend.golden_key`):
    shards of different selections, or of one run on two kinds of backend, never add up."""
    return _digest([key] + [c.id for c in todo])


def _digest(lines) -> str:
    return hashlib.sha256("\n".join(map(str, lines)).encode()).hexdigest()[:16]


def need_bytes(c) -> tuple[int, int]:
    """A floor on what one case must hold at once: (device bytes, host bytes). Device: x, out,
    the weight and the group dots (when checked); host: x in FP64 and the FP64 reference rows."""
    from . import checks, registry
    es = 2                                    # bf16 and fp16
    p = registry.get(c.path)
    dense = p.weight == "dense"
    x = c.m * c.k * es * (2 if c.strided else 1)
    weight = c.n * c.k * es if dense else c.n * c.k // 4     # PQ2: 2 bits a weight
    dots = c.m * c.n * -(-c.k // 128) * 4 if p.has_dots else 0    # int32 per 128-group
    dev = x + c.m * c.n * es + weight + (dots if dots <= checks.DOTS_MAX_BYTES else 0)
    host = c.m * c.k * 8 + c.m * min(c.n, checks.REF_ROWS) * 8
    return dev, host


def _capacity(dev: str) -> tuple[int | None, int | None]:
    """(device bytes, host bytes) of this machine; None where unknown."""
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        host = None
    if dev == "cpu":
        return host, host
    import torch
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory, host


def _fits(todo: list, dev: str) -> None:
    """An M no machine of this size can hold is a usage error before any work, not a kernel FAIL
    at the case (an allocation error); the message gives the largest M that fits the shape."""
    from dataclasses import replace
    cap_dev, cap_host = _capacity(dev)
    # (where, capacity, bytes of a case there): on the interpreter device and host are one memory
    pools = ([("this machine's memory", cap_host, lambda c: sum(need_bytes(c)))] if dev == "cpu" else
             [("the GPU's memory", cap_dev, lambda c: need_bytes(c)[0]),
              ("host memory", cap_host, lambda c: need_bytes(c)[1])])
    for c in todo:
        for where, cap, need in pools:
            if cap is None or need(c) <= cap:
                continue
            one, two = need(replace(c, m=1)), need(replace(c, m=2))
            per_row = max(two - one, 1)
            m_max = max((cap - (one - per_row)) // per_row, 0)
            raise UsageError(f"--m {c.m}: case {c.id} needs at least {need(c) / 2**30:.1f} GiB at once and "
                             f"{where} is {cap / 2**30:.1f} GiB; shape {c.shape} ({c.n}x{c.k}) fits M <= {m_max} "
                             "here (inputs this large are a resource limit, not a kernel failure)")


def select(args, shapes: str) -> list:
    """The cases to run; a filter that is unknown or selects nothing is a usage error (an empty
    selection would otherwise read PASS: 0 of 0)."""
    from kernels import backend
    from . import cases, registry
    if args.case:
        if _filters(args):
            raise UsageError("--case runs exactly the cases named; it does not combine with "
                             + ", ".join(_filters(args)))
        try:
            return [cases.Case.parse(s) for s in args.case]
        except ValueError as e:
            raise UsageError(str(e)) from None
    try:
        todo = cases.check_cases(shapes, paths=args.paths, kset=args.kernels, ms=args.m,
                                 dtypes=args.dtype, layouts=args.layout, key=backend.golden_key())
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not todo:
        sel = [registry.get(n) for n in args.paths or registry.BY_NAME]
        raise UsageError(f"no case matches {' '.join(_filters(args))} (shapes {shapes}); the paths: " + "; ".join(
            f"{p.name} in the {p.kset} set, M {p.m_range()}, layouts {'/'.join(p.layouts)}" for p in sel))
    return todo


def _derive(args, shapes: str, dev, console) -> int:
    from . import derive
    _slow(args, dev, shapes, "--derive-exact's cases")
    try:
        paths = derive.tuned_paths(args.paths)
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        return derive.derive_exact(shapes, dev, console, paths=paths, record=args.record, json_out=args.json)
    except OSError as e:       # an output the probe passed failed when written: exit 3, no traceback
        raise outputs.WriteError(f"--derive-exact: could not write {e.filename or args.json or 'the record'}: "
                                 f"{e.strerror or e}") from None


def _selfcheck(args) -> dict:
    from . import selfcheck
    if args.skip_selfcheck:
        return {"status": "skipped", "reason": "--skip-selfcheck", "checks": []}
    try:
        rows = [{"check": name, "ok": bool(ok), "detail": detail} for name, ok, detail in selfcheck.run_all()]
    except Exception as e:     # a broken reference must not pass as 'no self-check failed'
        rows = [{"check": "run the self-checks", "ok": False, "detail": f"raised {type(e).__name__}: {e}"}]
    return {"status": "passed" if rows and all(r["ok"] for r in rows) else "failed", "checks": rows}


def run(args) -> int:
    _modes(args)
    outputs.check(cli.output_paths(args), [("--render", f) for f in args.render or ()])
    cli.parse_paths(args.paths)
    if args.render:
        return render(args)
    from kernels import backend
    from . import checks, provenance
    console = Console(highlight=False, width=100)
    dev = backend.device()
    shapes = args.shapes if args.shapes != "auto" else ("bonsai27b" if dev == "cuda" else "small")
    if args.derive_exact:
        return _derive(args, shapes, dev, console)
    reruns = args.reruns or RERUNS
    chosen = select(args, shapes)
    if not args.case:
        _slow(args, dev, shapes, f"{len(chosen)} cases")
    todo = shard(chosen, args.shard)
    if not todo:
        raise UsageError(f"--shard {args.shard[0]}/{args.shard[1]}: no case left in this shard")
    _fits(todo, dev)
    prov = provenance.collect()
    if args.shard:
        prov["shard"] = f"{args.shard[0]}/{args.shard[1]}"
    console.print(f"[bold]pq2verify check[/] backend={prov['backend']} shapes={shapes} "
                  f"torch={prov['torch']} triton={prov['triton']} commit={prov['commit']}")
    key = backend.golden_key()
    out = {"format": FORMAT, "provenance": prov, "complete": False,
           "selection": {"total": len(chosen), "backend": key, "fingerprint": fingerprint(chosen, key),
                         "shard": list(args.shard) if args.shard else None, "cases": len(todo), "reruns": reruns},
           "selfcheck": {"status": "not run yet", "checks": []}, "cases": []}
    live = outputs.Rewritten(args.json, "--json",
                             lambda msg: console.print(f"[yellow]warning[/]: {msg}", soft_wrap=True))

    def save():
        live.save(out)
    save()
    out["selfcheck"] = sc = _selfcheck(args)
    ok_all = sc["status"] != "failed"
    if sc["status"] == "skipped":
        console.print("reference self-checks: skipped (--skip-selfcheck); a --render of this run's --json "
                      "is not green")
    else:
        t = Table(title="reference self-checks")
        for col in ("check", "result", "detail"):
            t.add_column(col)
        for row in sc["checks"]:
            t.add_row(row["check"], "PASS" if row["ok"] else "[red]FAIL[/]", row["detail"])
        console.print(t)
    save()
    # the console table fits 100 columns; every figure is in --json, --markdown and --html
    table = Table(title=f"kernel paths ({len(todo)} cases)", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("path", "shape", "M", "dtype", "layout", "input", "relRMS/tol", "elem", "checks", "verdict"):
        table.add_column(col, no_wrap=True)
    failures, not_run = [], []
    t0 = time.time()
    progress = Progress(len(todo))
    try:
        for i, c in enumerate(todo):
            r, skipped = _one(checks, c, dev, reruns)
            rel, tol = ((r.rel_rms_quantized, r.tol_quantized) if r.rel_rms_quantized is not None
                        else (r.rel_rms_dense, r.tol_dense))
            table.add_row(c.path, c.shape, str(c.m), c.dtype, c.layout[:4], c.kind[:8] + ("/s" if c.strided else ""),
                          _fmt(rel, tol), "-" if r.elem_ratio is None else f"{r.elem_ratio:.2f}", _flags(r),
                          "[yellow bold]NOT RUN[/]" if skipped else "PASS" if r.ok else "[red bold]FAIL[/]")
            row = r.to_json()
            if skipped:
                row["not_run"] = skipped
                not_run.append((c, skipped))
            elif not r.ok:
                failures.append(r)
            out["cases"].append(row)
            save()               # after every case: a crash keeps what was measured
            progress.update(i + 1, c.id[:60])
    except KeyboardInterrupt:
        progress.close()
        out["interrupted"] = f"interrupted after {len(out['cases'])} of {len(todo)} cases"
        console.print(table)
        console.print(f"[bold]INTERRUPTED[/]: {out['interrupted']}; not a verdict"
                      + (f"; {args.json} says it is incomplete" if args.json else ""))
        save()
        raise
    progress.close()
    console.print(table)
    console.print("checks: d dots exact, c claim held, r reruns identical, w written, g guard bands intact, "
                  "b batch invariant, n NaN exact (upper case: failed, '.': not applicable)")
    ok_all &= not failures and not not_run
    for r in failures:
        console.print(f"[red]FAIL[/] {r.message()}", soft_wrap=True)
    for c, why in not_run:
        console.print(f"[yellow]NOT RUN[/] {c.id}: {why}\n  reproduce: {c.repro()}", soft_wrap=True)
    n_pass = len(todo) - len(failures) - len(not_run)
    part = f" (shard {args.shard[0]}/{args.shard[1]} of {len(chosen)} cases)" if args.shard else ""
    console.print(f"[bold]{'PASS' if ok_all else 'FAIL'}[/]: {n_pass} of {len(todo)} cases passed{part}"
                  + (f", {len(not_run)} not run (inputs could not be set up: a resource limit, not a kernel "
                     "failure)" if not_run else "")
                  + (", reference self-checks FAILED" if sc["status"] == "failed" else "")
                  + f" in {time.time() - t0:.0f}s on {prov['backend']}")
    # the verdict is on the console: now the files (a failed write is exit 3, the verdict stands)
    out["complete"] = True
    out["per_path"] = path_table(out["cases"]).json()      # the table the reports show, as data
    note = _note(out)
    maps, unwritten = error_maps(failures, dev, args.markdown or args.html) if args.markdown or args.html else ({}, [])
    names_ = {k: os.path.basename(v) for k, v in maps.items()}
    outputs.write_all([("--json", args.json, lambda: json.dumps(out, indent=1, default=str)),
                       ("--markdown", args.markdown, lambda: markdown(out["cases"], [prov], note, maps=names_)),
                       ("--html", args.html, lambda: html(out["cases"], [prov], note, maps=maps))])
    if unwritten:
        raise outputs.WriteError("; ".join(unwritten))
    return 0 if ok_all else 1


MAX_MAPS = 8      # error maps drawn per run: the first failures (each reruns its case once)
# the checks whose failure an error map shows (the others fail on calls other than the judged one)
MAPPED = ("rms quantized", "rms dense", "per-element", "written")


def error_maps(failed: list, dev, report: str) -> tuple[dict, list]:
    """({case id: PNG of its error map (report.errormap)}, [maps that could not be written]):
    written beside `report` as <report stem>.<case>.png, for the first MAX_MAPS cases that failed
    a check the map shows (MAPPED). A map that cannot be drawn is left out with a warning."""
    from .report import errormap
    out, unwritten = {}, []
    stem = os.path.splitext(report)[0]
    for r in [r for r in failed if set(r.failed) & set(MAPPED)][:MAX_MAPS]:
        png = f"{stem}.{errormap.slug(r.case.id)}.png"
        try:
            errormap.write(errormap.of_case(r.case, dev), png)
        except OSError as e:
            unwritten.append(f"error map {png}: {e.strerror or e}")
            continue
        except Exception as e:       # a case that raised: no outputs to map
            print(f"warning: no error map for {r.case.id}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        out[r.case.id] = png
    return out, unwritten


def _note(out: dict) -> str:
    """What a live report says beside its table: a shard, skipped or failed self-checks."""
    sel, sc = out["selection"], out["selfcheck"]
    bits = []
    if sel["shard"]:
        bits.append(f"Shard {sel['shard'][0]}/{sel['shard'][1]}: {sel['cases']} of the selection's "
                    f"{sel['total']} cases (selection {sel['fingerprint']}).")
    if sc["status"] != "passed":
        bits.append(f"Reference self-checks {sc['status']}"
                    + (f" ({sc['reason']})" if sc.get("reason") else "") + ".")
    return " ".join(bits)


def _one(checks, c, dev, reruns):
    """(result, why it was not run or None): inputs that cannot be built, or memory that runs
    out, are the run's resource limit, not the kernel failing."""
    import torch
    oom = tuple(t for t in (MemoryError, getattr(torch, "OutOfMemoryError", None)) if t)
    try:
        inp = checks.Inputs(c, dev)
    except Exception as e:
        r = checks.Result(c)
        why = f"its inputs could not be built: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        r.fail(why)
        return r, why
    try:
        return checks.evaluate(c, dev, reruns=reruns, inp=inp), None
    except oom as e:
        r = checks.Result(c)
        why = f"out of memory during the checks: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        r.fail(why)
        return r, why
    except Exception as e:  # a crash is a failure of that case, never of the whole table
        r = checks.Result(c)
        r.fail(f"raised {type(e).__name__}: {e}")
        return r, None
