"""The pq2verify command. Each subcommand lives in its own module exposing
`register(subparsers)`, which adds its parser and sets `func` (args -> exit code)."""
import argparse
import importlib
import math
import os
import sys
from pathlib import Path


class UsageError(Exception):
    """Bad command-line input found after parsing (an unknown path, a bad set): main prints it,
    naming the option, and exits with status 2, as argparse does for its own errors."""


def _int_at_least(lo: int):
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            v = None
        if v is None or v < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {s!r}")
        return v
    return parse


# argparse `type=` validators shared by every subcommand: the error names the option
positive_int = _int_at_least(1)
nonneg_int = _int_at_least(0)


def _ints_at_least(lo: int):
    one = _int_at_least(lo)

    def parse(s: str) -> list[int]:
        vals = [v.strip() for v in s.split(",")]
        if not s.strip() or any(not v for v in vals):
            raise argparse.ArgumentTypeError(f"expected comma-separated integers >= {lo}, got {s!r}")
        out = [one(v) for v in vals]
        dup = sorted({v for v in out if out.count(v) > 1})
        if dup:
            raise argparse.ArgumentTypeError(f"{', '.join(map(str, dup))} given twice in {s!r}")
        return out
    return parse


def finite_float(ok, expected: str):
    """argparse type: a finite float for which ok(v) holds; the error says `expected ...`."""
    def parse(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            v = float("nan")
        if not (math.isfinite(v) and ok(v)):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {s!r}")
        return v
    return parse


positive_float = finite_float(lambda v: v > 0, "a positive number")
nonneg_float = finite_float(lambda v: v >= 0, "a number >= 0")


# comma-separated lists of them (e.g. --m 1,17, --positions 0,32)
positive_ints = _ints_at_least(1)
nonneg_ints = _ints_at_least(0)


def nonempty(s: str) -> str:
    """argparse type: any value but an empty one (an empty value would silently mean 'all' or
    'none')."""
    if not s.strip():
        raise argparse.ArgumentTypeError("expected a value, got an empty string")
    return s


def names(s: str) -> list[str]:
    """argparse type: a comma-separated list of names, none empty, none twice (`--paths a,b`)."""
    vals = [v.strip() for v in s.split(",")]
    if not s.strip() or any(not v for v in vals):
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {s!r}")
    dup = sorted({v for v in vals if vals.count(v) > 1})
    if dup:
        raise argparse.ArgumentTypeError(f"{', '.join(dup)} given twice in {s!r}")
    return vals


PATHS_HELP = "comma-separated path names (default: every registry path)"


def add_paths_option(ap, help: str = PATHS_HELP) -> None:
    """The one `--paths` of every subcommand: argparse refuses an empty list, an empty item and
    a name given twice; parse_paths then refuses a name the registry does not hold."""
    ap.add_argument("--paths", default=None, type=names, help=help)


def parse_paths(paths, known=None) -> list[str] | None:
    """The names of `--paths` checked against the registry (or `known`): None stays None (the
    default: every path); an unknown name is a UsageError naming the option and the choices.
    Called before any work, by every subcommand that has --paths."""
    if paths is None:
        return None
    if known is None:
        from . import registry
        known = tuple(registry.BY_NAME)
    bad = [n for n in paths if n not in known]
    if bad:
        raise UsageError(f"--paths: unknown {', '.join(map(repr, bad))}; expected one of {', '.join(known)}")
    return list(paths)


def add_m_option(ap, help: str, default=None, type=None, **kw) -> None:
    """The one `--m`: comma-separated integers >= 1, none twice (`type` may widen it, e.g. to
    bench's 'none')."""
    ap.add_argument("--m", default=default, type=type or positive_ints, help=help, **kw)


def add_output(ap, option: str, help: str) -> None:
    """An output-file option; output_paths(args) lists every one a parser declared, for
    outputs.check before any work."""
    ap.add_argument(option, default=None, help=help)
    declared = ap.get_default("_outputs") or ()
    ap.set_defaults(_outputs=(*declared, option))


def output_paths(args) -> list[tuple[str, str | None]]:
    """(option, path) of each output option the command declared with add_output, in order."""
    return [(o, getattr(args, o.lstrip("-").replace("-", "_"))) for o in getattr(args, "_outputs", ())]


def existing_file(path: str) -> str:
    """argparse type: a path that is a file."""
    if not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"no such file: {path!r}")
    return path


def check_writable(path, option: str, *, directory: bool = False, make_parents: bool = False) -> None:
    """Raise UsageError, naming the option, if `path` cannot be written, so a run fails before
    its work instead of losing it at the end. Leaves nothing behind: an existing file is opened
    for append and closed, a folder is probed with a temporary file that is deleted at once.
    directory: `path` is a folder to write into (the command creates it if missing);
    make_parents: the command creates missing parent folders too.
    Used by check, bench and gsm8k on their output paths; golden's --json/--dir can call it too."""
    import tempfile
    p = os.path.abspath(os.fspath(path))
    what = f"{option} {os.fspath(path)}"
    if os.path.exists(p) and directory != os.path.isdir(p):
        raise UsageError(f"{what}: is {'not ' if directory else ''}a directory")
    if os.path.exists(p) and not directory:
        target, probe = p, lambda: open(p, "a").close()
    else:
        target = p if os.path.exists(p) else os.path.dirname(p)
        if make_parents:
            while not os.path.exists(target):
                target = os.path.dirname(target)
        if not os.path.isdir(target):
            why = "is not a directory" if os.path.exists(target) else "does not exist"
            raise UsageError(f"{what}: {target} {why}")
        probe = lambda: tempfile.TemporaryFile(dir=target).close()  # noqa: E731
    try:
        probe()
    except OSError as e:
        raise UsageError(f"{what}: cannot write to {target}: {e.strerror or e}") from None


SUBCOMMANDS = ("pq2verify.check_cli", "pq2verify.golden_cli", "pq2verify.gsm8k.cli", "pq2verify.bench_cli",
               "pq2verify.selftest_cli", "pq2verify.replay_cli", "pq2verify.fuzz_cli")


DESCRIPTION = """\
pq2verify: the verification suite of the PQ2_0 ternary matrix kernels (Triton). It checks every
kernel path against FP64 references, freezes their output bytes per backend, gates a kernel
change on the real activations of a model, times the paths on a GPU, and measures its own power
with deliberately broken kernels. Without a GPU the kernels run under Triton's interpreter."""


def _epilog() -> str:
    from .outputs import EXIT_CODES
    codes = "\n".join(f"  {k:<4}{v}" for k, v in EXIT_CODES.items())
    return f"""\
each command has its own --help.

exit codes:
{codes}

examples (from the checkout; ./pq2 sets up .venv on first use):
  ./pq2 check                               the verdict table on this machine's default shapes
  ./pq2 --device cpu check --paths native --m 1 --json r.json
  ./pq2 --list-cases check                  case ids; each runs as: ./pq2 check --case ID"""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pq2verify", description=DESCRIPTION, epilog=_epilog(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                    help="cuda, or cpu with Triton's interpreter (default: cuda if present)")
    ap.add_argument("--version", action="version", version=f"pq2verify {_version()}")
    ap.add_argument("--list-paths", action="store_true", help="print the registry's kernel paths and exit")
    ap.add_argument("--list-cases", metavar="PROFILE", default=None,
                    help="print the case ids of a profile (check, golden, bench, selftest) on this "
                         "backend and exit; every one runs as `check --case ID` (golden ids also as "
                         "`golden verify --case ID`)")
    sub = ap.add_subparsers(dest="command")
    for name in SUBCOMMANDS:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        mod.register(sub)
    return ap


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("pq2verify")
    except PackageNotFoundError:
        return "unknown (not installed)"


def list_paths() -> str:
    from . import registry
    rows = [("path", "set", "M", "weight", "layouts", "arithmetic", "claims", "note")]
    for p in registry.PATHS:
        claims = ", ".join(f"{k} {v}" for k, v in (("bytes ==", p.bit_identical_to), ("dots ==", p.dots_equal_to)) if v)
        rows.append((p.name, p.kset, p.m_range(), p.weight, "/".join(p.layouts), p.arithmetic, claims or "-",
                     "deselected" if p.deselected else ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    from kernels import backend, dispatch
    from . import outputs
    try:
        backend.select(args.device)
    except (RuntimeError, ValueError) as e:
        print(f"pq2verify: {e}", file=sys.stderr)
        return 2
    listing = [o for o, v in (("--list-paths", args.list_paths), ("--list-cases", args.list_cases is not None)) if v]
    if listing and (len(listing) > 1 or args.command is not None):
        print(f"pq2verify: error: {listing[0]} prints and exits; it does not combine with "
              f"{listing[1] if len(listing) > 1 else 'the command ' + repr(args.command)}", file=sys.stderr)
        return 2
    if args.list_paths:
        print(list_paths())
        return 0
    if args.list_cases is not None:
        from . import cases
        try:
            todo = cases.profile(args.list_cases, backend.golden_key())
        except ValueError as e:
            print(f"pq2verify --list-cases: error: {e}", file=sys.stderr)
            return 2
        print("\n".join(c.id for c in todo))
        return 0
    if args.command is None:
        ap.print_usage(sys.stderr)
        print("pq2verify: error: a command is required (check, golden, gsm8k, bench, selftest, ...)",
              file=sys.stderr)
        return 2
    try:
        try:
            dispatch.validate_env()    # a typo'd PQ2_* variable would silently change what runs
            spec = dispatch.KernelSpec.from_env()    # the set and switches, read once for the command
        except ValueError as e:
            raise UsageError(str(e)) from None
        from . import backend_status
        warn = backend_status.announce(args)   # no record or capture: exact = legacy, golden verifies nothing
        if warn:
            print(warn, file=sys.stderr)
        with dispatch.use(spec):
            return int(args.func(args) or 0)
    except UsageError as e:
        print(f"pq2verify {args.command}: error: {e}", file=sys.stderr)
        return 2
    except outputs.WriteError as e:
        print(f"pq2verify {args.command}: error: {e}\n  the verdict printed above stands; exit "
              f"{outputs.EXIT_WRITE} means an output could not be written", file=sys.stderr)
        return outputs.EXIT_WRITE
    except KeyboardInterrupt:
        print("pq2verify: interrupted; results written so far are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    # `python -m pq2verify.cli`: run the importable module's main, so that the UsageError the
    # subcommands raise (pq2verify.cli.UsageError) is the class caught there
    from pq2verify.cli import main as _main
    sys.exit(_main())
