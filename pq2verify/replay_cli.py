"""pq2verify replay: every captured projection call of the GSM8K model, run under kernel spec A
and B on the same real activations and compared with the FP64 references and with each other
(pq2verify.replay). The gate for a kernel change.

  pq2verify replay --a legacy --b tuned                        # exit 1 on FAIL, with repro lines
  pq2verify replay --a legacy --b tuned --fault scale_ulp      # B with a planted fault: must FAIL
  pq2verify replay --a legacy --b tuned --faults all --markdown results/2026-11-30-replay-separation/replay-faults.md

Linked chains (pq2verify.chain): where the selection holds a layer's mlp.gate_proj+up_proj and
mlp.down_proj, each captured gate_up input also runs gate_up -> silu(gate)*up -> down end to end
through A's and through B's kernels against an FP64 chain, with its own derived bound; on by
default when the selection has such a pair (--chains demands one, --no-chains skips them). The
planted fault `coherent` passes every per-call check and must fail the chain; it can only where
the gate_up path's per-element bound leaves it room (a floating path; integer paths: chain.NO_ROOM):
  pq2verify replay --b legacy,int_gemv=off --layers model.layers.0.mlp. --m 1 --faults none,coherent

--faults runs B unchanged, the fold-order control and every planted fault against one A run and
prints the separation table; it exits 0 only if each got its expected verdict. A and B must
dispatch to different paths (or fold orders) on every call compared, else it is refused.
Exit status: 0 pass; 1 FAIL (a call or a linked chain); 2 bad arguments, a capture or model that
cannot be replayed, or an A/B that compares a path with itself; 3 an output file could not be
written (the verdict stands).
"""
import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

from . import cli
from .cli import UsageError, check_writable, names, nonempty, nonneg_ints, positive_int, positive_ints

# every directed fault with its opposite: a judge that looks one way only fails the other
SEPARATION = ("none", "fold_reversed", "scale_ulp", "scale_ulp_down", "scale_1pct", "scale_1pct_down",
              "scale_1pct:all", "drop_group", "stale_tile", "round_up", "round_down")


def default_ms() -> tuple:
    """The decode Ms replayed by default, from the path table: each M where a decode path's
    range begins or ends next to another's (m_min, m_max + 1) and the largest decode M, so every
    path a kernel set picks for decode runs at its edges (1, 2, 3, 16 for the runtime's table)."""
    from kernels import table
    bounded = [p for p in table.all_paths() if p.m_max is not None]
    top = max((p.m_max for p in bounded), default=1)     # a table of open ranges only: M = 1
    edges = {p.m_min for p in table.all_paths()} | {p.m_max + 1 for p in bounded} | {top}
    return tuple(sorted(m for m in edges if 1 <= m <= top))


def _ms(s: str) -> tuple:
    return tuple(sorted(set(positive_ints(s))))


def register(sub) -> None:
    from . import replay
    p = sub.add_parser("replay", help="every captured model projection under two kernel specs, against FP64",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", default="legacy", type=nonempty, help="kernel spec A: legacy|exact|tuned[,path=on|off...] (default legacy)")
    p.add_argument("--b", default="tuned", type=nonempty, help="kernel spec B (default tuned)")
    p.add_argument("--capture", default=None, type=nonempty, help="model capture directory (default: golden/<backend>/model, "
                   "else golden/sm90/model)")
    p.add_argument("--capture-first", action="store_true",
                   help="first record the model's calls into --capture DIR (golden capture --model's recorder; "
                        "on the CPU through --cpu-backend): for a model changed since the committed capture")
    p.add_argument("--positions", type=nonneg_ints, default=None,
                   help="decode positions to replay (default: all captured)")
    p.add_argument("--layers", default=None, type=nonempty, help="only weights whose name contains this text")
    p.add_argument("--limit", type=positive_int, default=None,
                   help="first N captured calls of the selection (the M > 1 calls are built from them)")
    ms = default_ms()
    cli.add_m_option(p, type=_ms, default=ms, metavar="M,..",
                     help=f"call sizes replayed (default {','.join(map(str, ms))}: where the path "
                          "table's decode ranges begin and end): M = 1 one call per captured position; M > 1 two "
                        "calls per weight of its captured rows repeated to M rows, so the paths serving decode "
                        "batches run on real activations too")
    one = p.add_mutually_exclusive_group()
    one.add_argument("--fault", default=None, type=nonempty, help="B-side variant NAME[:WHERE], WHERE all | a layer index | a name "
                     "substring; NAME: " + "; ".join(f"{k}: {v[1]}" for k, v in replay.FAULTS.items()))
    one.add_argument("--faults", default=None, help="'all' or a comma list of variants ('none' = B unchanged): "
                     "the separation table")
    p.add_argument("--chains", default=None, action=argparse.BooleanOptionalAction,
                   help="linked gate_up -> silu*up -> down chains (default: on where the selection holds a layer's "
                        "gate_up and down; --chains: refuse a selection without one)")
    cli.add_output(p, "--json", help="write every call's metrics to this file")
    cli.add_output(p, "--markdown", help="write the report as Markdown to this file")
    p.add_argument("--cpu-backend", default="emulate", choices=("emulate", "interpreter"),
                   help="on the CPU: torch emulation of each path (default) or Triton's interpreter (slow)")
    p.set_defaults(func=main)


def _base(args, device) -> list:
    cpu = ["--cpu-backend", args.cpu_backend] if device == "cpu" else []
    return ["pq2verify", "--device", device, "replay"] + cpu + ["--a", args.a, "--b", args.b]


def command(args) -> str:
    """The command line that reproduces this run (from the parsed options, not sys.argv)."""
    from kernels import backend
    env = [f"{k}={os.environ[k]}" for k in ("PQ2_EMULATE_GEMM",) if os.environ.get(k)]
    parts = env + _base(args, backend.device()) + (["--capture-first"] if args.capture_first else [])
    for opt in ("capture", "layers", "limit", "fault", "faults", "json", "markdown"):
        v = getattr(args, opt)
        if v is not None:
            parts += [f"--{opt}", str(v)]
    if getattr(args, "chains", None) is not None:
        parts += ["--chains" if args.chains else "--no-chains"]
    if args.positions is not None:
        parts += ["--positions", ",".join(map(str, args.positions))]
    if tuple(args.m) != default_ms():
        parts += ["--m", ",".join(map(str, args.m))]
    return shlex.join(parts)


def _capture_dir(args) -> Path:
    from kernels import backend
    from . import replay
    return Path(args.capture) if args.capture else replay.default_capture(backend.golden_key())


def main(args) -> int:
    from kernels import backend
    from . import outputs, replay
    faults = _fault_specs(args)          # option values first: nothing is loaded yet
    if args.capture_first:
        if not args.capture:
            raise UsageError("--capture-first: needs --capture DIR, where the capture is written")
        check_writable(args.capture, "--capture", directory=True, make_parents=True)
    capture = _capture_dir(args)
    # the capture is an input (or, with --capture-first, a folder this run writes): no output in it
    outputs.check(cli.output_paths(args),
                  [] if args.capture_first else [("--capture", capture)],
                  folders=[("--capture", capture)] if args.capture_first else [])
    from .gsm8k.runs import parse_spec
    specs = []
    for opt in ("a", "b"):
        try:
            specs.append(parse_spec(getattr(args, opt)))
        except ValueError as e:
            raise UsageError(f"--{opt}: {e}") from None
    spec_a, spec_b = specs
    if spec_a == spec_b:          # decided without the capture: every call resolves alike
        raise UsageError(f"--a {args.a} and --b {args.b} are the same kernel spec: they resolve to the same path "
                         "and fold order on every call, and an A/B must compare two different things; choose an "
                         "--a and --b that dispatch to different paths")
    from .golden_model import ModelRunnerMissing
    opt = "--faults" if args.faults is not None else "--fault"
    try:
        for f in faults:     # before the model is loaded
            if f != "none":
                replay.check_fault_name(f, opt)
        with backend.using_cpu_backend(args.cpu_backend):
            return _main(args, spec_a, spec_b, capture)
    except replay.MissingCapture as e:
        raise UsageError(f"{e}; make it with: {capture_advice(args, capture)}") from None
    except (replay.ReplayError, ModelRunnerMissing) as e:
        raise UsageError(str(e)) from None


def capture_advice(args, capture: Path) -> str:
    """The commands, runnable from the checkout, that write a model capture into `capture`."""
    from kernels import backend
    dev = backend.device()
    rec = ["./pq2"] + _base(args, dev)[1:] + ["--capture", str(capture), "--capture-first"]
    out = f"`{shlex.join(rec)}` (records the model's calls there, then replays them)"
    if capture.name == "model":      # golden capture --model writes DIR/model
        gold = ["./pq2", "--device", dev, "golden", "capture", "--model", "--dir", str(capture.parent)]
        out += f", or `{shlex.join(gold)}` (writes {capture})"
    return out


def _fault_specs(args) -> list:
    """The B variants asked for; 'none' is B unchanged. An empty list or item is refused (it
    would silently mean B unchanged only)."""
    if args.faults is None:
        return [] if args.fault is None else [args.fault]
    try:
        specs = names(args.faults)
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"--faults: {e}; give 'all' or some of none, {', '.join(_known())}") from None
    if "all" in specs:
        if len(specs) > 1:
            raise UsageError(f"--faults {args.faults!r}: 'all' stands alone")
        return list(SEPARATION)
    return specs


def _known() -> list:
    from . import replay
    return list(replay.FAULTS)


def _variants(args, calls):
    from . import replay
    specs = _fault_specs(args) or ["none"]
    opt = "--faults" if args.faults is not None else "--fault"
    return [None if s == "none" else replay.parse_fault(s, calls, opt) for s in specs]


def refuse_same(args, rows: list) -> None:
    """A usage error where A and B resolve to the same path and fold order for some (kind, M):
    such an A/B compares a path with itself there and would pass whatever the path does."""
    same = [r for r in rows if r["same"]]
    if not same:
        return
    by_m = {}
    for r in same:
        by_m.setdefault(r["m"], []).append(r)
    what = "; ".join(f"M={m}: {', '.join(r['kind'] for r in rs)} both run {'/'.join(rs[0]['a'])} "
                     f"({rs[0]['a_fold']})" for m, rs in sorted(by_m.items()))
    ok = sorted({r["m"] for r in rows} - set(by_m))
    fix = (f"replay only the Ms where they differ (--m {','.join(map(str, ok))}) or choose another --a/--b"
           if ok else "choose an --a and --b that dispatch to different paths")
    raise UsageError(f"--a {args.a} and --b {args.b} resolve to the same path and fold order ({what}): an A/B "
                     f"must compare two different things on every call; {fix}")


def _main(args, spec_a, spec_b, capture: Path) -> int:
    from kernels import backend, dispatch
    from . import outputs, provenance, registry, replay
    from .golden_cli import model_runner
    device = backend.device()
    import torch
    key = dispatch.backend_key(torch.device(device))
    t0 = time.perf_counter()
    log = lambda s: print(s, file=sys.stderr)   # noqa: E731
    if args.capture_first:
        from . import golden_model
        golden_model.capture_model(capture, device, model_runner(), positions=args.positions or golden_model.POSITIONS,
                                   log=log)
    man, calls, weights = replay.load(capture, device, model_runner(), positions=args.positions, layers=args.layers,
                                      limit=args.limit, ms=args.m)
    names_ = list(weights)
    from . import chain
    chains = [] if args.chains is False else chain.chains_of(calls, weights, man.get("digits"))
    if args.chains and not chains:
        raise UsageError(f"--chains: {chain.missing_note(calls, weights)}")
    variants = _variants(args, calls)
    # what dispatch will run for A and B, decided from the shapes and Ms before any call
    planned = {"a": replay.resolve_paths(spec_a, calls, weights), "b": replay.resolve_paths(spec_b, calls, weights)}
    refuse_same(args, replay.same_thing(calls, weights, planned["a"], planned["b"], key))
    # a CPU capture is labelled 'interpreter' whichever CPU backend recorded it
    on = man.get("backend") if not (args.capture_first and device == "cpu") else \
        f"the CPU through the {args.cpu_backend} backend, by --capture-first"
    log(f"replay: {len(calls)} calls of {len(names_)} PQ2 weights from {capture} (model {man.get('model_id')}, "
        f"captured on {on}); backend {key} [{time.perf_counter() - t0:.1f}s]")
    refs, cache = replay.References(calls, weights), {}
    for v in variants:
        if v is not None:
            v.context = {"refs": refs, "weights": weights}
    outs_a = replay.run_side(spec_a, calls, weights, log=log, cache=cache)
    crefs = chain.Refs(chains, weights, refs) if chains else None
    chain_a = chain.run_side(spec_a, chains, weights) if chains else None
    runs, plain_b, ran = [], None, None
    for v in variants:
        t1 = time.perf_counter()
        outs_b = replay.run_side(spec_b, calls, weights, v, log=log, cache=cache)
        plain_b = outs_b if v is None else plain_b
        ran = ran or replay.same_thing(calls, weights, [o.path for o in outs_a], [o.path for o in outs_b], key)
        res = replay.evaluate(calls, refs, outs_a, outs_b, v, planned=planned, key=key)
        # how many calls the variant changed at all (a control that changes nothing proves nothing)
        res["changed_vs_b"] = None if plain_b is None else sum(
            not torch.equal(o.y.view(torch.int16), b.y.view(torch.int16)) for o, b in zip(outs_b, plain_b))
        res["fault"] = None if v is None else v.spec
        res["expected"] = "PASS" if v is None else replay.FAULTS[v.name][0]
        res["chain"] = None
        if chains:
            res["chain"] = chain.evaluate(chains, crefs, chain_a, chain.run_side(spec_b, chains, weights, v), v)
            res["chain"]["expected"] = chain.expected(v)
            if v is not None and v.name == chain.FAULT and all(
                    registry.get(x["b"]["paths"][0]).arithmetic == "integer" for x in res["chain"]["chains"]):
                # not plantable there: an integer path's bound leaves no room (chain.NO_ROOM); a fault
                # that cannot be planted is n/a, not an undetected fault
                res["chain"]["expected"] = None
                res["chain"]["not_applicable"] = chain.NO_ROOM
        res["seconds"] = time.perf_counter() - t1
        runs.append(res)
        log(f"B{'' if v is None else ' with ' + v.spec}: {'PASS' if res['ok'] else 'FAIL'} [{res['seconds']:.1f}s]")
    ctx = dict(command=command(args), capture=str(capture), model=man.get("model_id"), digits=man.get("digits"),
               captured_on=on, backend=key, a=args.a, b=args.b, calls=len(calls), chains=len(chains),
               chain_note=None if chains else ("linked chains off (--no-chains)" if args.chains is False
                                               else chain.missing_note(calls, weights)),
               weights=len(names_), seconds=round(time.perf_counter() - t0, 1), paths=ran)
    text = report(ctx, runs, args, device)
    from .backend_status import line, status
    warn = line(status(key))       # the backend's missing records, under the report's title
    text = text.replace("\n", f"\n\n{warn}\n", 1) if warn else text
    print(text)          # the verdict first: a failed write below must not lose it
    outputs.write_all([("--markdown", args.markdown, text + "\n"),
                       ("--json", args.json, lambda: json.dumps({**ctx, "provenance": provenance.collect(),
                                                                 "runs": runs}, indent=1, default=float) + "\n")])
    if args.faults is not None:
        return 0 if all(as_expected(r) for r in runs) else 1
    return 0 if runs[0]["ok"] and chain_verdict(runs[0]) in (None, "PASS") else 1


def chain_verdict(r: dict) -> str | None:
    """The linked chains' verdict of one run: PASS, FAIL, or None without chains."""
    c = r.get("chain")
    return None if not c else ("PASS" if c["ok"] else "FAIL")


def as_expected(r: dict) -> bool:
    """A run's per-call verdict and, where one is expected, its chain verdict are as expected."""
    c = r.get("chain")
    chain_ok = not c or c["expected"] is None or chain_verdict(r) == c["expected"]
    return chain_ok and r["ok"] == (r["expected"] == "PASS")


# --- report ---------------------------------------------------------------------------------
def _g(v, fmt=".2e"):
    return "-" if v is None else format(v, fmt)


def _own(side: dict) -> float:
    """Relative RMS against the path's own reference (quantized for integer paths)."""
    return side.get("rel_rms_quantized", side["rel_rms_dense"])


def kind_table(res: dict) -> list[str]:
    groups = {}
    for r in res["calls"]:
        groups.setdefault((r["kind"], r["position"]), []).append(r)
    out = ["| kind | pos | calls | path A / B | relRMS A | relRMS B | relRMS A-B | max ulp A / B / A-B "
           "| elem bound A / B | dots A=B=exact | bias max abs t A / B | verdict |", "|" + "---|" * 12]
    # captured positions (int) first, then the batched calls ('M4', 'M16') by M
    order = lambda kp: (kp[0], isinstance(kp[1], str), int(str(kp[1]).lstrip("M")))   # noqa: E731
    for (kind, pos), rs in sorted(groups.items(), key=lambda kv: order(kv[0])):
        def mx(f):
            return max(f(r) for r in rs)
        paths = "/".join(sorted({r["a"]["path"] for r in rs})) + " / " + "/".join(sorted({r["b"]["path"] for r in rs}))
        with_dots = [r for r in rs if r["ab"]["dots_equal"] is not None]
        dots_ok = sum(r["ab"]["dots_equal"] and r["a"]["dots_exact"] and r["b"]["dots_exact"] for r in with_dots)
        dots = f"{dots_ok}/{len(with_dots)}" if with_dots else "-"
        bad = sum(bool(r["failures"]) for r in rs)
        ta = mx(lambda r: max(abs(r["a"]["t_scale"]), abs(r["a"]["t_offset"])))
        tb = mx(lambda r: max(abs(r["b"]["t_scale"]), abs(r["b"]["t_offset"])))
        out.append(f"| {kind} | {pos} | {len(rs)} | {paths} | {_g(mx(lambda r: _own(r['a'])))} "
                   f"| {_g(mx(lambda r: _own(r['b'])))} | {_g(mx(lambda r: r['ab']['rel_rms']))} "
                   f"| {mx(lambda r: r['a']['max_ulp'])} / {mx(lambda r: r['b']['max_ulp'])} / "
                   f"{mx(lambda r: r['ab']['max_ulp'])} | {_g(mx(lambda r: r['a']['elem_ratio']), '.3f')} / "
                   f"{_g(mx(lambda r: r['b']['elem_ratio']), '.3f')} | {dots} | {ta:.2f} / {tb:.2f} "
                   f"| {'PASS' if not bad else f'**FAIL** ({bad} calls)'} |")
    return out


def pooled_table(res: dict) -> list[str]:
    out = ["| kind | pooled t scale A / B | pooled t offset A / B | verdict |", "|---|---|---|---|"]
    for kind, d in sorted(res["kinds"].items()):
        out.append(f"| {kind} | {d['a_t_scale']:.2f} / {d['b_t_scale']:.2f} | {d['a_t_offset']:.2f} / "
                   f"{d['b_t_offset']:.2f} | {'PASS' if not d['failures'] else '**FAIL**'} |")
    return out


def repro_lines(res: dict, args, device) -> list[str]:
    """One line per failing projection: its first failure and the command that replays it."""
    base = _base(args, device) + (["--capture", args.capture] if args.capture else [])
    out, seen = [], set()
    for r in res["calls"]:
        if not r["failures"] or r["layer"] in seen:
            continue
        seen.add(r["layer"])
        where = (["--positions", str(r["position"]), "--m", "1"] if isinstance(r["position"], int)
                 else ["--m", str(r["m"])])
        cmd = base + ["--layers", r["layer"]] + where
        if res["fault"]:
            cmd += ["--fault", res["fault"]]
        out.append(f"- {r['key']}: {r['failures'][0]}\n  reproduce: `{shlex.join(cmd)}`")
    for kind, d in sorted(res["kinds"].items()):
        for f in d["failures"]:
            cmd = base + ["--layers", kind] + (["--fault", res["fault"]] if res["fault"] else [])
            out.append(f"- {f}\n  reproduce: `{shlex.join(cmd)}`")
    return out


def paths_table(rows: list) -> list[str]:
    """Per projection kind and M: the path A and B ran (the dispatch trace) and its fold order."""
    out = ["| kind | M | calls | A ran | A fold order | B ran | B fold order | same path and fold |",
           "|" + "---|" * 8]
    for r in rows or []:
        out.append(f"| {r['kind']} | {r['m']} | {r['calls']} | {'/'.join(r['a'])} | {r['a_fold']} | "
                   f"{'/'.join(r['b'])} | {r['b_fold']} | {r['same'] or 'no'} |")
    return out


# the short name of each check in the separation table, by its typed name (verdicts.CHECKS); a
# check beside the call's output written with dots= counts under both dots names
_SHORT = {"rms quantized": ("rms",), "rms dense": ("rms",), "per-element": ("elem",), "dots": ("dots",),
          "dots A=B": ("dots",), "dots= call": ("dots", "dots="), "bias": ("bias",), "bytes A=B": ("claim",),
          "dispatch trace": ("trace",), "same path and fold": ("trace",), "void control": ("void control",)}
_SHORT_ORDER = ("rms", "elem", "dots", "bias", "claim", "dots=", "trace", "void control")


def _checks_failed(res: dict) -> str:
    """'<check> <count>, ...' over the run's failures, from their typed names."""
    hit = {}
    failed = [k for r in res["calls"] for k in r["failed"]] + [k for d in res["kinds"].values() for k in d["failed"]]
    failed += res.get("failed", [])
    for k in failed:
        for short in sorted(_SHORT[k], key=_SHORT_ORDER.index):
            hit[short] = hit.get(short, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in hit.items()) or "-"


def q8_note(res: dict) -> list[str]:
    """Calls whose inputs alone break the Q8 budget (see replay._q8_allowance)."""
    from . import numerics, replay
    over = [(r["a"]["q8_error"], r["key"]) for r in res["calls"] if (r["a"]["q8_error"] or 0) > numerics.Q8_BUDGET]
    if not over:
        return ["- the exact Q8 arithmetic (FP64 quantized reference) is within the Q8 budget "
                f"{numerics.Q8_BUDGET} of dense on every call"]
    worst = max(over)
    return [f"- the exact Q8 arithmetic itself is beyond the Q8 budget {numerics.Q8_BUDGET} of dense on {len(over)} "
            f"call(s) (worst {worst[0]:.4f}, {worst[1]}): there an integer path's dense bound is derived from it. "
            + replay.Q8_WHY]


def separation_table(runs: list) -> list[str]:
    from . import replay
    out = ["| B variant | what it plants | expected | replay verdict | as expected | failed checks (count) "
           "| calls B != A | calls changed vs B unchanged | max relRMS B | max elem bound B | max abs bias t B |",
           "|" + "---|" * 11]
    for r in runs:
        what = "B unchanged" if r["fault"] is None else replay.FAULTS[r["fault"].split(":")[0]][1]
        got = "PASS" if r["ok"] else "FAIL"
        tb = max(max(abs(c["b"]["t_scale"]), abs(c["b"]["t_offset"])) for c in r["calls"])
        out.append(f"| {r['fault'] or 'none'} | {what} | {r['expected']} | {got} | "
                   f"{'yes' if got == r['expected'] else '**NO**'} | {_checks_failed(r)} "
                   f"| {sum(not c['ab']['bit_equal'] for c in r['calls'])}/{len(r['calls'])} "
                   f"| {'-' if r['changed_vs_b'] is None else r['changed_vs_b']} "
                   f"| {_g(max(_own(c['b']) for c in r['calls']))} "
                   f"| {_g(max(c['b']['elem_ratio'] for c in r['calls']), '.3f')} "
                   f"| {tb:.2f} |")
    return out


def chain_table(res: dict) -> list[str]:
    """Per chain kind and M: the per-call error of step 2 (on the chain's own input), the chain's
    error against the FP64 chain after each step, its growth, the derived bound and the verdict."""
    c = res["chain"]
    groups = {}
    for r in c["chains"]:
        groups.setdefault((r["position"] if isinstance(r["position"], int) else r["m"], isinstance(r["position"], str)),
                          []).append(r)
    out = ["| chain | pos / M | chains | paths A / B (step 1, step 2) | per-call relRMS A / B | chain relRMS A "
           "(step 1 / act / step 2) | chain relRMS B (step 1 / act / step 2) | growth A / B | bound relRMS "
           "| worst / bound A / B | lined up (sigma) A / B | relRMS A-B | verdict |", "|" + "---|" * 13]
    for (pos, batched), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        def mx(side, f):
            return max(r[side][f] for r in rs)

        def paths(side):
            return "/".join(sorted({",".join(r[side]["paths"]) for r in rs}))
        bad = sum(bool(r["failures"]) for r in rs)
        pc = sum(bool(r["a"]["per_call_failures"] or r["b"]["per_call_failures"]) for r in rs)
        verdict = "PASS" if not bad else f"**FAIL** ({bad} chains)"
        if pc:
            verdict += f"; per-call FAIL in {pc}"
        out.append(f"| {c['kind']} | {'M' + str(pos) if batched else pos} | {len(rs)} | {paths('a')} / {paths('b')} "
                   f"| {_g(mx('a', 'per_call'))} / {_g(mx('b', 'per_call'))} "
                   f"| {_g(mx('a', 'step1'))} / {_g(mx('a', 'act'))} / {_g(mx('a', 'chain'))} "
                   f"| {_g(mx('b', 'step1'))} / {_g(mx('b', 'act'))} / {_g(mx('b', 'chain'))} "
                   f"| {mx('a', 'growth'):.2f} / {mx('b', 'growth'):.2f} "
                   f"| {_g(max(mx('a', 'bound_rel'), mx('b', 'bound_rel')))} "
                   f"| {mx('a', 'ratio'):.3f} / {mx('b', 'ratio'):.3f} "
                   f"| {mx('a', 'coherence'):.2f} / {mx('b', 'coherence'):.2f} "
                   f"| {_g(max(r['ab']['rel_rms'] for r in rs))} | {verdict} |")
    return out


def chain_faults_table(runs: list) -> list[str]:
    """Per B variant: the chain verdict, the per-call verdict of the chain's steps, and the
    worst growth, bound ratio and alignment on B."""
    out = ["| B variant | per-call (replay) | per-call (chain steps) | chain verdict | chain expected | as expected "
           "| max growth B | max worst / bound B | max lined up B (sigma; z) |", "|" + "---|" * 9]
    for r in runs:
        c = r["chain"]
        got = "PASS" if c["ok"] else "FAIL"
        exp = c["expected"] or "-"
        ok = "-" if c["expected"] is None else ("yes" if got == c["expected"] else "**NO**")
        rows = c["chains"]
        out.append(f"| {r['fault'] or 'none'} | {'PASS' if r['ok'] else 'FAIL'} "
                   f"| {'PASS' if c['per_call_ok'] else 'FAIL'} "
                   f"| {got} | {exp} | {ok} | {max(x['b']['growth'] for x in rows):.2f} "
                   f"| {max(x['b']['ratio'] for x in rows):.3f} | {max(x['b']['coherence'] for x in rows):.2f}; "
                   f"{c['threshold']:.2f} |")
    return out


def chain_section(ctx: dict, runs: list, args, device) -> list[str]:
    from . import chain, registry
    if not ctx.get("chains"):
        return ["## Linked chains", "", f"- {ctx.get('chain_note')}", ""]
    first = runs[0]["chain"]
    lines = ["## Linked chains", "",
             f"- {ctx['chains']} chains ({chain.KIND}), each from a captured gate_up input, end to end through A's "
             "and through B's kernels, against the FP64 chain (each step in FP64 from the FP64 output before it). "
             "per-call: step 2 on the chain's own input against its FP64 dense product; growth = chain relRMS / "
             "per-call relRMS after step 2; lined up: step 1's residue carried through silu*up and down, in units "
             f"of its Hoeffding scale sigma (at most z = {first['threshold']:.2f}, Bonferroni over every output)",
             "- chain bound, per output: |(y2 - D2) - (exact Q8 terms)| <= B2 + z sigma, B2 the per-element bound "
             "of step 2, sigma^2 = sum_k W'_nk^2 Eh_k^2, Eh the worst-case activation error propagated from step "
             "1's per-element bound (pq2verify/chain.py); whole-layer chains are not linked: attention's KV cache "
             "and the residual stream are not captured", ""]
    lines += chain_table(runs[0]) + [""]
    if len(runs) > 1:
        lines += ["Linked chains under each B variant:", ""] + chain_faults_table(runs) + [""]
    for r in runs:
        c = r["chain"]
        step1 = {x["b"]["paths"][0] for x in c["chains"]}
        if c.get("not_applicable"):
            lines += [f"- {r['fault']} is n/a for the chain on {'/'.join(sorted(step1))}: {chain.NO_ROOM}", ""]
    base = _base(args, device) + (["--capture", args.capture] if args.capture else [])
    for r in runs:
        fails = []
        for c in r["chain"]["chains"]:
            where = (["--positions", str(c["position"]), "--m", "1"] if isinstance(c["position"], int)
                     else ["--m", str(c["m"])])
            cmd = base + ["--layers", c["layer"][: -len(chain.GATE_UP)] + "mlp.", *where, "--chains"]
            cmd += ["--fault", r["fault"]] if r["fault"] else []
            fails += [f"- {c['key']}: {f}\n  reproduce: `{shlex.join(cmd)}`" for f in c["failures"]]
        if fails:
            lines += [f"Chain failures ({'B unchanged' if r['fault'] is None else 'B with ' + r['fault']}):", ""]
            lines += fails[:4] + ([f"- ... {len(fails) - 4} more"] if len(fails) > 4 else []) + [""]
    return lines


def report(ctx: dict, runs: list, args, device) -> str:
    from . import numerics, replay
    first = runs[0]
    lines = ["# pq2verify replay: real-activation projection calls, A vs B", "",
             f"Command: `{ctx['command']}`", "",
             f"- capture: {ctx['capture']} (model {ctx['model']}, {ctx['digits']} digits, "
             f"captured on {ctx['captured_on']})",
             f"- backend: {ctx['backend']}; A = {ctx['a']}, B = {ctx['b']}; {ctx['calls']} calls of {ctx['weights']} "
             f"PQ2 weights; {ctx['seconds']} s", "",
             "## Bounds (each side of each call; any miss fails)", "",
             "- relative RMS vs the path's FP64 references within `registry.Path.tolerance` (quantized: output "
             "rounding + FP32 fold; dense, integer paths: the Q8 budget)",
             f"- per element: |y - Y| <= F + spacing(|Y| + F)/2. Integer paths: {numerics.FOLD_REASON['integer']}. "
             f"Floating: {numerics.FOLD_REASON['floating']}",
             "- integer group dots equal to the exact ones, and A's equal to B's where both paths write them "
             "(on the emulation backend the dots are the emulation's shared integer GEMM, not a kernel's)",
             "- B's bytes equal to A's where the registry claims bit identity (or A and B run the same path)",
             f"- no bias: |t| <= {first['bias_threshold']:.2f} per call and pooled per kind. {replay.BIAS_WHY}",
             "- A and B differ: dispatch's choice for each call (from its shape and M, before the run) is a "
             "different path, or the same path in another fold order; the dispatch trace of every call shows "
             "the path chosen. The control (fold_reversed) differs from A's fold order on every call and from "
             "A's bits somewhere, or it is void", "",
             "## What A and B ran (dispatch trace)", ""] + paths_table(ctx.get("paths")) + [""]
    lines += q8_note(first) + [""]
    if len(runs) > 1:
        lines += ["## Separation: B variants against the same A run", ""] + separation_table(runs) + [""]
        ok = all(as_expected(r) for r in runs)
        lines += [f"**Separation {'holds' if ok else 'FAILS'}: every variant {'got' if ok else 'did not get'} "
                  "its expected verdict.**", ""]
    for r in runs:
        title = "B unchanged" if r["fault"] is None else f"B with {r['fault']}"
        lines += [f"## {title}: {'PASS' if r['ok'] else 'FAIL'}", ""]
        if r["fault"] is None or len(runs) == 1:     # a planted fault's table is the separation row
            lines += kind_table(r) + [""] + pooled_table(r) + [""]
        if r.get("control"):
            c = r["control"]
            lines += [f"Control: {c['fold']}; outputs differing from A's bits in {c['outputs_differ_from_a']} of "
                      f"{c['calls']} calls; A's own fold order on {c['same_fold_as_a']} calls.", ""]
        if r.get("failures"):
            lines += [f"- {f}\n  reproduce: `{ctx['command']}`" for f in r["failures"]] + [""]
        rep = repro_lines(r, args, device)
        keep = 12 if len(runs) == 1 else 4
        if rep:
            more = [f"- ... {len(rep) - keep} more"] if len(rep) > keep else []
            lines += ["Failing projections:", ""] + rep[:keep] + more + [""]
    lines += chain_section(ctx, runs, args, device)
    verdict = (first["ok"] and chain_verdict(first) in (None, "PASS")) if len(runs) == 1 else \
        all(as_expected(r) for r in runs)
    lines.append(f"**Overall: {'PASS' if verdict else 'FAIL'}**")
    return "\n".join(lines)
