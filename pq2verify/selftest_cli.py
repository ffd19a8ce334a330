"""pq2verify selftest: the suite's checks against deliberately broken variants of every path;
prints which check caught each fault and exits 1 if any applicable fault went undetected.

  pq2verify selftest --paths int_gemv --faults ulp,last_row
  pq2verify selftest --case "$(pq2verify --list-cases selftest | head -1)"

--case takes the ids `--list-cases selftest` prints (each path's selftest case). A selection in
which every fault is n/a on this backend is refused (exit 2): a run that tests nothing is not a
pass. Exit status: 0 every applicable fault caught; 1 one went undetected or errored; 2 bad
input; 3 an output file could not be written (the verdict printed stands).
"""
import argparse
import json
import sys

from . import cli
from .cli import UsageError


def register(sub):
    ap = sub.add_parser("selftest", help="the suite's own power: which check catches each planted fault, per path",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_paths_option(ap)
    ap.add_argument("--case", default=None, metavar="ID,..",
                    help="the paths whose selftest case has these ids (--list-cases selftest prints them)")
    ap.add_argument("--faults", default=None, help="comma-separated fault names (default: all; --list-faults shows them)")
    ap.add_argument("--list-faults", action="store_true", help="list the faults and exit")
    cli.add_output(ap, "--json", help="write every verdict to this file")
    cli.add_output(ap, "--markdown", help="write the fault x path table as Markdown to this file")
    cli.add_output(ap, "--html", help="also a self-contained HTML page of the same report")
    ap.set_defaults(func=main)


def _names(opt: str, value, known) -> list | None:
    if value is None:
        return None
    if not [v for v in value.split(",") if v.strip()]:
        raise UsageError(f"{opt}: selects nothing (got {value!r}); expected some of {', '.join(known)}")
    try:
        names = cli.names(value)          # an empty item or a name given twice is refused too
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"{opt}: {e}; expected some of {', '.join(known)}") from None
    bad = [n for n in names if n not in known]
    if bad:
        raise UsageError(f"{opt}: unknown {', '.join(map(repr, bad))}; expected some of {', '.join(known)}")
    return names


def _case_paths(value) -> list | None:
    """--case ids -> the paths whose selftest case they are."""
    if value is None:
        return None
    from kernels import backend
    from . import cases
    ids = {c.id: c.path for c in cases.profile("selftest", backend.golden_key())}
    got = _names("--case", value, tuple(ids))
    return [ids[i] for i in got]


def main(args) -> int:
    from kernels import backend
    from . import outputs, registry, selftest
    if args.list_faults:
        for f in selftest.FAULTS:
            print(f"{f.name:<16} {f.what}")
        return 0
    if args.case is not None and args.paths is not None:
        raise UsageError("--case names the paths to run; it does not combine with --paths")
    paths = cli.parse_paths(args.paths)
    paths = _case_paths(args.case) if args.case is not None else paths
    faults = _names("--faults", args.faults, tuple(selftest.BY_NAME))
    outputs.check(cli.output_paths(args))   # before the work, not after it
    device = backend.device()
    sel_p = [registry.get(n) for n in paths] if paths else list(registry.PATHS)
    sel_f = [selftest.BY_NAME[n] for n in faults] if faults else list(selftest.FAULTS)
    why = {f.not_applicable(p, device) for p in sel_p for f in sel_f}
    if "" not in why:      # decided before any work: every selected fault is n/a here
        raise UsageError(f"{'--faults ' + args.faults if faults else 'the selection'}: nothing applicable on "
                         f"{device} ({'; '.join(sorted(why))}); a run that tests nothing is not a pass")
    print(f"selftest on {backend.name()}: {len(sel_p)} path(s) x {len(sel_f)} fault(s)", file=sys.stderr)
    verdicts = selftest.run(paths, faults, device,
                            log=lambda v: print(f"  {v.fault} x {v.path}: {v.cell()}", file=sys.stderr))
    print(selftest.text_table(verdicts))       # the verdict first: a failed write must not lose it
    s = selftest.summary(verdicts)
    tested = sum(v.status != "n/a" for v in verdicts)
    if not tested:
        print("selftest: FAIL: no selected fault was applicable; nothing was tested", file=sys.stderr)
    outputs.write_all([("--json", args.json, lambda: json.dumps(selftest.to_json(verdicts, device), indent=1)),
                       ("--markdown", args.markdown, lambda: selftest.markdown(verdicts)),
                       ("--html", args.html, lambda: selftest.html(verdicts))])
    return 0 if s["ok"] and tested else 1
