"""The decode kernels compiled for sm_90 without a GPU (Triton's compiler for target cuda:90,
ints specialized as the JIT does: divisible by 16, or equal to 1; Triton's bundled cuobjdump),
for two checks that need no GPU:

    python -m pq2verify.sm90 loop --n 34816 --k 5120 --m 16 [--module old_small_mma.py] [--config JSON] [--json]
        small_mma's main loop: instructions per trip and warp-instructions per weight byte (a
        decode call's issue budget at 4.6 TB/s is ~0.23; tests/test_sass_budget.py)
    python -m pq2verify.sm90 prefill --n 34816 --k 5120 --m 2048 [--config JSON] [--json]
        mmq_wgmma's Gluon kernel: registers, shared memory and its per-group loop (tests/test_mmq_wgmma.py
        holds it to four MMAs a group, no local memory, and three programs an SM)
    python -m pq2verify.sm90 pdl [--json] [--module small_mma=FILE] [--old-list]
        every kernel launched with programmatic dependent launch (gemv, small_mma, the quantize
        kernel), once per compiled specialization, for every shape and M the bench, the GPU
        check and the GSM8K model run (single-split included): no global write and no read of
        anything but the weights before griddepcontrol.wait (pq2verify.sm90.ptx;
        tests/test_pdl_order.py); exit 1 on a violation
    python -m pq2verify.sm90 resources [--json] [--only PATHS] [--config PATH=JSON] [--model] [--table F] [--record F]
        the resource gate: every config the choosers return for the bonsai27b shapes at the
        bench's and the check's Ms (--model: the GSM8K model's too), once per compiled
        specialization: registers, local memory (spills), shared memory and programs per SM
        (pq2verify.sm90.resources), against pq2verify/verified/resources-sm90.json; exit 1 on a
        spill, an occupancy below the recorded one, or a specialization not recorded
        (tests/test_resource_gate.py); --record F writes the table instead of judging

Run it with TRITON_INTERPRET unset: the interpreter's kernels do not compile.
"""
import argparse
import json
import re
import shlex
import sys

from pq2verify.cli import UsageError, existing_file, positive_int

from . import compiler, gate, pdl
from .launches import RESOURCE_PATHS, small_mma_launch


def compile_loop(mod, n, k, m, force=None):
    """(config, SASS, registers) of small_mma's kernel."""
    cfg, args, opts = small_mma_launch(mod, n, k, m, force)
    kern, _ = compiler.compile_sm90(*args, **opts)
    return (cfg, *compiler.sass_and_registers(kern))


LIMIT = {"registers": "regs", "shared": "smem", "warps": "warp", "blocks": "blks"}


def resources_main(a, ap):
    from pq2verify import outputs
    from . import resources
    force = {}
    for spec in a.config:
        name, eq, text = spec.partition("=")
        if not eq or name not in RESOURCE_PATHS:
            ap.error(f"argument --config: expected PATH=JSON with PATH one of {', '.join(RESOURCE_PATHS)}, "
                     f"got {spec!r}")
        if name in force:
            ap.error(f"argument --config: {name} given twice")
        try:
            force[name] = json.loads(text)
        except json.JSONDecodeError as e:
            ap.error(f"argument --config: {name}: not JSON: {e}")
        if not isinstance(force[name], dict):
            ap.error(f"argument --config: {name}: expected a JSON object, got {text!r}")
    only = None
    if a.only is not None:
        only = set(a.only.split(","))
        if not a.only or only - set(RESOURCE_PATHS):
            ap.error(f"argument --only: expected names from {', '.join(RESOURCE_PATHS)}, got {a.only!r}")
    recording = a.record is not None
    if recording and (only or force):
        ap.error("argument --record: records the whole table; not with --only or --config")
    if recording:
        a.model = True          # the table holds both runs' specializations
    recorded = {}
    if not recording:
        try:
            recorded = resources.load(a.table)
        except ValueError as e:
            ap.error(f"argument --table: {e}")
    try:
        outputs.check(outputs=[("--record", a.record)] if recording else [],
                      inputs=[("--table", a.table)] if not recording else [])
    except UsageError as e:     # the option is named
        ap.error(str(e))
    try:
        gate.resource_launches(force, only, a.model)   # forced fields checked before any compile
    except (ValueError, TypeError) as e:
        ap.error(f"argument --config: {e}")
    rows = gate.resources_report(force, only, recorded, a.model)
    if recording:
        text = resources.record(rows)
        if a.json:
            print(json.dumps(rows))
        outputs.write_text(a.record, text, "--record")
        print(f"{len(rows)} specializations recorded in {a.record}", file=sys.stderr if a.json else sys.stdout)
        return 0
    bad = [r for r in rows if not resources.passed(r["verdict"])]
    if a.json:
        print(json.dumps(rows))
        return 1 if bad else 0
    print(f"{'kernel':<11} {'config | variant':<70} {'regs':>4} {'spill B':>7} {'shared KB':>9} {'prog/SM':>7} "
          f"{'recorded':>8}  verdict")
    for r in rows:
        cs = " ".join(f"{x}={v}" for x, v in sorted(r["config"].items()))
        print(f"{r['kernel']:<11} {cs + ' | ' + r['variant']:<70} {r['registers']:>4} {r['local']:>7} "
              f"{(r['static_shared'] + r['shared']) / 1024:>9.1f} {r['programs']:>2} {LIMIT[r['limit']]:<4} "
              f"{'-' if r['recorded'] is None else r['recorded']:>8}  {r['verdict']}")
    gone = resources.stale(rows, recorded, a.model) if not only and not force else []
    for key in gone:
        print(f"note: recorded but no longer compiled (a chooser changed; re-record): {key}")
    known = sum(r["local"] > 0 and resources.passed(r["verdict"]) for r in rows)
    print(f"{len(rows)} specializations, {len(bad)} failing, {known} with a known spill; "
          f"{sum(r['compile_s'] for r in rows):.1f} s compiling"
          + ("" if not bad else f"; reproduce: TRITON_INTERPRET=0 .venv/bin/python -m pq2verify.sm90 "
                                f"{shlex.join(a.argv)}"))
    return 1 if bad else 0


def add_shape_args(parser) -> None:
    """--n, --k, --m of a decode shape to compile (gate_up at M = 16 by default)."""
    parser.add_argument("--n", type=positive_int, default=34816)
    parser.add_argument("--k", type=positive_int, default=5120, help="a multiple of 128")
    parser.add_argument("--m", type=positive_int, default=16, help="1-16")


def shape_error(a, name: str = "small_mma", lo: int = 1, hi: int | None = 16) -> str | None:
    """Why add_shape_args' values cannot be compiled for the kernel `name`, which compiles for
    M in lo..hi (hi None: no bound), or None. small_mma's kernel compiles for M 1-16."""
    if a.k % 128:
        return f"argument --k: expected a multiple of 128 (a Q8 group), got {a.k}"
    if a.m < lo or (hi is not None and a.m > hi):
        return f"argument --m: {name} serves M {f'{lo}+' if hi is None else f'{lo}-{hi}'}, got {a.m}"
    return None


def prefill_report(a, ap):
    from pq2verify import registry
    p = registry.get("mmq_wgmma")
    why = shape_error(a, p.name, p.m_min, p.m_max)
    if why:
        ap.error(why)
    from kernels import mmq_wgmma
    try:
        mmq_wgmma.fold(a.n, a.k, a.m, interpret=False, config=a.config)    # each field checked
    except (ValueError, TypeError) as e:
        ap.error(f"argument --config: {e}")
    cfg, kern = compiler.wgmma_compile(a.n, a.k, a.m, a.config)
    sass, regs = compiler.sass_and_registers(kern)
    # the per-group loop: the shortest backward branch around the MMAs (an mbarrier wait's retry
    # branch can make a longer one around it)
    body = sorted((dict(first=lo, last=hi, instructions=sum(ops.values()), ops=dict(ops.most_common()))
                   for lo, hi, ops in compiler.loops(sass) if ops.get("IGMMA")), key=lambda b: b["instructions"])[:1]
    rep = dict(config=cfg, registers=int(regs), shared=kern.metadata.shared, local=len(re.findall(r"\b(?:LDL|STL)\b", sass)),
               loops=body)
    if a.json:
        print(json.dumps(rep))
        return
    print(f"config {cfg}; {regs} registers, {rep['shared']} bytes of shared memory, {rep['local']} local-memory "
          f"instructions")
    for lp in body:
        print(f"loop {lp['first']:#x}-{lp['last']:#x}: {lp['instructions']} instructions a group and thread; "
              f"{dict(list(lp['ops'].items())[:12])}")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m pq2verify.sm90")
    sub = ap.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("loop", help="small_mma's loop: instructions per weight byte")
    add_shape_args(lp)
    lp.add_argument("--module", type=existing_file, default=None,
                    help="a small_mma.py to compile instead of kernels/small_mma.py")
    lp.add_argument("--config", type=json.loads, default=None, help='fields over the chooser\'s, e.g. \'{"UNROLL": 2}\'')
    lp.add_argument("--json", action="store_true", help="one JSON object instead of text")
    pp = sub.add_parser("pdl", help="the PDL kernels: nothing but weights touched before griddepcontrol.wait")
    pp.add_argument("--json", action="store_true", help="one JSON object instead of text")
    pp.add_argument("--module", action="append", default=[], metavar="PATH_NAME=FILE",
                    help=f"a kernel file to compile instead of that path's ({', '.join(pdl.PDL_PATHS)}); repeatable")
    pp.add_argument("--only", default=None, metavar="NAMES",
                    help="comma-separated kernels to compile: gemv, small_mma, quantize (default: all)")
    pp.add_argument("--old-list", action="store_true", help="only 5f06600's six launches (to show what it missed)")
    fp = sub.add_parser("prefill", help="mmq_wgmma's Gluon kernel: registers, shared memory, its loop")
    add_shape_args(fp)
    fp.set_defaults(m=2048)
    fp.add_argument("--config", type=json.loads, default=None, help='fields over the chooser\'s, e.g. \'{"BN": 128}\'')
    fp.add_argument("--json", action="store_true", help="one JSON object instead of text")
    rp = sub.add_parser("resources", help="every chooser config: registers, spills, shared memory, programs per SM")
    rp.add_argument("--json", action="store_true", help="one JSON list instead of the table")
    rp.add_argument("--only", default=None, metavar="NAMES",
                    help=f"comma-separated paths to compile: {', '.join(RESOURCE_PATHS)} (default: all)")
    rp.add_argument("--config", action="append", default=[], metavar="PATH=JSON",
                    help='fields over a path\'s chooser, e.g. \'small_mma={"num_warps": 8}\'; repeatable')
    rp.add_argument("--model", action="store_true",
                    help="the GSM8K model's shapes too (about 520 compiles; the table records both)")
    rp.add_argument("--table", type=existing_file, default=None,
                    help="the recorded table (default: pq2verify/verified/resources-sm90.json)")
    rp.add_argument("--record", default=None, metavar="FILE",
                    help="write the compile's whole table (--model implied; measured occupancies kept) to FILE "
                         "instead of judging")
    argv = sys.argv[1:] if argv is None else list(argv)
    a = ap.parse_args(argv)
    a.argv = argv       # the repro line
    if a.cmd == "resources":
        if a.table is None:
            from . import resources
            a.table = str(resources.RECORDED)
        return resources_main(a, rp)
    if a.cmd == "prefill":
        return prefill_report(a, ap)
    if a.cmd == "pdl":
        modules = {}
        for spec in a.module:
            name, eq, path = spec.partition("=")
            if not eq or name not in pdl.PDL_PATHS:
                ap.error(f"argument --module: expected PATH_NAME=FILE with PATH_NAME one of {', '.join(pdl.PDL_PATHS)}, "
                         f"got {spec!r}")
            if name in modules:
                ap.error(f"argument --module: {name} given twice")
            try:
                path = existing_file(path)
            except (argparse.ArgumentTypeError, ValueError) as e:
                ap.error(f"argument --module: {e}")
            modules[name] = compiler.load(path, name)
        only = None
        if a.only is not None:
            only = set(a.only.split(","))
            if not a.only or only - set(pdl.WEIGHTS):
                ap.error(f"argument --only: expected names from {', '.join(pdl.WEIGHTS)}, got {a.only!r}")
        rep = pdl.pdl_report(modules, old=a.old_list, only=only)
        if a.json:
            print(json.dumps(rep))
            return
        for r in rep:
            print(f"{r['kernel']}: {'OK' if not r['violations'] else 'VIOLATION'}; "
                  f"{len(r['reads_of_weights'])} weight reads before the wait; {len(r['uses'])} uses; "
                  f"compiled in {r['compile_s']:.2f} s")
            for v in r["violations"]:
                print("   ", v)
        bad = sum(bool(r["violations"]) for r in rep)
        print(f"{len(rep)} PDL launches, {bad} with violations; {sum(r['compile_s'] for r in rep):.1f} s compiling")
        return 1 if bad else 0
    if shape_error(a):
        ap.error(shape_error(a))
    mod = compiler.load(a.module)
    if a.config is not None:
        if not isinstance(a.config, dict):
            ap.error(f"argument --config: expected a JSON object, got {a.config!r}")
        try:
            mod.fold(a.n, a.k, a.m, interpret=False, config=a.config)    # each field checked (pq2verify.tiles)
        except ValueError as e:
            ap.error(f"argument --config: {e}")
    cfg, sass, regs = compile_loop(mod, a.n, a.k, a.m, a.config)
    out = []
    for lo, hi, ops in compiler.loops(sass):
        total = sum(ops.values())
        out.append(dict(first=lo, last=hi, instructions=total, ops=dict(ops.most_common()),
                        warp_instructions_per_byte=total * cfg["num_warps"] / (cfg["BN"] * 32 * cfg["UNROLL"])))
    if a.json:
        print(json.dumps(dict(config=cfg, registers=int(regs), loops=out)))
        return
    print(f"config {cfg}; {regs} registers")
    for lp in out:
        print(f"loop {lp['first']:#x}-{lp['last']:#x}: {lp['instructions']} instructions a trip ({cfg['UNROLL']} groups) "
              f"and thread, {lp['warp_instructions_per_byte']:.3f} warp-instructions per weight byte; "
              f"{dict(list(lp['ops'].items())[:12])}")

