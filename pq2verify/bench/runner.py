"""The run: plan, budget, results written as JSON lines as they go, resume after a crash."""

import json
import time
import traceback
from dataclasses import asdict
from pathlib import Path

from .plan import Config, DEFAULT_MS, INTERP_MS, Item, make_plan, select_shapes
from .items import execute
from .resolve import preflight
from .verdicts import assess


def load_jsonl(path: Path, signature: dict) -> dict:
    """Rows already measured with the same settings, by key. A file from other settings is an
    error (mixing them would compare unlike runs)."""
    if not path.exists():
        return {}
    done = {}
    with open(path) as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue            # a line cut by a crash: that item runs again
            if rec.get("kind") == "header":
                if rec["config"] != signature:
                    raise ValueError(f"{path} was written with other settings {rec['config']}, not "
                                     f"{signature}; pass another --jsonl or drop --resume")
            elif "key" in rec:
                done[rec["key"]] = rec
    return done


def error_row(item: Item, e: Exception) -> dict:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    return {"kind": item.kind, "key": item.key, "m": item.m,
            "shape": item.shape.name if item.shape else None, "status": "error",
            "error": f"{type(e).__name__}: {e}", "traceback": "".join(tb[-3:])}


def prepare(cfg: Config, env) -> tuple:
    """(plan, A/B resolution per item) before any work: ValueError (resolve.SameSides among
    them) for settings that cannot run or compare nothing."""
    if cfg.ms is None:
        cfg.ms = DEFAULT_MS if env.kind != "interpreter" else INTERP_MS
    cfg.check()
    shapes = select_shapes(cfg.shapes, env.default_shapes)
    plan = make_plan(cfg, shapes, with_step=env.can_time)
    return plan, preflight(cfg, plan, env.device)


def _append(jsonl: Path, row: dict, res: dict) -> None:
    """A row as a JSON line; a failed write is kept in res['write_errors'] (the run goes on and
    the command reports it after its verdict)."""
    try:
        with open(jsonl, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
    except OSError as e:
        res["write_errors"].append(f"--jsonl {jsonl}: could not write {row.get('key')}: {e.strerror or e}")


def run(cfg: Config, env, *, jsonl: Path, resume: bool = False, progress=None, clock=time.monotonic) -> dict:
    """Run the plan, writing each finished row as a JSON line (errors are not written, so a
    resume retries them). Items left when the budget is spent are listed in not_run (the A/A
    row that closes the run's drift bracket runs regardless); such a run is PARTIAL, never OK.
    Before any work, an A/B in which A and B resolve to the same path for every item is
    refused (resolve.SameSides)."""
    plan, resolution = prepare(cfg, env)
    env.reruns = cfg.reruns
    sig = cfg.signature(env.kind, env.device_name())
    jsonl = Path(jsonl)
    jsonl.parent.mkdir(parents=True, exist_ok=True)
    done = load_jsonl(jsonl, sig) if resume else {}
    header = {"kind": "header", "config": sig, "settings": asdict(cfg), "provenance": env.provenance()}
    res = {"header": header, "config": asdict(cfg), "rows": [], "not_run": [], "resumed": [], "write_errors": [],
           "resolution": resolution}
    if not (resume and jsonl.exists()):
        try:
            jsonl.write_text(json.dumps(header, default=str) + "\n")
        except OSError as e:
            res["write_errors"].append(f"--jsonl {jsonl}: could not write: {e.strerror or e}")
    if not env.can_time:
        res["note"] = env.why_not + "; no decode step without a GPU"
    rows, bw = {}, None
    t0 = clock()
    spent = (lambda: clock() - t0 > cfg.budget_s) if cfg.budget_s is not None else (lambda: False)
    env.deadline = spent          # extended rounds stop there too
    for i, item in enumerate(plan):
        if item.key in done and item.key != "aa:last":      # the closing bracket is this run's own
            row = done[item.key]
            res["resumed"].append(item.key)
        elif spent() and item.key != "aa:last" and item.kind != "launch":      # launch rows: cheap, run regardless
            res["not_run"].append(item.key)
            continue
        else:
            env.release()      # the previous item's copies and graph pools are gone by now
            try:
                row = execute(env, cfg, item, bw, rows)
            except Exception as e:  # one broken item never loses the rows before it
                row = error_row(item, e)
                env.release()
            if row["status"] != "error":
                _append(jsonl, row, res)
        if item.kind == "bandwidth":
            bw = row.get("stream_read_gbps")
        rows[item.key] = row
        res["rows"].append(row)
        if progress is not None:
            progress(i + 1, len(plan), row)
    res["elapsed_s"] = clock() - t0
    res["stream_read_gbps"] = bw
    res.update(assess(res, cfg))
    return res
