"""compute-sanitizer over every registry path on small shapes: racecheck, memcheck, initcheck and
synccheck, with a verdict per (path, tool). GPU only.

  python3 -m pq2verify.sanitize [--paths a,b] [--tools memcheck,racecheck] [--out DIR]

Each tool runs one child process (`--child`) under compute-sanitizer; the child calls every
path at each M it serves (of 1, 2, 16, 17, 33), both layouts, with group dots where the path
has them, and prints a marker line per path, so errors are attributed to the path that ran.
The caching allocator is off in the child, so every tensor is its own allocation and an
access past an output's end is an access outside any allocation (memcheck sees it).
A path whose arithmetic is a library call (registry.Path.library) is judged beside a control
that runs the library alone: a finding the control reproduces is reported as the library's
(H200, 2026-11-30: initcheck flags every copy of torch.matmul's output, cuBLAS alone too).
"""
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
SHAPES = {"pq2": (200, 640), "dense": (96, 384)}
MS = (1, 2, 16, 17, 33)
MARK = "pq2-sanitize-path"


def control():
    """The library alone (torch.matmul, then a copy of its output), with no pq2verify code: what
    a tool reports here belongs to the library, not to a path that calls it."""
    import torch
    print(f"{MARK} control begin", flush=True)
    for m in MS:
        for dt in (torch.bfloat16, torch.float16):
            x = torch.randn(m, SHAPES["dense"][1], device="cuda", dtype=dt)
            w = torch.randn(SHAPES["dense"][0], SHAPES["dense"][1], device="cuda", dtype=dt)
            torch.matmul(x, w.t()).clone()
            torch.cuda.synchronize()
    print(f"{MARK} control end", flush=True)


def child(names):
    import torch
    from kernels import backend
    from pq2verify import graphs, registry
    backend.select("cuda")
    if any(registry.get(n).library for n in names):
        control()
    for name in names:
        p = registry.get(name)
        print(f"{MARK} {name} begin", flush=True)
        n, k = SHAPES[p.weight]
        for m in (m for m in MS if p.serves(m)):
            for layout in p.layouts:
                x, w = graphs.make_inputs(p, m, n, k, layout=layout, seed=m, device="cuda")
                out = torch.empty(m, n, dtype=x.dtype, device="cuda")
                if p.has_dots:
                    dots = torch.empty(m, n, w.groups, dtype=torch.int32, device="cuda")
                    p.kernel()(x, w, out=out, dots=dots)
                else:
                    p.kernel()(x, w, out=out)
                torch.cuda.synchronize()
        print(f"{MARK} {name} end", flush=True)


def parse(log: str, names) -> dict:
    """path -> (finished, error count) from a child's log under one tool."""
    res, cur = {n: [False, 0] for n in (*names, "control")}, None
    for line in log.splitlines():
        m = re.search(rf"{MARK} (\S+) (begin|end)", line)
        if m:
            cur = m.group(1) if m.group(2) == "begin" else None
            if m.group(2) == "end":
                res[m.group(1)][0] = True
            continue
        if cur and re.match(r"=+ +(Invalid|Race|Uninitialized|Barrier|Error|Program hit|.*hazard)", line):
            res[cur][1] += 1
    return res


def judge(log: str, names, library: dict) -> tuple[dict, bool, str]:
    """(path -> verdict, passed, summary line) of one tool's log. A finding in a library path
    that the library alone (the control) also shows is the library's; any other finding, an
    unfinished path, or an error the markers do not place fails."""
    # memcheck, initcheck, synccheck: "ERROR SUMMARY: N errors"; racecheck: "(N errors, W warnings)"
    m = re.search(r"ERROR SUMMARY: (\d+) error", log) or re.search(r"RACECHECK SUMMARY: .*\((\d+) error", log)
    total = int(m.group(1)) if m else -1
    found = parse(log, names)
    unattributed = total - sum(e for _, e in found.values()) if total >= 0 else None
    ctrl_done, ctrl_errs = found.pop("control")
    verdicts, ours = {}, 0
    for name, (done, errs) in found.items():
        if done and errs == 0:
            v = "clean"
        elif not done:
            v, ours = "did not finish", ours + 1
        elif library.get(name) and ctrl_done and ctrl_errs:
            v = f"{errs} in {library[name]}; its control alone: {ctrl_errs}"
        else:
            v, ours = f"{errs} error(s)", ours + 1
        verdicts[name] = v
    good = ours == 0 and unattributed == 0
    return verdicts, good, (f"error summary={total}; control (library alone): {ctrl_errs}; "
                            f"not attributed to a path: {unattributed}")


def main():
    ap = argparse.ArgumentParser(prog="python -m pq2verify.sanitize", description=__doc__.splitlines()[0])
    ap.add_argument("--paths", default=None)
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--out", default=os.environ.get("OUT", "runs/sanitize"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from pq2verify import registry
    names = args.paths.split(",") if args.paths else [p.name for p in registry.PATHS]
    for n in names:
        registry.get(n)
    if args.child:
        return child(names)
    tools = args.tools.split(",")
    bad = [t for t in tools if t not in TOOLS]
    if bad:
        sys.exit(f"--tools: unknown {bad}; expected some of {', '.join(TOOLS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1", PYTHONUNBUFFERED="1")
    table, ok = {}, True
    for tool in tools:
        # every error printed: one not printed cannot be attributed to its path
        cmd = ["compute-sanitizer", f"--tool={tool}", "--print-limit=1000000",
               sys.executable, "-m", "pq2verify.sanitize", "--child", "--paths", ",".join(names)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        log = r.stdout + r.stderr
        (out / f"sanitize-{tool}.log").write_text(log)
        verdicts, good, line = judge(log, names, {n: registry.get(n).library for n in names})
        for name, v in verdicts.items():
            table.setdefault(name, {})[tool] = v
        print(f"{tool}: rc={r.returncode} {line}", flush=True)
        ok &= good
    lines = ["| path | " + " | ".join(tools) + " |", "|---" * (len(tools) + 1) + "|"]
    lines += [f"| {n} | " + " | ".join(table[n][t] for t in tools) + " |" for n in names]
    text = "\n".join(lines) + "\n"
    (out / "sanitizer.md").write_text(text)
    print(text)
    print("SANITIZER", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main() or 0)
