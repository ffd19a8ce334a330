"""pq2verify fuzz: seeded random cases beyond the fixed matrix (pq2verify.fuzz), each through the
full check engine; the first failure is shrunk and printed as `./pq2 check --case ID` lines."""
import argparse
import json
import math
import random
import sys
import time

from . import cli, outputs
from .cli import UsageError, finite_float, positive_int

FORMAT = "pq2verify-fuzz/1"
DEFAULT_BUDGET_S = 60.0
DESCRIPTION = """\
Seeded random cases over N (tile edges and ragged sizes of each path's configs), K (multiples of
128: one group, odd group counts, split edges), M (each path's range and its edges), dtypes,
layouts, strided rows and input regimes (normal, heavy, outliers, zero_groups, ties, zeros, tiny,
subnormal), each through the check engine (relative RMS, per-element bound, exact dots, claims,
determinism, batch invariance, NaN propagation, guard bands, the declared fold on the
interpreter). A seed names one case list: `--seed S` replays it. The first failure is shrunk
(simpler regime, unstrided, smaller M, N, K toward tile edges) and printed, original and
smallest, as `./pq2 check --case ID` lines. On the interpreter shapes stay small; on a GPU they
reach the model's."""


_budget = finite_float(lambda v: v > 0, "a finite number of seconds > 0")


def _seed(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        v = -1
    if not 0 <= v < 2 ** 63:
        raise argparse.ArgumentTypeError(f"expected an integer 0 <= seed < 2**63, got {s!r}")
    return v


def _epilog() -> str:
    codes = "\n".join(f"  {k:<4}{v}" for k, v in outputs.EXIT_CODES.items())
    return f"""\
exit codes:
{codes}
  a run that tested no case (every one NOT RUN) exits 1: it is not a pass.

examples:
  ./pq2 fuzz --budget-s 120                   a fresh seed, printed first
  ./pq2 fuzz --seed 1234 --paths mmq,gemv --max-cases 40 --json fuzz.json"""


def register(sub):
    ap = sub.add_parser("fuzz", help="seeded random cases through every check; a failure is shrunk",
                        description=DESCRIPTION, epilog=_epilog(),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=_seed, default=None,
                    help="the seed of the case list (default: a fresh one, printed at the start)")
    ap.add_argument("--budget-s", type=_budget, default=None,
                    help=f"stop drawing cases once this many seconds are spent (checked between cases; "
                         f"default {DEFAULT_BUDGET_S:g}, or none with --max-cases)")
    ap.add_argument("--max-cases", type=positive_int, default=None, help="stop after this many cases")
    cli.add_paths_option(ap, help="comma-separated path names (default: all)")
    cli.add_output(ap, "--json", help="write every case's result here, rewritten after each case")
    ap.set_defaults(func=main)


def replay_line(seed: int, paths, max_cases=None) -> str:
    """The command that draws the same cases: same seed and paths, and the interpreter where a
    GPU is present but this run used the CPU (each backend draws its own sizes)."""
    from kernels import backend
    from .cases import RUN
    dev = " --device cpu" if backend.device() == "cpu" and backend.cuda_available() else ""
    return (f"{RUN}{dev} fuzz --seed {seed}" + (f" --paths {','.join(paths)}" if paths else "")
            + (f" --max-cases {max_cases}" if max_cases else ""))


def main(args) -> int:
    from kernels import backend
    from . import cases, fuzz, provenance
    sel = cases.select_paths(cli.parse_paths(args.paths))
    outputs.check(cli.output_paths(args))
    budget = args.budget_s if args.budget_s is not None else (None if args.max_cases else DEFAULT_BUDGET_S)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 32)
    dev = backend.device()
    print(f"fuzz seed: {seed} (replay: {replay_line(seed, args.paths)})", flush=True)
    print(f"fuzz on {backend.name()}: {len(sel)} path(s), "
          + (f"budget {budget:g}s" if budget is not None else "no time budget")
          + (f", at most {args.max_cases} cases" if args.max_cases else ""), flush=True)
    prov = provenance.collect()
    out = {"format": FORMAT, "provenance": prov, "seed": seed, "paths": [p.name for p in sel],
           "budget_s": budget, "max_cases": args.max_cases, "complete": False, "cases": []}
    live = outputs.Rewritten(args.json, "--json", lambda msg: print(f"warning: {msg}", file=sys.stderr))

    def save():
        live.save(out)

    def row(o):
        d = o.result.to_json() if o.result is not None else {"case": o.case.id, "repro": o.case.repro(), "ok": None}
        d["seconds"] = round(o.seconds, 3)
        if o.not_run:
            d["not_run"] = o.not_run
        return d

    def on_case(o, rep):
        verdict = "NOT RUN" if o.not_run else ("PASS" if o.result.ok else "FAIL")
        print(f"  [{len(rep.outcomes)}] {verdict:<7} {o.seconds:5.1f}s {o.case.id}", flush=True)
        out["cases"].append(row(o))
        save()

    t0 = time.time()
    save()
    try:
        rep = fuzz.run(seed, sel, dev, budget_s=budget if budget is not None else math.inf,
                       max_cases=args.max_cases, on_case=on_case, log=lambda s: print(s, flush=True))
    except KeyboardInterrupt:
        out["interrupted"] = f"interrupted after {len(out['cases'])} cases"
        save()
        raise
    took = time.time() - t0
    not_run = [o for o in rep.outcomes if o.not_run]
    for o in not_run:
        print(f"NOT RUN {o.case.id}: {o.not_run}\n  reproduce: {o.case.repro()}")
    if rep.failure is not None:
        f, s = rep.failure, rep.shrunk
        n = len(rep.outcomes)
        print(f"FAIL: case {n} of seed {seed} failed: {'; '.join(f.result.failures)}")
        print(f"  original: {f.case.repro()}")
        print(f"  smallest still failing ({len(rep.shrink_steps)} shrink step(s)): {s.case.repro()}")
        if s is not f:
            print(f"    its failures: {'; '.join(s.result.failures)}")
        if fuzz.checks.FOLD in f.result.failed:
            print("  the declared-fold check is not part of `check --case`; the replay below repeats it")
        print(f"  replay: {replay_line(seed, args.paths, n)}")
        out["failure"] = row(f)
        out["shrunk"] = row(s) | {"steps": rep.shrink_steps}
        out["replay"] = replay_line(seed, args.paths, n)
        code = outputs.EXIT_FAIL
    elif rep.tested == 0:
        print(f"FAIL: no case was tested ({len(not_run)} not run); a run that tested nothing is not a pass")
        code = outputs.EXIT_FAIL
    else:
        print(f"PASS: {rep.tested} case(s), no failure, in {took:.0f}s ({rep.stopped or 'done'}); "
              f"seed {seed}" + (f", {len(not_run)} not run" if not_run else ""))
        code = outputs.EXIT_PASS
    out.update(complete=True, stopped=rep.stopped, tested=rep.tested, seconds=round(took, 1),
               verdict="PASS" if code == 0 else "FAIL")
    outputs.write_all([("--json", args.json, lambda: json.dumps(out, indent=1, default=str))])
    return code
