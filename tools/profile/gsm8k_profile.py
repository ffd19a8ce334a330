"""Profile a small GSM8K A/B in one command: its wall time, each run's seconds per phase and a
cProfile top-N (cumulative).

    python tools/profile/gsm8k_profile.py                        # on the GPU: --device cuda --limit 8
    python tools/profile/gsm8k_profile.py --device cpu --limit 2 --max-new-tokens 16
    python tools/profile/gsm8k_profile.py --jobs 3               # the GPU default: B and F in worker processes

Extra arguments go to `pq2verify gsm8k` (e.g. --no-floor, --batch-size 8). The run goes to a new
directory (--out, default a temporary one), so nothing is resumed. Phases are timed with the GPU
synchronized after each forward (PQ2VERIFY_PHASE_SYNC=1). With --jobs 1 (default here) every run
is in the profiled process; with more, cProfile sees run A and its teacher-forced followers only.
"""
import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import cProfile  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pstats  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--top", type=int, default=30, help="cProfile rows printed (cumulative time)")
    p.add_argument("--out", default=None, help="directory for the run, its report and the profile")
    given = sys.argv[1:] if argv is None else list(argv)
    args, extra = p.parse_known_args(given)
    for name in ("limit", "jobs", "top"):
        if getattr(args, name) < 1:
            p.error(f"--{name} {getattr(args, name)}: expected an integer >= 1")
    out = Path(args.out or tempfile.mkdtemp(prefix="gsm8k-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    prof, run_dir = out / "gsm8k.prof", out / "run"
    argv = ["--device", args.device, "gsm8k", "--a", "legacy", "--b", "tuned", "--limit", str(args.limit),
            "--jobs", str(args.jobs), "--out", str(run_dir), *extra]
    again = "python tools/profile/gsm8k_profile.py " + " ".join(given)
    print("+ pq2verify " + " ".join(argv), file=sys.stderr)
    os.environ["PQ2VERIFY_PHASE_SYNC"] = "1"
    from pq2verify import cli                  # imported here: its import time is in the profile's wall
    profiler = cProfile.Profile()
    with open(out / "stdout.md", "w") as log, contextlib.redirect_stdout(log):    # the report's Markdown
        rc = profiler.runcall(cli.main, argv)
    wall = time.perf_counter() - T0
    profiler.dump_stats(str(prof))
    if rc != 0:          # its own error is printed above; what it did is still profiled
        print(f"gsm8k_profile: the run exited {rc}; rerun: {again}", file=sys.stderr)
    print(f"# gsm8k --limit {args.limit} on {args.device} (--jobs {args.jobs}): wall {wall:.1f} s "
          f"(from this tool's start, imports included; exit {rc})")
    rep_file = run_dir / "report.json"
    if rep_file.exists():
        rep = json.loads(rep_file.read_text())
        print(f"run wall time {rep.get('wall_seconds')} s; model load and conversion "
              f"{rep['model'].get('convert_seconds')} s")
        for r in rep["runs"]:
            ph = ", ".join(f"{k} {v:.1f}" for k, v in (r.get("phases") or {}).items())
            spec = r["spec"] + (f", folds reversed at M {r['fold_reversed_m']}" if r.get("fold_reversed_m") else "")
            print(f"run {r['label']} ({spec}): {r['tokens']} tokens, {r['seconds']} s in generation; "
                  f"phases: {ph or 'none recorded'}"
                  + (f"; {r['copied_calls']} prefill calls copied" if r.get("copied_calls") else ""))
    print(f"\n# cProfile, top {args.top} by cumulative time ({prof})")
    pstats.Stats(str(prof), stream=sys.stdout).strip_dirs().sort_stats("cumulative").print_stats(args.top)
    return rc


if __name__ == "__main__":
    sys.exit(main())
