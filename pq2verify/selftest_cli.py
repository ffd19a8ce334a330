"""pq2verify selftest: the suite's checks against deliberately broken variants of every path;
prints which check caught each fault and exits 1 if any applicable fault went undetected."""
import json
import sys

from .cli import UsageError, check_writable


def register(sub):
    ap = sub.add_parser("selftest", help="the suite's own power: which check catches each planted fault, per path")
    ap.add_argument("--paths", default=None, help="comma-separated path names (default: every registry path)")
    ap.add_argument("--faults", default=None, help="comma-separated fault names (default: all; --list-faults shows them)")
    ap.add_argument("--list-faults", action="store_true", help="list the faults and exit")
    ap.add_argument("--json", default=None, help="write every verdict to this file")
    ap.add_argument("--markdown", default=None, help="write the fault x path table as Markdown to this file")
    ap.set_defaults(func=main)


def _names(opt: str, value, known) -> list | None:
    if value is None:
        return None
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise UsageError(f"{opt}: selects nothing (got {value!r}); expected some of {', '.join(known)}")
    bad = [n for n in names if n not in known]
    if bad:
        raise UsageError(f"{opt}: unknown {', '.join(map(repr, bad))}; expected some of {', '.join(known)}")
    return list(dict.fromkeys(names))


def main(args) -> int:
    from . import backend, registry, selftest
    if args.list_faults:
        for f in selftest.FAULTS:
            print(f"{f.name:<16} {f.what}")
        return 0
    paths = _names("--paths", args.paths, tuple(registry.BY_NAME))
    faults = _names("--faults", args.faults, tuple(selftest.BY_NAME))
    for opt, f in (("--json", args.json), ("--markdown", args.markdown)):
        if f:
            check_writable(f, opt)                  # before the work, not after it
    device = backend.device()
    print(f"selftest on {backend.name()}: {len(paths or registry.PATHS)} path(s) x "
          f"{len(faults or selftest.FAULTS)} fault(s)", file=sys.stderr)
    verdicts = selftest.run(paths, faults, device,
                            log=lambda v: print(f"  {v.fault} x {v.path}: {v.cell()}", file=sys.stderr))
    print(selftest.text_table(verdicts))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(selftest.to_json(verdicts, device), fh, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(selftest.markdown(verdicts))
    return 0 if selftest.summary(verdicts)["ok"] else 1
