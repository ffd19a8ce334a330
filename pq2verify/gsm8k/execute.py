"""One run of the A/B: generate the questions of its batches not yet done, with its teacher-forced
followers in lockstep, and keep a ledger of what each batch cost.

The ledger (ledger.json, replaced atomically after every batch) has one entry per finished
batch (its calls per path and M, tokens, seconds; its followers' calls) and one for the shared
prefix. A batch counts once, when its entry is written: a session killed inside a batch leaves
no entry for it, and the resumed session replays exactly the batches without one (the same
batch, hence the same M and the same bits; its already written questions are not appended
again) and writes their entries. The shared prefix is prefilled again by every session, and its
entry is replaced, not added to. So a resumed run's totals equal an uninterrupted run's.

Runs of one process go batch by batch (execute_all): each batch under A (with its followers),
then B, F, ...; a prefill with the same arithmetic is computed once and copied (its calls are
counted in each run's totals, and in the ledger's `copied`). Each entry also has its seconds per
phase (generate.Generator.phases).
"""
import os
import sys
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

LEDGER = "ledger.json"


@dataclass(frozen=True)
class Run:
    """label: a, b, f (the noise floor), a2 (the A/A control). fold: M ranges whose calls fold
    the K groups in reverse order (model.Usage.reverse). followers: runs scored teacher-forced on
    this run's tokens, in lockstep."""
    label: str
    spec: dict
    replica: int = 0
    fold: tuple = ()
    followers: tuple = field(default=())


def batch_key(batch: list[int]) -> str:
    return ",".join(map(str, batch))


@contextmanager
def configured(conv, spec: dict, fold: tuple, calls: Counter):
    """The model runs under a kernel spec and a fold order, counting its calls into `calls`."""
    from .runs import EnvSwitch, spec_env
    u = conv.usage
    saved = u.calls, u.reverse
    u.calls, u.reverse = calls, tuple(fold)
    try:
        with EnvSwitch(spec_env(spec)):
            yield
    finally:
        u.calls, u.reverse = saved


def signature(spec: dict, fold: tuple, dev, dtype):
    """M -> (path, folds reversed) of a run's calls at M: two runs whose signatures agree at every
    M of a forward compute it bit for bit alike (memoized per M)."""
    import torch
    from kernels import dispatch
    from kernels.format import PQ2Weight
    from .model import Usage
    from .runs import EnvSwitch, spec_env
    w = PQ2Weight.from_prepared(torch.zeros(128 // 4 + 2, dtype=torch.uint8), 1, 128).to(dev)
    rev = Usage(reverse=tuple(fold))
    seen = {}

    def sig(m: int) -> tuple:
        if m not in seen:
            with EnvSwitch(spec_env(spec)):
                x = torch.empty(m, 128, dtype=dtype, device=dev)
                seen[m] = (dispatch.resolve(m, w, x, dispatch.kernel_set()).name, rev.reverses(m))
        return seen[m]
    return sig


def _pairs(c: Counter) -> list:
    return [[name, m, n] for (name, m), n in sorted(c.items())]


def todo(rd, batches) -> list:
    """Batches without a ledger entry, or with a question missing from generations.jsonl."""
    done = rd.read_json(LEDGER, {"batches": {}})["batches"]
    return [b for b in batches if batch_key(b) not in done or any(q not in rd.done for q in b)]


def totals(ledger: dict) -> dict:
    """calls per (path, M), tokens and seconds: the prefix entry plus every batch entry."""
    calls, fcalls = Counter(), {}
    entries = ([ledger["prefix"]] if ledger.get("prefix") else []) + list(ledger["batches"].values())
    for e in entries:
        for name, m, n in e["calls"]:
            calls[(name, m)] += n
        for f, pairs in e.get("followers", {}).items():
            for name, m, n in pairs:
                fcalls.setdefault(f, Counter())[(name, m)] += n
    phases = Counter()
    for e in entries:
        phases.update(e.get("phases", {}))
    return {"calls": calls, "follower_calls": fcalls, "tokens": sum(e.get("tokens", 0) for e in entries),
            "seconds": sum(e["seconds"] for e in entries), "phases": phases,
            "copied": sum(e.get("copied", 0) for e in entries)}


def execute(run: Run, rd, new_gen, conv, batches, tok_ids, prompts, golds, prefix_len) -> dict:
    """Generate what the run lacks; return its records, trace and totals."""
    return execute_all([(run, rd)], new_gen, conv, batches, tok_ids, prompts, golds, prefix_len)[0]


def execute_all(runs, new_gen, conv, batches, tok_ids, prompts, golds, prefix_len) -> list[dict]:
    """Several runs [(Run, RunDir)] in one process, batch by batch (each run's batch in turn):
    a prefill that a later run would compute with the same arithmetic (same path and fold order
    at its M) is copied from the first (generate.PrefillMemo), and held only while its batch is
    under way. Each run's generations, ledger and results are what it would have alone."""
    from . import generate
    memo = generate.PrefillMemo() if len(runs) > 1 else None
    base = int(os.environ.get("PQ2VERIFY_BAR_POSITION", "0"))
    ex = [_Runner(run, rd, new_gen, conv, tok_ids, prompts, golds, prefix_len, batches, memo, base + i)
          for i, (run, rd) in enumerate(runs)]
    for b in batches:
        for r in ex:
            r.batch(b)
    return [r.result(batches) for r in ex]


class _Runner:
    """One run, batch by batch: its generator (its own prefix caches and followers), call
    counters, ledger and progress bar."""

    def __init__(self, run, rd, new_gen, conv, tok_ids, prompts, golds, prefix_len, batches, memo, position):
        from . import generate
        from .runs import spec_text
        self.run, self.rd, self.conv = run, rd, conv
        self.tok_ids, self.prompts, self.golds, self.prefix_len = tok_ids, prompts, golds, prefix_len
        self.left = {batch_key(b) for b in todo(rd, batches)}
        self.pre = len(rd.done)
        self.ledger = rd.read_json(LEDGER, {"prefix": None, "batches": {}})
        self.calls = Counter()
        self.fcalls = {f.label: Counter() for f in run.followers}
        dev, dtype = conv.model.device, conv.model.dtype
        lead = signature(run.spec, run.fold, dev, dtype)
        self.gen = new_gen(memo=memo, sig=lead, usage=conv.usage)
        self.followers = []
        for f in run.followers:
            fs = signature(f.spec, f.fold, dev, dtype)
            self.followers.append(generate.Follower(
                f.label, lambda f=f: configured(conv, f.spec, f.fold, self.fcalls[f.label]),
                same=lambda m, fs=fs: lead(m) == fs(m), sig=fs))
        self.started = False
        n_left = sum(1 for b in batches if batch_key(b) in self.left for q in b if q not in rd.done)
        self.bar = _bar(n_left, f"{run.label} {spec_text(run.spec)}", position)
        self.t0 = None

    def _done(self, res) -> None:
        from . import data, extract
        sc = extract.score(res.text, self.golds[res.qid])
        rec = {"id": res.qid, "prompt_hash": data.prompt_hash(self.prompts[res.qid]), "tokens": res.tokens,
               "text": res.text, "stop": res.stop, "gold": self.golds[res.qid], **sc, "topk": res.topk,
               "decode_m": res.decode_m}
        if res.teacher:
            rec["teacher"] = res.teacher
        if self.rd.append(rec):
            self.bar.update(1)
            rate = self.gen.tokens_out / max(time.perf_counter() - self.t0, 1e-9)
            self.bar.set_postfix_str(f"{rate:.1f} tok/s")

    def batch(self, b: list[int]) -> None:
        from . import generate
        if batch_key(b) not in self.left:
            return
        gen, calls, fcalls, ledger = self.gen, self.calls, self.fcalls, self.ledger
        with configured(self.conv, self.run.spec, self.run.fold, calls):
            if not self.started:
                self.started, self.t0 = True, time.perf_counter()
                mark = self._mark()
                gen.set_prefix(self.tok_ids[b[0]][:self.prefix_len], self.followers)
                ledger["prefix"] = {"calls": _pairs(calls), "followers": {k: _pairs(v) for k, v in fcalls.items()},
                                    **self._since(mark)}
            calls.clear()
            for c in fcalls.values():
                c.clear()
            mark, toks = self._mark(), gen.tokens_out
            gen.run_batch([generate.Request(q, self.tok_ids[q]) for q in b], self._done)
            ledger["batches"][batch_key(b)] = {
                "calls": _pairs(calls), "tokens": gen.tokens_out - toks,
                "followers": {k: _pairs(v) for k, v in fcalls.items()}, **self._since(mark)}
            self.rd.write_json(LEDGER, ledger)   # after the batch's questions: a crash between replays it

    def _mark(self):
        g = self.gen
        return time.perf_counter(), Counter(g.phases), sum(g.memo.copied.values()) if g.memo else 0

    def _since(self, mark) -> dict:
        """Ledger fields since mark: seconds, seconds per phase, calls copied from another run."""
        t0, ph, copied = mark
        g = self.gen
        return {"seconds": time.perf_counter() - t0,
                "phases": {k: round(v - ph[k], 4) for k, v in g.phases.items() if v - ph[k] > 0},
                "copied": (sum(g.memo.copied.values()) - copied) if g.memo else 0}

    def result(self, batches) -> dict:
        from .report import summarize
        from .runs import spec_text
        run, rd = self.run, self.rd
        self.bar.close()
        tot = totals(self.ledger)
        recs = {q: rd.done[q] for b in batches for q in b if q in rd.done}
        paths = Counter()
        m_seen = {}
        for (name, m), n in tot["calls"].items():
            paths[name] += n
            m_seen.setdefault(name, Counter())[m] += n
        secs, toks = tot["seconds"], tot["tokens"]
        return {"label": run.label, "spec": spec_text(run.spec), "fold_reversed_m": _text_ranges(run.fold),
                "dir": str(rd.path), "recs": recs, "summary": summarize(recs), "trace": dict(paths),
                "m_seen": {k: _ranges(v) for k, v in sorted(m_seen.items())},
                "m_calls": {k: dict(sorted(v.items())) for k, v in sorted(m_seen.items())},
                "teacher_trace": {f: dict(sorted(_by_path(c).items())) for f, c in tot["follower_calls"].items()},
                "teacher_m_calls": {f: _by_path_m(c) for f, c in tot["follower_calls"].items()},
                "seconds": round(secs, 2), "tokens": toks, "tok_per_s": round(toks / secs, 2) if secs else None,
                "phases": {k: round(v, 2) for k, v in sorted(tot["phases"].items())},
                "copied_calls": tot["copied"], "resumed_from_earlier": self.pre}


def _by_path(c: Counter) -> Counter:
    out = Counter()
    for (name, _), n in c.items():
        out[name] += n
    return out


def _by_path_m(c: Counter) -> dict:
    """{path: {M: calls}} of a follower: which path served it at each of its leader's Ms."""
    out = {}
    for (name, m), n in sorted(c.items()):
        out.setdefault(name, {})[m] = n
    return out


def _text_ranges(fold: tuple) -> str | None:
    if not fold:
        return None
    return ", ".join(f"{lo}+" if hi is None else (str(lo) if lo == hi else f"{lo}-{hi}") for lo, hi in fold)


def _ranges(c: Counter) -> str:
    """Ms seen as compact ranges: '1-16, 207, 1040-1712'."""
    ms = sorted(c)
    out, i = [], 0
    while i < len(ms):
        j = i
        while j + 1 < len(ms) and ms[j + 1] == ms[j] + 1:
            j += 1
        out.append(str(ms[i]) if i == j else f"{ms[i]}-{ms[j]}")
        i = j + 1
    if len(out) > 8:
        out = out[:4] + ["…"] + out[-3:]
    return ", ".join(out)


def _bar(total, desc, position, stream=None):
    """Questions done: a tqdm bar on a terminal; in a log (CI, a pipe, a GPU runner), a plain line
    every few seconds (pq2verify.report.progress), never a carriage-return counter."""
    stream = stream or sys.stderr
    if getattr(stream, "isatty", lambda: False)():
        try:
            from tqdm import tqdm
            return tqdm(total=total, desc=desc, unit="q", file=stream, dynamic_ncols=True, position=position)
        except ImportError:
            pass
    return _LineBar(total, desc, stream)


class _LineBar:
    """tqdm's update / set_postfix_str / close, written as progress.Progress lines."""

    def __init__(self, total, desc, stream):
        from ..report.progress import Progress
        self.n, self.desc, self.post = 0, desc, ""
        self.p = Progress(total, stream=stream)

    def update(self, n: int) -> None:
        self.n += n
        self.p.update(self.n, f"{self.desc} questions {self.post}".rstrip())

    def set_postfix_str(self, s: str) -> None:
        self.post = s

    def close(self) -> None:
        self.p.close()
