"""The gsm8k command's contract (issues 23 and 24): an A/B compares two different things, the
noise floor is a control, bad input is refused before any work naming the option, results are
never lost (collisions refused, damaged lines set aside, the console verdict printed before any
file is written), and a verdict the sign test cannot reach says so everywhere.

Each row once gave a green, a traceback, a wrong message, or lost data. Reproduce one with
    .venv/bin/python -m pytest -p no:randomly -q tests/test_contract_gsm8k.py -k <name>
"""
import json
import os
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from test_gsm8k_cli import cpu_env, lines, tiny_model  # noqa: F401  (fixtures)

pytest.importorskip("transformers")

SMALL = ["--digits", "2", "--threads", "1", "--batch-size", "2", "--max-new-tokens", "4"]


@pytest.fixture(autouse=True)
def _cli(run_cli):
    global _in_process
    _in_process = run_cli


def gsm8k(capsys, *argv):
    """(exit code, stdout, stderr) of an in-process `pq2verify --device cpu gsm8k ARGV`."""
    return _in_process(["--device", "cpu", "gsm8k", *argv])


def _refuse(what):
    def refuse(*a, **k):
        raise AssertionError(f"{what} before the bad input was refused")
    return refuse


@pytest.fixture
def no_run(monkeypatch, cpu_env):  # noqa: F811
    """Nothing past argument and path checks: the run itself raises."""
    from pq2verify.gsm8k import cli as gcli
    monkeypatch.setattr(gcli, "_main", _refuse("the run started"))


@pytest.fixture
def no_model(monkeypatch, cpu_env):  # noqa: F811
    """The model never loads (a check that needs no model must come before it)."""
    from pq2verify.gsm8k import model
    monkeypatch.setattr(model, "prepare", _refuse("the model was loaded"))


@pytest.fixture
def no_generation(monkeypatch, cpu_env):  # noqa: F811
    """The model loads (a check may need its tokenizer and config) but nothing is generated."""
    from pq2verify.gsm8k import generate
    monkeypatch.setattr(generate, "Generator", _refuse("generation started"))


# --- issue 23 class 6: an A/B must compare two different things ------------------------------
REFUSALS = [("tuned", "tuned"), ("legacy", "legacy,single=off,gemv=off,small_mma=off"),
            ("exact", "exact,gemv=off,single=off"), ("tuned", "tuned,single=off")]


def _why_alike(a: str, b: str) -> str:
    """Why B cannot differ from A, derived from the dispatch rule (not from a prediction): a
    switch `p=off` only removes p from the candidates, so turning off paths that A's set does
    not hold, or one that a path before it in the set's order always shadows, changes nothing."""
    from kernels import sets as kernelsets
    from pq2verify import registry
    members = [p.name for p in kernelsets.members(a, "emulate", weight="pq2")]   # the CLI's CPU backend
    offs = [x.split("=")[0] for x in b.split(",")[1:]]
    if a == b:
        return "the same spec"
    if not set(offs) & set(members):
        return f"{', '.join(offs)}: not {a} paths"
    gemv, single = registry.get("gemv"), registry.get("single")
    assert offs == ["single"] and members.index("gemv") < members.index("single"), (a, b, members)
    assert (gemv.m_min, gemv.m_max) == (single.m_min, single.m_max)
    return "gemv comes first at single's only M"


@pytest.mark.parametrize("a,b", REFUSALS, ids=[f"{a}-vs-{b}" for a, b in REFUSALS])
def test_specs_that_resolve_alike_are_refused_before_the_model_loads(a, b, tiny_model, tmp_path,  # noqa: F811
                                                                    capsys, no_model):
    why = _why_alike(a, b)
    rc, _, err = gsm8k(capsys, "--model", tiny_model, "--out", tmp_path, "--a", a, "--b", b, *SMALL)
    assert rc == 2 and "SWITCH PROOF FAILED before running" in err and "the same path at every M" in err, (why, err)
    assert not any(tmp_path.iterdir())


def _m_calls(**paths):
    return {name: dict(ms) for name, ms in paths.items()}


@pytest.mark.parametrize("a,b,teacher,ok,says", [
    # B's trace equals A's at every shared M: the switch never reached the code
    (_m_calls(int_gemv={1: 4, 2: 8}, mmq={40: 2}), _m_calls(int_gemv={1: 4, 2: 8}, mmq={40: 2}),
     _m_calls(int_gemv={1: 4, 2: 8}, mmq={40: 2}), False, "B's paths were A's"),
    # B differs only at an M that A never ran: nothing compared differed
    (_m_calls(int_gemv={2: 8}, mmq={40: 2}), _m_calls(gemv={1: 3}, int_gemv={2: 8}, mmq={40: 2}),
     _m_calls(int_gemv={2: 8}, mmq={40: 2}), False, "at every M both ran"),
    # free runs differ but the teacher-forced calls ran A's paths (a lost switch in the follower)
    (_m_calls(int_gemv={1: 4}, mmq={40: 2}), _m_calls(gemv={1: 4}, mmq={40: 2}),
     _m_calls(int_gemv={1: 4}, mmq={40: 2}), False, "teacher-forced at A's Ms"),
    (_m_calls(int_gemv={1: 4}, mmq={40: 2}), _m_calls(gemv={1: 4}, mmq={40: 2}),
     _m_calls(gemv={1: 4}, mmq={40: 2}), True, None),
], ids=["same-everywhere", "differs-at-an-M-A-never-ran", "teacher-ran-A's-paths", "differs"])
def test_the_trace_proves_b_ran_other_paths_at_a_shared_m(a, b, teacher, ok, says):
    from pq2verify.gsm8k import switch
    got = switch.trace_proof({"m_calls": a, "teacher_m_calls": {"b": teacher}}, {"m_calls": b})
    assert got["ok"] is ok and (says is None or says in " ".join(got["errors"])), got


# --- issue 23 class 7: the noise floor must be a control -------------------------------------
def _rec(tokens, lp, teacher_kl=0.0):
    topk = [[[t, v]] for t, v in zip(tokens, lp)]
    return {"tokens": tokens, "topk": topk,
            "teacher": {"f": {"kl": [teacher_kl] * len(tokens), "top1": [True] * len(tokens),
                              "lpk": [[v] for v in lp]}}}


A_RECS = {0: _rec([1, 2], [-0.1, -0.2])}
RUN_A = {"m_calls": {"int_gemv": {1: 2}, "mmq": {40: 1}}, "teacher_m_calls": {"f": {"int_gemv": {1: 2}, "mmq": {40: 1}}}}
RUN_F = {"m_calls": {"int_gemv": {1: 2}, "mmq": {40: 1}}}


@pytest.mark.parametrize("fold,groups,recs_f,teacher_kl,void", [
    ((), 8, {0: _rec([1, 2], [-0.1, -0.25])}, 0.0, "at no M"),
    (((1, None),), 2, {0: _rec([1, 3], [-0.1, -0.3])}, 0.0, "at most 2 K group(s)"),      # a + b == b + a
    (((100, 200),), 8, {0: _rec([1, 3], [-0.1, -0.3])}, 0.0, "no call at an M"),
    (((1, None),), 8, {0: _rec([1, 2], [-0.1, -0.2])}, 0.0, "no output of F differs"),
    (((1, None),), 8, {0: _rec([1, 3], [-0.1, -0.3])}, 0.0, None),                        # a token differs
    (((1, None),), 8, {0: _rec([1, 2], [-0.1, -0.2001])}, 0.0, None),                     # a log-probability
    (((1, None),), 8, {0: _rec([1, 2], [-0.1, -0.2])}, 1e-9, None),                       # teacher-forced KL
], ids=["no-fold", "two-groups", "no-call-reversed", "outputs-equal", "token", "logprob", "teacher-kl"])
def test_a_floor_without_a_fold_change_or_an_output_change_is_void(fold, groups, recs_f, teacher_kl, void):
    from pq2verify.gsm8k import switch
    if groups == 2:     # why two groups make a void floor: IEEE addition commutes, a three-term sum's order not
        a, b, c = torch.tensor([1.0, 3e-8, 3e-8], dtype=torch.float32)    # b, c: each half an ulp of 1 or less
        assert a + b == b + a and (a + b) + c != (c + b) + a
    recs_a = {0: _rec([1, 2], [-0.1, -0.2], teacher_kl)}
    got = switch.floor_control(RUN_A, RUN_F, fold, groups, recs_a, recs_f)
    assert (got["void"] is None) if void is None else (void in (got["void"] or "")), got


def test_the_other_tail_of_the_sign_test_is_reported():
    """Thresholds on a bias that can go either way: B closer to A than F on every question is
    the lower tail, P(X <= 0) = 2^-n, beside the verdict's upper one."""
    from pq2verify.gsm8k import floor
    st = floor.sign_test({q: 0.0 for q in range(7)}, {q: 1.0 for q in range(7)})
    assert st["p"] == 1.0 and st["p_below"] == Fraction(1, 2 ** 7)


# --- issue 24: a verdict without its power ---------------------------------------------------
# the one-sided sign test's smallest p over n untied questions is 2^-n (all above); p < 0.01
# needs 2^n > 100: 2^6 = 64, 2^7 = 128, so 7 questions
NEED = 7


@pytest.mark.parametrize("above,below,ties,verdict", [
    (2, 0, 0, "too small to decide"),          # the green "within arithmetic noise" from 2 questions
    (6, 0, 0, "too small to decide"),          # 2^-6 = 0.0156: alpha out of reach
    (6, 0, 5, "too small to decide"),          # ties do not count
    (0, 1, 0, "too small to decide"),
    (7, 0, 0, "beyond arithmetic noise"),      # 2^-7 = 0.0078 < 0.01
    (4, 3, 0, "within arithmetic noise"),
])
def test_the_verdict_says_too_small_below_the_sign_tests_power(above, below, ties, verdict):
    from pq2verify.gsm8k import floor
    assert floor.min_questions(0.01) == NEED
    kb = {q: 2.0 for q in range(above)} | {100 + q: 0.5 for q in range(below)} | {200 + q: 1.0 for q in range(ties)}
    kf = {q: 1.0 for q in kb}
    tf = lambda kl: {"mean_kl": sum(kl.values()) / len(kl), "per_question": {q: {"kl": v} for q, v in kl.items()}}  # noqa: E731
    vd = floor.verdict(tf(kb), tf(kf))
    assert vd["verdict"] == verdict and vd["decided"] is (verdict != "too small to decide"), vd
    if not vd["decided"]:
        assert f"only from {NEED}" in vd["reason"]


@pytest.fixture
def noisy_floor(monkeypatch):
    """F made to differ from A (its reversed weights' scales changed: a planted fault, not a
    reordering): on the tiny model a true reordering changes no output (two-group sums), so
    without it the floor is void."""
    from kernels.format import BLOCK_BYTES, PQ2Weight
    from pq2verify.gsm8k import model
    real = model.reversed_groups

    def scaled(w):
        r = real(w)
        raw = r.to_raw().data.view(r.n, r.groups, BLOCK_BYTES).clone()
        raw[..., :2] = (raw[..., :2].contiguous().view(torch.float16) * 1.5).view(torch.uint8).view(r.n, r.groups, 2)
        out = PQ2Weight.from_raw(raw.reshape(r.n, -1).contiguous())
        return out.to_prepared() if w.layout == "prepared" else out
    monkeypatch.setattr(model, "reversed_groups", scaled)


@pytest.mark.parametrize("limit,plant,verdict,green", [
    (2, True, "too small to decide", False),
    (2, False, "no verdict: the noise floor is void", False),
    (8, True, "within arithmetic noise", True),
], ids=["too-small", "void-floor", "decided"])
def test_an_unreachable_verdict_is_said_everywhere_and_never_green(limit, plant, verdict, green, tiny_model,  # noqa: F811
                                                                   tmp_path, capsys, cpu_env, request):
    if plant:
        request.getfixturevalue("noisy_floor")
    out, page = tmp_path / "out", tmp_path / "page.html"
    rc, stdout, err = gsm8k(capsys, "--model", tiny_model, "--out", out, "--limit", limit, "--html", page, *SMALL)
    assert rc == 0, err                      # the noise verdict is never an exit code (gsm8k --help)
    rep = json.loads((out / "report.json").read_text())
    assert rep["verdict"]["verdict"] == verdict and rep["verdict"]["decided"] is green
    assert rep["verdict"]["min_questions"] == NEED
    for text in (stdout, (out / "report.md").read_text()):
        assert f"**Verdict: {verdict}**" in text
    html = page.read_text()
    assert f'class="verdict-{"pass" if green else "fail"}">verdict: {verdict}' in html
    if not green:
        assert f"{verdict}:" in err                        # and on stderr, with its reason


# --- issue 24 class 1: lost results -------------------------------------------------------------
@pytest.mark.parametrize("where,says", [
    ("out/report.json", "inside the folder of --out"),
    ("out/report.md", "inside the folder of --out"),
    ("data.jsonl", "is the input --data"),
    ("", "--html: empty path"),
    ("data-dir", "--data {tmp}: is a folder"),
])
def test_html_on_a_file_the_run_writes_or_reads_is_refused(where, says, tmp_path, capsys, no_run):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "report.json").write_text("{}")
    data = tmp_path / "data.jsonl"
    data.write_text('{"question": "q", "answer": "#### 1"}\n')
    html = str(tmp_path / where) if where else ""
    if where == "data-dir":                   # the data a folder: said as such, before the collision
        data, html = tmp_path, str(tmp_path.parent / "page.html")
    rc, _, err = gsm8k(capsys, "--out", tmp_path / "out", "--data", data, "--html", html)
    assert rc == 2 and says.format(tmp=tmp_path) in err, err
    assert (tmp_path / "out" / "report.json").read_text() == "{}"
    assert (tmp_path / "data.jsonl").read_text().startswith('{"question"')


REC = {"prompt_hash": "h", "tokens": [1], "topk": [[[1, -0.1]]], "text": "t", "stop": None, "gold": "1",
       "strict": None, "flexible": None, "answer": None, "correct": False, "invalid": True,
       "strict_invalid": True, "decode_m": []}


@pytest.mark.parametrize("bad,why", [
    (b'{"id": 2, "tokens": [1, 2', "not JSON"),                      # corrupt in the middle
    (json.dumps({k: v for k, v in REC.items()}).encode(), "no question id"),   # KeyError: 'id' before
    (json.dumps({**REC, "id": "2"}).encode(), "is not a question id"),
    (b'[1, 2, 3]', "not a JSON object"),
    (json.dumps({**{k: v for k, v in REC.items() if k != "tokens"}, "id": 2}).encode(), "field 'tokens' missing"),
], ids=["torn", "no-id", "string-id", "list", "no-tokens"])
def test_a_damaged_line_is_set_aside_and_every_intact_record_kept(bad, why, tmp_path, capsys):
    from pq2verify.gsm8k import runs
    rd = runs.RunDir(tmp_path, "a-x", {"k": 1})
    for q in range(5):
        rd.append({**REC, "id": q})
    text = rd.file.read_bytes().split(b"\n")
    text[2] = bad                                                     # line 3 of 5
    rd.file.write_bytes(b"\n".join(text))
    again = runs.RunDir(tmp_path, "a-x", {"k": 1})
    assert sorted(again.done) == [0, 1, 3, 4]                        # every later record kept
    err = capsys.readouterr().err
    assert "1 damaged line(s) set aside" in err and "(line 3: " in err and why in err, err
    assert (rd.path / "generations.jsonl.damaged").read_bytes() == bad + b"\n"
    assert [json.loads(x)["id"] for x in rd.file.read_text().splitlines()] == [0, 1, 3, 4]
    assert again.append({**REC, "id": 2}) and sorted(runs.RunDir(tmp_path, "a-x", {"k": 1}).done) == list(range(5))


def test_a_torn_last_line_is_set_aside_too(tmp_path, capsys):
    from pq2verify.gsm8k import runs
    rd = runs.RunDir(tmp_path, "a-x", {"k": 1})
    rd.append({**REC, "id": 0})
    with open(rd.file, "ab") as f:
        f.write(b'{"id": 1, "tok')
    assert sorted(runs.RunDir(tmp_path, "a-x", {"k": 1}).done) == [0]
    assert "cut short" in capsys.readouterr().err
    assert (rd.path / "generations.jsonl.damaged").read_bytes() == b'{"id": 1, "tok\n'


@pytest.mark.parametrize("text", ['{"batches": {"0,1": ', "[]", '{"batches": []}'], ids=["torn", "list", "batches-list"])
def test_a_damaged_ledger_is_set_aside_and_its_batches_replayed(text, tmp_path, capsys):
    from pq2verify.gsm8k import execute, runs
    rd = runs.RunDir(tmp_path, "a-x", {"k": 1})
    rd.append({**REC, "id": 0})
    (rd.path / execute.LEDGER).write_text(text)
    assert execute.todo(rd, [[0], [1]]) == [[0], [1]]                # every batch replayed ...
    assert sorted(rd.done) == [0]                                     # ... the question written kept
    assert (rd.path / (execute.LEDGER + ".damaged")).read_text() == text
    assert "damaged, set aside" in capsys.readouterr().err


def test_a_write_that_fails_during_the_run_is_a_write_error(tmp_path, monkeypatch):
    from pq2verify import outputs
    from pq2verify.gsm8k import runs
    rd = runs.RunDir(tmp_path, "a-x", {"k": 1})
    rd.append({**REC, "id": 0})

    def full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(runs.os, "fsync", full)
    with pytest.raises(outputs.WriteError, match=r"--out .*generations.jsonl: could not write: No space left"):
        rd.append({**REC, "id": 1})
    monkeypatch.setattr(runs.os, "replace", lambda a, b: full(None))
    with pytest.raises(outputs.WriteError, match=r"ledger.json: could not write: No space left"):
        rd.write_json("ledger.json", {"batches": {}})
    monkeypatch.undo()
    assert 0 in runs.RunDir(tmp_path, "a-x", {"k": 1}).done           # the record before it kept


def test_resume_after_damage_generates_only_what_is_missing(tiny_model, tmp_path, capsys, cpu_env):  # noqa: F811
    argv = ("--model", tiny_model, "--limit", "5", "--no-floor", *SMALL)
    assert gsm8k(capsys, *argv, "--out", tmp_path / "clean")[0] == 0
    clean = {x["id"]: x for x in lines(next((tmp_path / "clean").glob("a-*")))}
    assert gsm8k(capsys, *argv, "--out", tmp_path / "r")[0] == 0
    ra, rb = (next((tmp_path / "r").glob(f"{x}-*")) for x in "ab")
    la = (ra / "generations.jsonl").read_text().splitlines()
    la[2] = la[2][: len(la[2]) // 2]                                  # corrupt in the middle
    (ra / "generations.jsonl").write_text("\n".join(la) + "\n")
    lb = [json.loads(x) for x in (rb / "generations.jsonl").read_text().splitlines()]
    del lb[1]["id"]                                                   # once KeyError: 'id'
    (rb / "generations.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lb))
    rc, _, err = gsm8k(capsys, *argv, "--out", tmp_path / "r")
    assert rc == 0 and err.count("damaged line(s) set aside") == 2, err
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [r["resumed_from_earlier"] for r in rep["runs"]] == [4, 4]   # only the damaged one redone
    got = {x["id"]: x for x in lines(ra)}
    assert got.keys() == clean.keys() and all(got[q]["tokens"] == clean[q]["tokens"] for q in got)
    assert (ra / "generations.jsonl.damaged").exists() and (rb / "generations.jsonl.damaged").exists()


# --- issue 24 class 2: write failures --------------------------------------------------------
def test_an_unwritable_html_is_refused_before_the_run(tmp_path, capsys, no_run):
    rc, _, err = gsm8k(capsys, "--out", tmp_path / "out", "--html", "/dev/full")
    assert rc == 2 and "--html /dev/full: cannot write" in err, err


def test_a_write_that_fails_after_the_run_keeps_the_verdict_and_the_other_reports(tiny_model, tmp_path, capsys,  # noqa: F811
                                                                                  cpu_env, monkeypatch):
    from pq2verify import outputs
    monkeypatch.setattr(outputs, "_probe_device", lambda p, opt: None)   # the disk fills during the run
    out = tmp_path / "out"
    rc, stdout, err = gsm8k(capsys, "--model", tiny_model, "--out", out, "--limit", "2", "--no-floor",
                            "--html", "/dev/full", *SMALL)
    assert rc == outputs.EXIT_WRITE == 3, err
    assert "# GSM8K answer diff" in stdout and "--html /dev/full: could not write" in err
    assert "Traceback" not in err
    assert json.loads((out / "report.json").read_text())["data"]["n"] == 2 and (out / "report.md").exists()


# --- issue 24 classes 3, 5, 8: empty values, nonsense numbers, options named -----------------
@pytest.mark.parametrize("argv,says", [
    (["--ids", ""], "argument --ids: expected question ids like 0,5,7-9, got ''"),
    (["--ids", ","], "argument --ids: expected question ids like 0,5,7-9"),
    (["--ids", "1,,2"], "argument --ids: expected question ids like 0,5,7-9"),
    (["--ids", "abc"], "argument --ids: 'abc' in 'abc' is not an id"),
    (["--ids", "5-3"], "argument --ids: range '5-3' in '5-3' runs backwards"),
    (["--ids", "-1"], "argument --ids"),
    (["--top-k", "100000"], "argument --top-k: 100000 is above 1024"),
    (["--near-tie", "nan"], "argument --near-tie: expected a finite number of nats >= 0, got 'nan'"),
    (["--near-tie", "inf"], "argument --near-tie: expected a finite number"),
    (["--near-tie", "-5"], "argument --near-tie: expected a finite number"),
    (["--near-tie", "x"], "argument --near-tie: expected a finite number"),
    (["--digits", "60"], "argument --digits: 60 is outside 1..15"),
    (["--digits", "16"], "argument --digits: 16 is outside 1..15"),
    (["--out", ""], "argument --out: expected a value"),            # once: the default folder, 128 questions
    (["--model", ""], "argument --model: expected a value"),
    (["--data", ""], "argument --data: expected a value"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_bad_values_are_usage_errors_naming_the_option(argv, says, capsys, no_run):
    rc, _, err = gsm8k(capsys, *argv)
    assert rc == 2 and says in err, err


def test_the_digit_limit_is_where_float32_stops_being_exact():
    """T digits hold |n| <= (3^T - 1)/2; the conversion's float32 integers are exact to 2^23."""
    from pq2verify import cli
    from pq2verify.gsm8k import convert
    assert (3 ** 15 - 1) // 2 == 7174453 <= 2 ** 23 < (3 ** 16 - 1) // 2 == 21523360
    args = cli.build_parser().parse_args(["gsm8k", "--digits", "15", "--near-tie", "0", "--top-k", "1024"])
    assert (args.digits, args.near_tie, args.top_k) == (15, 0.0, 1024)
    with pytest.raises(ValueError, match="outside 1..15"):
        convert.quantize_digits(torch.ones(1, 128), 16)


@pytest.mark.parametrize("argv,says", [
    (["--ids", "5000"], "--ids: [5000] outside the test split's 0..1318"),
    (["--shots", "8000"], "--shots 8000: the train split has 7473 questions"),
    (["--ids", "0-99999999999"], "--ids: [99999999999] outside the test split's 0..1318"),   # no list of 1e11
    (["--a", ""], "--a: kernel spec is empty"),
    (["--b", ","], "--b: kernel spec is empty"),
    (["--b", "tuned,single=on,single=off"], "--b: kernel spec 'tuned,single=on,single=off': single given twice"),
], ids=["ids-beyond", "shots-beyond", "ids-huge-range", "a-empty", "b-comma", "b-twice"])
def test_selections_beyond_the_data_are_refused_before_the_model_loads(argv, says, tiny_model, tmp_path,  # noqa: F811
                                                                       capsys, no_model):
    rc, _, err = gsm8k(capsys, "--model", tiny_model, "--out", tmp_path, *SMALL, *argv)
    assert rc == 2 and says in err, err


@pytest.mark.parametrize("argv,says", [
    (["--top-k", "500"], "--top-k 500: above the model's vocabulary of 400 tokens"),
    (["--shots", "100"], "beyond the model's context of 4096 tokens; at most"),
    (["--shots", "2", "--max-new-tokens", "5000"], "--max-new-tokens 5000: the longest prompt"),
], ids=["top-k-vocab", "shots-context", "max-new-context"])
def test_limits_of_the_model_are_refused_before_any_generation(argv, says, tiny_model, tmp_path, capsys,  # noqa: F811
                                                               no_generation):
    rc, _, err = gsm8k(capsys, "--model", tiny_model, "--out", tmp_path, "--limit", "2",
                       "--digits", "2", "--threads", "1", *argv)
    assert rc == 2 and says in err, err


# --- issue 24 class 7: malformed data rows, named by file and line, before the model ---------
@pytest.mark.parametrize("line,says", [
    ('{"answer": "#### 4"}', "no 'question' field"),
    ('["What is 2+2?", "#### 4"]', "expected a JSON object with 'question' and 'answer', got a list"),
    ('{"question": 5, "answer": "#### 5"}', "'question' is an integer, expected text"),
    ('{"question": "q", "answer": null}', "'answer' is null, expected text"),
    ('{"question": "What is 2+2?", "answer": "#### 4"', "not JSON"),
    ("", "empty line (ids are line numbers)"),
], ids=["no-question", "list", "int-question", "null-answer", "bad-json", "empty"])
def test_malformed_data_rows_name_file_and_line(line, says, tiny_model, tmp_path, capsys, no_model):  # noqa: F811
    good = json.dumps({"question": "What is 1+1?", "answer": "#### 2"})
    f = tmp_path / "q.jsonl"
    f.write_text(f"{good}\n{line}\n{good}\n")
    rc, _, err = gsm8k(capsys, "--model", tiny_model, "--out", tmp_path / "o", "--data", f, "--limit", "1", *SMALL)
    assert rc == 2 and f"--data {f}:2: {says}" in err, err


# --- issue 24 class 8: a folder without a model -----------------------------------------------
@pytest.mark.parametrize("files,says", [
    ({}, "the folder holds no model (no config.json, no weights, no tokenizer files)"),
    ({"config.json": "{}"}, "the folder holds no model (no weights, no tokenizer files)"),
    ({"m.gguf": "x"}, "pass --model"),
], ids=["empty", "config-only", "a-gguf-inside"])
def test_a_folder_without_a_model_says_so(files, says, tmp_path, capsys, no_model):
    d = tmp_path / "m"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    rc, _, err = gsm8k(capsys, "--model", d, "--out", tmp_path / "o")
    assert rc == 2 and f"--model {d}: " in err and says in err and "expected a .gguf file" in err, err
    assert "tokenizer" in err and "Traceback" not in err
