"""The A/B comparison and its Markdown/JSON report.

For two runs over the same questions: each run's score; how many answers are identical; for
every question whose answer differs, its class (right->wrong, wrong->right, both wrong), the
first differing generated token, the shared prefix, and at that step the log-probability
margin between the two choices in each run:
    margin_A = logp_A(token A chose) - logp_A(token B chose)   (>= 0: A's choice was A's argmax)
    margin_B = logp_B(token B chose) - logp_B(token A chose)
A flip whose larger margin is under NEAR_TIE nats is a near-tie flip (two choices that were
practically tied, flipped by rounding); otherwise a real divergence. When the other run's token
is outside the recorded top-k, the margin is at least top1 - topk and is reported as a bound.
The first step whose log-probabilities differ at all (numeric_step) says where the arithmetic
first changed the model's state; a flip many steps later with large margins means the states
drifted apart (one rounding flip amplified, e.g. by a Q8 code crossing a rounding boundary).

Batch-mates: a row leaves its batch when it stops, so the decode M of the others (and in the
tuned set their path: single at M = 1, small_mma at 2..16) depends on when their batch-mates
stop. Each record lists its decode Ms; `m_differs_step` is the first step before the
divergence at which the two runs computed this question at different M (None: the same Ms
throughout, so only the kernels differed). The teacher-forced metrics (floor.py) have no such
dependence: followers run at the leader's M.
"""
from . import extract

NEAR_TIE = 0.1     # nats; bf16 activations alone move logits by ~1e-2 over a 30-layer model


def _lp(step, token):
    for t, v in step:
        if t == token:
            return v
    return None


def numeric_divergence(sa: list, sb: list, upto: int) -> dict:
    """The first step whose recorded log-probabilities differ at all (<= the first differing
    token): where the arithmetic first changed the model's state, which may be well before the
    argmax flips. Also the largest |delta logprob| over the shared top-k tokens there."""
    for s in range(min(upto + 1, len(sa), len(sb))):
        if sa[s] != sb[s]:
            da, db = dict(map(tuple, sa[s])), dict(map(tuple, sb[s]))
            common = set(da) & set(db)
            return {"numeric_step": s,
                    "numeric_delta": max((abs(da[t] - db[t]) for t in common), default=None)}
    return {"numeric_step": None, "numeric_delta": None}


def divergence(ra: dict, rb: dict, near_tie: float = NEAR_TIE) -> dict | None:
    """First differing token of two generations and the margins there; None if identical."""
    ta, tb = ra["tokens"], rb["tokens"]
    i = 0
    n = min(len(ta), len(tb))
    while i < n and ta[i] == tb[i]:
        i += 1
    if i == n and len(ta) == len(tb):
        return None
    out = {"step": i, "token_a": ta[i] if i < len(ta) else None, "token_b": tb[i] if i < len(tb) else None}
    out.update(numeric_divergence(ra.get("topk") or [], rb.get("topk") or [], i))
    margins = []
    for key, r, mine, other in (("a", ra, out["token_a"], out["token_b"]), ("b", rb, out["token_b"], out["token_a"])):
        steps = r.get("topk") or []
        if i >= len(steps) or mine is None or other is None:
            out[f"margin_{key}"], out[f"margin_{key}_bound"] = None, False
            continue
        top = steps[i]
        lp_mine = _lp(top, mine)
        lp_other = _lp(top, other)
        if lp_mine is not None and lp_other is not None:
            out[f"margin_{key}"], out[f"margin_{key}_bound"] = lp_mine - lp_other, False
        elif lp_mine is not None:
            out[f"margin_{key}"], out[f"margin_{key}_bound"] = lp_mine - top[-1][1], True
        else:
            out[f"margin_{key}"], out[f"margin_{key}_bound"] = None, False
        if out[f"margin_{key}"] is not None:
            margins.append((out[f"margin_{key}"], out[f"margin_{key}_bound"]))
    if i >= n:
        out["kind"] = "length"          # one stopped where the other went on (same tokens so far)
    elif margins and all(not b for _, b in margins) and max(m for m, _ in margins) < near_tie:
        out["kind"] = "near-tie"
    else:
        out["kind"] = "real"
    return out


def _ms(rec: dict) -> list[int]:
    return [m for m, n in rec.get("decode_m") or [] for _ in range(n)]


def m_differs_step(ra: dict, rb: dict, upto: int) -> int | None:
    """The first step <= upto whose logits came from a forward at a different decode M in the
    two runs (step s >= 1 is the decode forward s - 1), or None."""
    ma, mb = _ms(ra), _ms(rb)
    for s in range(1, upto + 1):
        a = ma[s - 1] if s - 1 < len(ma) else None
        b = mb[s - 1] if s - 1 < len(mb) else None
        if a != b:
            return s
    return None


def answer_class(ra: dict, rb: dict) -> str | None:
    """None if the answers are the same; else right->wrong, wrong->right or both wrong."""
    a, b = ra.get("answer"), rb.get("answer")
    if (a is None and b is None) or extract.same(a, b):
        return None
    if ra["correct"] and not rb["correct"]:
        return "right->wrong"
    if rb["correct"] and not ra["correct"]:
        return "wrong->right"
    return "both wrong"


def summarize(recs: dict) -> dict:
    n = len(recs)
    c = sum(1 for r in recs.values() if r["correct"])
    inv = sum(1 for r in recs.values() if r["invalid"])
    sinv = sum(1 for r in recs.values() if r["strict_invalid"])
    toks = sum(len(r["tokens"]) for r in recs.values())
    return {"n": n, "correct": c, "accuracy": c / n if n else 0.0, "invalid": inv,
            "invalid_rate": inv / n if n else 0.0, "strict_invalid": sinv,
            "strict_invalid_rate": sinv / n if n else 0.0, "tokens": toks}


def compare(a: dict, b: dict, *, decode=None, near_tie: float = NEAR_TIE) -> dict:
    """a, b: id -> record. decode: token ids -> text (for the shared prefix and the tokens)."""
    ids = sorted(set(a) & set(b))
    diffs, text_only = [], []
    same_tokens = 0
    for q in ids:
        ra, rb = a[q], b[q]
        dv = divergence(ra, rb, near_tie)
        if dv is None:
            same_tokens += 1
            continue
        cls = answer_class(ra, rb)
        dv["m_differs_step"] = m_differs_step(ra, rb, dv["step"])
        if decode is not None:
            dv["prefix"] = decode(ra["tokens"][:dv["step"]])
            dv["text_a"] = decode([dv["token_a"]]) if dv["token_a"] is not None else "(stopped)"
            dv["text_b"] = decode([dv["token_b"]]) if dv["token_b"] is not None else "(stopped)"
        row = {"id": q, "class": cls, "answer_a": ra.get("answer"), "answer_b": rb.get("answer"),
               "correct_a": ra["correct"], "correct_b": rb["correct"], **dv}
        (diffs if cls else text_only).append(row)
    counts = {k: sum(1 for d in diffs if d["class"] == k) for k in ("right->wrong", "wrong->right", "both wrong")}
    kinds = {k: sum(1 for d in diffs if d["kind"] == k) for k in ("near-tie", "real", "length")}
    return {"n": len(ids), "identical_answers": len(ids) - len(diffs), "identical_generations": same_tokens,
            "answer_diffs": len(diffs), "by_class": counts, "by_kind": kinds,
            "text_only_diffs": len(text_only),
            "text_only_by_kind": {k: sum(1 for d in text_only if d["kind"] == k) for k in ("near-tie", "real", "length")},
            "batchmate_m_differs": sum(1 for d in diffs + text_only if d["m_differs_step"] is not None),
            "diffs": diffs, "text_only": text_only, "near_tie_nats": near_tie}


def first_margins(cmp: dict) -> dict:
    """Median and 90th percentile of A's margin at the first differing token (exact margins)."""
    ms = sorted(d["margin_a"] for d in cmp["diffs"] + cmp["text_only"]
                if d.get("margin_a") is not None and not d.get("margin_a_bound"))
    if not ms:
        return {"n": 0, "median": None, "p90": None}
    return {"n": len(ms), "median": ms[len(ms) // 2], "p90": ms[min(len(ms) - 1, int(0.9 * len(ms)))]}


def _f(v, fmt=".4g"):
    return "n/a" if v is None else format(v, fmt)


def _floor_section(rep: dict) -> list[str]:
    fl, tf, vd = rep.get("floor"), rep.get("teacher") or {}, rep.get("verdict")
    if not fl and not tf:
        return []
    L = ["", "## Noise floor and teacher forcing", ""]
    if fl:
        L.append(f"- floor run F: A's kernels with the K groups folded in reverse order at M {fl['fold_reversed_m']} "
                 "(where B's paths differ from A's): the same arithmetic in another valid FP32 order")
    L += ["", "| comparison | identical answers | identical generations | answers differ (near-tie / real) | "
          "A margin at first difference, median (p90) | teacher-forced mean KL per token | top-1 agreement | "
          "largest abs delta log p (id, step) |",
          "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, cmp, t in (("A vs B", rep["compare"], tf.get("b")), ("A vs F (floor)", (fl or {}).get("compare"), tf.get("f"))):
        if cmp is None and t is None:
            continue
        row = [name]
        if cmp:
            fm = first_margins(cmp)
            row += [f"{cmp['identical_answers']}/{cmp['n']}", f"{cmp['identical_generations']}/{cmp['n']}",
                    f"{cmp['answer_diffs']} ({cmp['by_kind']['near-tie']} / {cmp['by_kind']['real']})",
                    f"{_f(fm['median'])} ({_f(fm['p90'])})"]
        else:
            row += ["n/a"] * 4
        if t and t.get("mean_kl") is not None:
            w = t["worst"]
            row += [_f(t["mean_kl"]), f"{100 * t['top1']:.2f}%", f"{w['dlp']:.4g} ({w['id']}, {w['step']})"]
        else:
            row += ["n/a"] * 3
        L.append("| " + " | ".join(row) + " |")
    lead = next((r for r in rep.get("runs", []) if r.get("teacher_trace")), None)
    if lead:
        calls = "; ".join(f"{f}: " + ", ".join(f"{k} {v}" for k, v in t.items())
                          for f, t in sorted(lead["teacher_trace"].items()))
        L += ["", f"- teacher-forced calls (the paths scored): {calls} (a prefill whose path and fold order are "
              "A's is copied from A, not recomputed)"]
    if vd:
        why = f" ({vd['reason']})" if vd.get("reason") else ""
        L += ["", f"**Verdict: {vd['verdict']}**{why} — {vd['test']}: A->B above A->F on {vd['above']} questions, "
              f"below on {vd['below']} ({vd['ties']} ties), p = {vd['p']:.3g}; mean KL ratio B/F "
              f"{_f(vd['kl_ratio'], '.3g')}."]
        if vd.get("p_below") is not None and vd["p_below"] < vd.get("alpha", 0.01) and vd.get("decided", True):
            L.append(f"- the other tail: A->B below A->F on most questions (p = {vd['p_below']:.3g}): the floor "
                     "drifts more than B here, so it bounds B's noise loosely")
    v = rep["compare"].get("answer_diffs_vs_floor")
    if v:
        L.append(f"- A/B answer flips against the floor's drift at their step: within {v['within floor drift']}, "
                 f"beyond {v['beyond floor drift']}, not measurable {v['n/a']}")
    fc = (rep.get("floor") or {}).get("compare") or {}
    w = fc.get("answer_diffs_vs_floor")
    if w and fc.get("drift_of") == "b":
        L.append(f"- control, roles swapped: A/F answer flips against B's drift at their step: within "
                 f"{w['within floor drift']}, beyond {w['beyond floor drift']}, not measurable {w['n/a']} "
                 "(equally noisy reorderings give alike counts)")
    return L


def _m(v, bound):
    if v is None:
        return "n/a"
    return (">=" if bound else "") + f"{v:.4f}"


def _numeric(d: dict) -> str:
    if d.get("numeric_step") is None:
        return "n/a"
    delta = d.get("numeric_delta")
    return f"{d['numeric_step']}, {delta:.3g}" if delta is not None else f"{d['numeric_step']}, n/a"


def _esc(s: str, n: int = 80) -> str:
    s = s.replace("\n", "\\n").replace("|", "\\|")
    return s if len(s) <= n else "…" + s[-n:]


def _timing(rep: dict) -> list[str]:
    """Wall time and each run's seconds per phase (prefill calls copied from another run cost none)."""
    runs = [r for r in rep["runs"] if r.get("phases")]
    if not runs and rep.get("wall_seconds") is None:
        return []
    out = [""]
    if rep.get("wall_seconds") is not None:
        out.append(f"- wall time {rep['wall_seconds']:.1f} s (model load and conversion "
                   f"{rep['model'].get('convert_seconds', 0):.1f} s)")
    g = rep.get("decode_graphs")
    if g:
        out.append(f"- decode calls (M <= {g['max_m']}) replayed from CUDA graphs in this process: "
                   f"{g['captured']} graphs captured, {g['replayed']} replays")
    for r in runs:
        ph = ", ".join(f"{k} {v:.1f}" for k, v in r["phases"].items())
        out.append(f"- run {r['label']} seconds per phase: {ph}"
                   + (f"; {r['copied_calls']} prefill calls copied from a run with the same arithmetic"
                      if r.get("copied_calls") else ""))
    return out


def markdown(rep: dict) -> str:
    L = [f"# GSM8K answer diff: {rep['a']['label']} vs {rep['b']['label']}", ""]
    from ..backend_status import line
    warn = line(rep.get("backend_status"))        # the backend's missing records
    if warn:
        L += [warn, ""]
    L += [f"- model: {rep['model']['id']} ({rep['model']['digits']} balanced-ternary digit(s)"
          f"{', already ternary: lossless' if rep['model']['ternary'] else ''}; weight relative RMS error "
          f"{rep['model']['rel_rms']:.4g}, worst projection {rep['model']['max_rel_rms']:.4g})",
          f"- data: {rep['data']['source']}, {rep['data']['n']} questions; prompt {rep['data']['format']}, "
          f"{rep['data']['shots']} shot(s) from train; max new tokens {rep['data']['max_new_tokens']}, "
          f"batch {rep['data']['batch_size']}",
          f"- backend: {rep['backend']}" + (f" ({rep['cpu_threads']} CPU thread(s)"
                                             + (f", GEMM {rep['emulation_gemm']})" if rep.get("emulation_gemm") else ")")
                                             if rep.get("cpu_threads") else "")
          + f"; near-tie threshold {rep['compare']['near_tie_nats']} nats", ""]
    L += ["| run | kernels | score | invalid | strict invalid | tokens | tok/s | paths (calls) | M seen |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rep["runs"]:
        s = r["summary"]
        paths = ", ".join(f"{k} {v}" for k, v in sorted(r["trace"].items()))
        ms = "; ".join(f"{k}: {v}" for k, v in sorted(r["m_seen"].items()))
        spec = r["spec"] + (f", groups folded in reverse at M {r['fold_reversed_m']}" if r.get("fold_reversed_m") else "")
        L.append(f"| {r['label']} | `{spec}` | {s['correct']}/{s['n']} ({100 * s['accuracy']:.1f}%) | "
                 f"{s['invalid']} ({100 * s['invalid_rate']:.1f}%) | {s['strict_invalid']} | {s['tokens']} | "
                 f"{r.get('tok_per_s') or 0:.1f} | {paths} | {ms} |")
    L += _timing(rep)
    c = rep["compare"]
    L += ["", "## A vs B", "",
          f"- identical answers: **{c['identical_answers']}/{c['n']}**; identical generations "
          f"(every token): {c['identical_generations']}/{c['n']}",
          f"- answers that differ: **{c['answer_diffs']}** (right->wrong {c['by_class']['right->wrong']}, "
          f"wrong->right {c['by_class']['wrong->right']}, both wrong {c['by_class']['both wrong']}); "
          f"near-tie flips {c['by_kind']['near-tie']}, real divergences {c['by_kind']['real']}",
          f"- generations that differ with the same answer: {c['text_only_diffs']} "
          f"(near-tie {c['text_only_by_kind']['near-tie']}, real {c['text_only_by_kind']['real']})"]
    L.append(f"- questions whose decode M differed between A and B before their first differing token "
             f"(a batch-mate stopped at another step): {c.get('batchmate_m_differs', 0)}")
    if rep.get("control"):
        k = rep["control"]
        L += [f"- control A/A: identical answers {k['identical_answers']}/{k['n']}, identical generations "
              f"{k['identical_generations']}/{k['n']}, answers that differ {k['answer_diffs']}"]
    L += _floor_section(rep)
    for title, rows in (("Answers that differ", c["diffs"]), ("Same answer, different text", c["text_only"])):
        if not rows:
            continue
        L += ["", f"### {title}", "",
              "| id | class | A answer | B answer | step | A token | B token | margin A | margin B | kind | "
              "floor drift there | vs floor | M differs from step | logprobs first differ (step, max delta) | "
              "shared prefix (end) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for d in rows:
            fd = d.get("floor_drift")
            L.append(f"| {d['id']} | {d['class'] or 'same'} | {d['answer_a']} | {d['answer_b']} | {d['step']} | "
                     f"`{_esc(d.get('text_a', str(d['token_a'])), 20)}` | `{_esc(d.get('text_b', str(d['token_b'])), 20)}` | "
                     f"{_m(d['margin_a'], d['margin_a_bound'])} | {_m(d['margin_b'], d['margin_b_bound'])} | "
                     f"{d['kind']} | {'n/a' if fd is None else f'{fd:.4f}'} | {d.get('vs_floor', 'n/a')} | "
                     f"{d.get('m_differs_step') if d.get('m_differs_step') is not None else '-'} | "
                     f"{_numeric(d)} | {_esc(d.get('prefix', ''))} |")
    if rep.get("errors"):
        L += ["", "## Errors", ""] + [f"- {e}" for e in rep["errors"]]
    return "\n".join(L) + "\n"


def html(rep: dict, md: str, recs_a: dict, recs_b: dict) -> str:
    """The report as one self-contained page: the verdict, the Markdown summary, and for each
    question whose answer or text differs, A's and B's generations side by side from the step
    where they part (the shared prefix above them)."""
    from ..report import html as h
    cmp, verdict = rep["compare"], rep.get("verdict") or {}
    body = [h.meta({"model": rep["model"]["id"], "A": rep["a"]["label"], "B": rep["b"]["label"],
                    "backend": rep["backend"], "questions": rep["data"]["n"]})]
    if verdict:
        # green only for a decided "within": too small to decide, or a void floor, is no pass
        within = verdict.get("decided", True) and verdict.get("verdict") == "within arithmetic noise"
        why = f" ({verdict['reason']})" if verdict.get("reason") else ""
        body.append(h.verdict(within, f"verdict: {verdict.get('verdict', verdict)}{why}"))
    body.append(h.verdict(rep["switch_ok"], f"{cmp['identical_answers']} of {cmp['n']} answers identical; "
                                            f"{cmp['answer_diffs']} differ"))
    body.append("<h2>Divergences, side by side</h2>")
    rows, cls = [], []
    for d in cmp["diffs"] + cmp["text_only"]:
        q = d["id"]
        a, b = recs_a.get(q, {}), recs_b.get(q, {})
        prefix = d.get("prefix") or ""
        rows.append([q, d.get("class") or "same", d.get("kind", "-"), d.get("step", "-"),
                     f"...{prefix[-200:]}" if len(prefix) > 200 else prefix,
                     a.get("text", ""), b.get("text", "")])
        cls.append("fail" if d.get("kind") == "real" else "warn")
    body.append(h.table(["question", "class", "kind", "first differing step", "shared prefix",
                         "A's generation", "B's generation"], rows, cls))
    body.append("<h2>Report</h2>" + h.from_markdown(md))
    return h.page("pq2verify gsm8k A/B", body)
