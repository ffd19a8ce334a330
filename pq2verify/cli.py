"""The pq2verify command. Each subcommand lives in its own module exposing
`register(subparsers)`, which adds its parser and sets `func` (args -> exit code)."""
import argparse
import importlib
import sys

class UsageError(Exception):
    """Bad command-line input found after parsing (an unknown path, a bad set): main prints it,
    naming the option, and exits with status 2, as argparse does for its own errors."""


SUBCOMMANDS = ("pq2verify.check_cli", "pq2verify.golden_cli", "pq2verify.gsm8k.cli", "pq2verify.bench_cli")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pq2verify", description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                    help="cuda, or cpu with Triton's interpreter (default: cuda if present)")
    sub = ap.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        mod.register(sub)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from . import backend
    try:
        backend.select(args.device)
    except (RuntimeError, ValueError) as e:
        print(f"pq2verify: {e}", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        print(f"pq2verify {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pq2verify: interrupted; results written so far are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    # `python -m pq2verify.cli`: run the importable module's main, so that the UsageError the
    # subcommands raise (pq2verify.cli.UsageError) is the class caught there
    from pq2verify.cli import main as _main
    sys.exit(_main())
