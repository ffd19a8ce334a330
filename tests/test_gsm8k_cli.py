"""End to end on a tiny random-weight Llama (built here, no downloads): the A/B report, the
control run, resume after an interruption, and the switch proof."""
import contextlib
import json
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


_TINY = {}     # the tiny model, built once per process (every gsm8k test module reads it; none writes it)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    if "dir" not in _TINY:
        _TINY["dir"] = _build_tiny_model(tmp_path_factory.mktemp("tiny"))
    return _TINY["dir"]


def _build_tiny_model(d):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from pq2verify.gsm8k import data
    test, train, _ = data.load()
    texts = [r["question"] + " " + r["answer"] for r in train[:300]]
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|im_end|>",
                                  unk_token="<unk>")
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    tok.save_pretrained(d)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(d)
    return d


@contextlib.contextmanager
def cpu_setting(mp, device):
    """No PQ2_* switches from the caller's shell; the CLI's --threads is put back after. (The
    emulation backend is the CLI's for its run only: conftest checks nothing else leaks.)
    These drive the CLI on the CPU backends; a process whose kernels are compiled for CUDA
    cannot switch to them (the GPU runner's gsm8k stage runs the real model there)."""
    if device == "cuda":
        pytest.skip("drives `gsm8k --device cpu`; this pytest process runs the kernels compiled for CUDA")
    for k in [k for k in os.environ if k.startswith("PQ2_")]:
        mp.delenv(k)
    # The FP32 GEMM for the emulation's integer dots (the same exact integers as oneDNN's, which
    # on torch 2.13's oneDNN 3.12 falls back to ref_int8, ~500x slower); workers inherit the env.
    from kernels import emulation
    mp.setenv("PQ2_EMULATE_GEMM", "fp32")
    mp.setattr(emulation, "_GEMM", "fp32")
    n = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(n)


@pytest.fixture
def cpu_env(monkeypatch, device):
    with cpu_setting(monkeypatch, device):
        yield


def run(model, out, *extra):
    from pq2verify import cli
    return cli.main(["--device", "cpu", "gsm8k", "--model", str(model), "--limit", "5", "--batch-size", "2",
                     "--max-new-tokens", "6", "--digits", "2", "--threads", "1", "--out", str(out), *extra])


def path_at(spec: str, m: int) -> str:
    """The path a kernel spec resolves to at M (the registry's, whatever paths it holds now)."""
    from pq2verify.gsm8k import execute, runs
    return execute.signature(runs.parse_spec(spec), (), "cpu", torch.bfloat16)(m)[0]


def lines(run_dir: Path):
    return [json.loads(x) for x in (run_dir / "generations.jsonl").read_text().splitlines()]


def test_ab_report_control_and_trace(tiny_model, tmp_path, cpu_env):
    from kernels import common      # imported first, so its INTERPRET is part of the state compared
    from kernels import backend
    mode = backend.mode_state()
    assert mode["kernels.common.INTERPRET"] is common.INTERPRET
    page = tmp_path / "ab.html"                   # outside --out: nothing inside the folder the run writes
    out = tmp_path / "out"
    assert run(tiny_model, out, "--a", "legacy", "--b", "tuned", "--control", "--html", str(page)) == 0
    # the emulation was this run's only: the interpreter mode and every kernel module imported
    # during the run (the tuned folds import kernels.single, small_mma) are as before
    assert backend.mode_state() == mode and backend.mixed_kernels() == []
    rep = json.loads((out / "report.json").read_text())
    assert (out / "report.md").read_text().startswith("# GSM8K answer diff")
    assert rep["backend"] == "emulate" and rep["data"]["n"] == 5
    a, b, f, a2 = rep["runs"]
    assert f["trace"].keys() == a["trace"].keys() and f["fold_reversed_m"] == "1+"    # the floor: A reordered
    # wherever B's path differs: gemv and small_mma at M 1-16, mmq_wgmma from 17 (test_gsm8k_floor)
    dec1, dec2 = path_at("tuned", 1), path_at("tuned", 2)                 # B's decode paths (M 1, 2)
    pre = path_at("tuned", 64)                                            # and its prefill path
    assert a["teacher_trace"]["b"].keys() == {dec1, dec2, pre}            # B scored on A's tokens at A's Ms
    assert rep["teacher"]["b"]["tokens"] == a["summary"]["tokens"] and rep["verdict"]["verdict"]
    # batches of 2, 2, 1: decode M in {1, 2}; the question prefill M > 16
    assert set(a["trace"]) == {"int_gemv", "mmq"}
    prefill = set(b["trace"]) - {dec1, dec2}
    assert {dec1, dec2} <= set(b["trace"]) and prefill == {pre}
    ms = {k: {int(m) for m in v} for k, v in b["m_calls"].items()}       # JSON keys are strings
    assert ms[dec1] == {1} and ms[dec2] == {2} and min(ms[prefill.pop()]) > 16
    for r in (a, b, f, a2):
        recs = lines(Path(r["dir"]))
        assert sorted(x["id"] for x in recs) == rep["data"]["ids"]
        assert all(len(x["topk"]) == len(x["tokens"]) for x in recs)
        assert all(x["prompt_hash"] == rep["data"]["prompt_hashes"][str(x["id"])] for x in recs)
    c = rep["control"]                                # A twice: greedy and deterministic
    assert c["identical_generations"] == 5 and c["answer_diffs"] == 0
    # the CLI writes the HTML page (its side-by-side rows: test_gsm8k_report, on constructed diffs;
    # this tiny run's answers may all agree)
    html = page.read_text()
    assert html.startswith("<!doctype html>") and "side by side" in html and rep["verdict"]["verdict"] in html
    assert rep["compare"]["identical_answers"] + rep["compare"]["answer_diffs"] == 5


def _totals(out: Path, label: str) -> dict:
    r = next(x for x in json.loads((out / "report.json").read_text())["runs"] if x["label"] == label)
    return {k: r.get(k) for k in ("trace", "m_calls", "tokens", "teacher_trace")}


def test_resume_after_interrupt_no_loss_no_duplicates(tiny_model, tmp_path, cpu_env, monkeypatch):
    from pq2verify.gsm8k import runs
    assert run(tiny_model, tmp_path / "clean", "--b", "legacy,int_gemv=off") == 0
    clean = {x["id"]: x for x in lines(next((tmp_path / "clean").glob("a-*")))}

    real = runs.RunDir.append
    count = {"n": 0}

    def crashing(self, rec):
        if self.path.name.startswith("a-"):  # the runs go batch by batch: count run A's lines only
            if count["n"] == 3:
                raise KeyboardInterrupt      # Ctrl-C in the middle of run A
            count["n"] += 1
        return real(self, rec)

    monkeypatch.setattr(runs.RunDir, "append", crashing)
    assert run(tiny_model, tmp_path / "r", "--b", "legacy,int_gemv=off") == 130
    rd = next((tmp_path / "r").glob("a-*"))
    assert len(lines(rd)) == 3
    # the killed session's finished batch left its calls and tokens behind, the unfinished none
    ledger = json.loads((rd / "ledger.json").read_text())
    assert len(ledger["batches"]) == 1
    assert ledger["prefix"]["calls"] and all(e["tokens"] > 0 for e in ledger["batches"].values())
    with open(rd / "generations.jsonl", "a") as f:
        f.write('{"id": 99, "tokens": [1, 2')              # a torn last line from a crash
    monkeypatch.setattr(runs.RunDir, "append", real)
    assert run(tiny_model, tmp_path / "r", "--b", "legacy,int_gemv=off") == 0
    got = lines(rd)
    assert sorted(x["id"] for x in got) == sorted(clean)     # no loss, no duplicate, no torn line
    for x in got:                                            # same batches, same M: same bits
        assert x["tokens"] == clean[x["id"]]["tokens"] and x["topk"] == clean[x["id"]]["topk"]
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    assert rep["runs"][0]["resumed_from_earlier"] == 3
    # the replayed batch and the second prefix prefill are counted once: the same calls per path
    # and M, tokens and teacher-forced calls as the uninterrupted run
    assert _totals(tmp_path / "r", "a") == _totals(tmp_path / "clean", "a")


def test_crash_after_a_batch_before_its_ledger_entry_replays_it(tiny_model, tmp_path, cpu_env, monkeypatch):
    """Killed after a batch's last question was written but before its ledger entry: the batch
    is replayed (no question written twice) and counted once."""
    from pq2verify.gsm8k import runs
    assert run(tiny_model, tmp_path / "clean", "--no-floor") == 0
    real = runs.RunDir.write_json
    seen = {"n": 0}

    def crashing(self, name, obj):
        if name == "ledger.json" and self.path.name.startswith("a-"):
            seen["n"] += 1
            if seen["n"] == 2:
                raise KeyboardInterrupt
        return real(self, name, obj)

    monkeypatch.setattr(runs.RunDir, "write_json", crashing)
    assert run(tiny_model, tmp_path / "r", "--no-floor") == 130
    rd = next((tmp_path / "r").glob("a-*"))
    assert len(lines(rd)) == 4 and len(json.loads((rd / "ledger.json").read_text())["batches"]) == 1
    monkeypatch.setattr(runs.RunDir, "write_json", real)
    assert run(tiny_model, tmp_path / "r", "--no-floor") == 0
    assert sorted(x["id"] for x in lines(rd)) == sorted(x["id"] for x in lines(next((tmp_path / "clean").glob("a-*"))))
    assert _totals(tmp_path / "r", "a") == _totals(tmp_path / "clean", "a")


def test_parallel_runs_in_worker_processes_give_the_same_generations(tiny_model, tmp_path, cpu_env):
    assert run(tiny_model, tmp_path / "seq", "--control", "--jobs", "1") == 0
    assert run(tiny_model, tmp_path / "par", "--control", "--jobs", "3") == 0
    seq = json.loads((tmp_path / "seq" / "report.json").read_text())
    par = json.loads((tmp_path / "par" / "report.json").read_text())
    assert [r["label"] for r in par["runs"]] == ["a", "b", "f", "a2"]
    for rs, rp in zip(seq["runs"], par["runs"]):
        # b and f ran in workers and were read back here: still nothing came from an earlier run
        assert rp["resumed_from_earlier"] == 0
        assert rs["trace"] == rp["trace"] and rs["m_calls"] == rp["m_calls"]
        a, b = ({x["id"]: x for x in lines(Path(r["dir"]))} for r in (rs, rp))
        assert a.keys() == b.keys()
        assert all(a[q]["tokens"] == b[q]["tokens"] and a[q]["topk"] == b[q]["topk"] for q in a)


def test_a_run_resumed_in_a_worker_reports_what_it_had_before(tiny_model, tmp_path, cpu_env):
    out = tmp_path / "par"
    assert run(tiny_model, out, "--no-floor", "--jobs", "2") == 0
    # a loses one question, b three: a resumes here, b (the second run with work) in a worker
    for label, keep in (("a", 4), ("b", 2)):
        f = next(out.glob(f"{label}-*")) / "generations.jsonl"
        f.write_text("\n".join(f.read_text().splitlines()[:keep]) + "\n")
    assert run(tiny_model, out, "--no-floor", "--jobs", "2") == 0
    rep = json.loads((out / "report.json").read_text())
    assert {r["label"]: r["resumed_from_earlier"] for r in rep["runs"]} == {"a": 4, "b": 2}
    assert all(len(lines(next(out.glob(f"{x}-*")))) == 5 for x in "ab")


def test_a_failing_worker_is_reported(tiny_model, tmp_path, cpu_env, capsys):
    bad = tmp_path / "gone"
    # the worker gets the same --model; make it fail by removing the model after the parent loaded it
    import shutil
    m = tmp_path / "m"
    shutil.copytree(tiny_model, m)
    from pq2verify.gsm8k import cli as gcli
    real = gcli._spawn

    def spawn(*a):
        shutil.rmtree(m, ignore_errors=True)
        return real(*a)

    gcli._spawn = spawn
    try:
        rc = run(m, bad, "--jobs", "2")
    finally:
        gcli._spawn = real
    assert rc == 4
    assert "failed in its worker process" in capsys.readouterr().err


def test_switch_proof_fails_fast_when_paths_are_the_same(tiny_model, tmp_path, cpu_env, capsys):
    from pq2verify import registry
    off = ",".join(f"{p.name}=off" for p in registry.paths(kset="tuned"))     # every tuned path
    rc = run(tiny_model, tmp_path, "--a", "legacy", "--b", f"tuned,{off}")
    assert rc == 2                                          # a usage error: nothing was run
    assert "SWITCH PROOF FAILED before running" in capsys.readouterr().err
    assert not (tmp_path / "report.json").exists()


def test_switch_proof_checks_the_executed_trace(tiny_model, tmp_path, cpu_env, monkeypatch, capsys):
    """Even when the prediction differs, the traces of the runs decide (a switch that was lost
    on the way to the code, as with a renamed variable)."""
    from pq2verify.gsm8k import cli as gcli, runs
    calls = {"n": 0}

    def predict(spec, *a):
        calls["n"] += 1
        return {(128, (1, None)): f"fake{calls['n']}"}
    monkeypatch.setattr(gcli, "_predict", predict)
    monkeypatch.setattr(runs, "spec_env", lambda spec: {"PQ2_KERNELS": "legacy"})   # the lost switch
    assert run(tiny_model, tmp_path, "--a", "legacy", "--b", "tuned") == 1            # a check failed
    assert "ran the same paths" in capsys.readouterr().err
    assert json.loads((tmp_path / "report.json").read_text())["switch_ok"] is False


@pytest.mark.parametrize("spec", ["fast", "tuned,warp=off", "tuned,single=maybe", "single=off,tuned"])
def test_bad_specs(spec, tiny_model, tmp_path, cpu_env, capsys):
    assert run(tiny_model, tmp_path, "--b", spec) == 2
    assert "kernel spec" in capsys.readouterr().err


def test_max_diff_exit_code(tiny_model, tmp_path, cpu_env, monkeypatch):
    from pq2verify.gsm8k import report
    real = report.compare    # one answer differs, whatever the tiny model does (--max-diff -1 is refused now)
    monkeypatch.setattr(report, "compare", lambda *a, **k: {**real(*a, **k), "answer_diffs": 1})
    assert run(tiny_model, tmp_path, "--max-diff", "0") == 1


def test_spec_parsing_and_env():
    from pq2verify.gsm8k import runs
    s = runs.parse_spec("tuned, small_mma=OFF")
    assert s == {"set": "tuned", "paths": {"small_mma": "off"}}
    assert runs.spec_env(s) == {"PQ2_KERNELS": "tuned", "PQ2_PATH_SMALL_MMA": "off"}
    os.environ["PQ2_PATH_SINGLE"] = "off"
    try:
        with runs.EnvSwitch(runs.spec_env(s)):
            # the run's own set and switch apply, not the shell's; os.environ is not touched
            from kernels import dispatch
            assert dispatch.kernel_set() == "tuned" and dispatch.switches() == {"small_mma": False}
            assert os.environ["PQ2_PATH_SINGLE"] == "off" and "PQ2_PATH_SMALL_MMA" not in os.environ
        assert dispatch.switches() == {"single": False}
        assert os.environ["PQ2_PATH_SINGLE"] == "off" and "PQ2_PATH_SMALL_MMA" not in os.environ
    finally:
        del os.environ["PQ2_PATH_SINGLE"]


def test_batching_prefix_and_padding_change_no_token(tiny_model, cpu_env, monkeypatch):
    """A prompt's greedy tokens are the same alone, in a padded batch, and with the shared
    prefix prefilled once (legacy set: the same per-row arithmetic at every M)."""
    from kernels import backend
    from pq2verify.gsm8k import data, generate, model as mdl
    monkeypatch.setenv("PQ2_KERNELS", "legacy")
    monkeypatch.setattr(backend, "_cpu_backend", "emulate")      # the CLI's CPU default
    conv = mdl.prepare(str(tiny_model), 2, "cpu")
    test, train, _ = data.load()
    ids = [0, 7, 12]
    toks = [conv.tokenizer(data.build_prompt(conv.tokenizer, test[i]["question"], train[:1])[0],
                           add_special_tokens=False).input_ids for i in ids]
    assert len({len(t) for t in toks}) > 1                     # so the batch really pads
    P = generate.common_prefix(toks)
    assert P > 10

    def gen(prefix, groups):
        g = generate.Generator(conv.model, conv.tokenizer, max_new_tokens=5, stops=["\nQuestion:"], top_k=3)
        g.set_prefix(toks[0][:prefix])
        out = {}
        for grp in groups:
            g.run_batch([generate.Request(i, toks[i]) for i in grp], lambda r: out.__setitem__(r.qid, r.tokens))
        return out

    alone = gen(0, [[0], [1], [2]])
    assert gen(0, [[0, 1, 2]]) == alone
    assert gen(P, [[0, 1, 2]]) == alone
    assert gen(P, [[2], [0, 1]]) == alone


def test_stop_sequences_cut_the_text(tiny_model):
    from pq2verify.gsm8k import generate

    class Tok:
        def decode(self, t, skip_special_tokens=False):
            return "".join(chr(65 + x) if x < 26 else "\n" for x in t)
    g = generate.Generator.__new__(generate.Generator)
    g.tok, g.stops, g.eos = Tok(), ["\nB"], {25}
    assert g._cut([0, 26, 1, 2]) == ("A", "stop:\nB")
    assert g._cut([0, 25]) == ("A", "eos")
    assert g._cut([0, 2]) == ("AC", None)


def test_workers_spread_over_visible_gpus(monkeypatch):
    """With several GPUs the worker processes take them round-robin (this process keeps the
    first); one GPU or the CPU leaves the environment alone."""
    from pq2verify.gsm8k.cli import worker_gpu
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert worker_gpu("cpu", 1, count=4) == {}
    assert worker_gpu("cuda", 1, count=1) == {}
    assert [worker_gpu("cuda", p, count=2) for p in (1, 2, 3)] == [
        {"CUDA_VISIBLE_DEVICES": "1"}, {"CUDA_VISIBLE_DEVICES": "0"}, {"CUDA_VISIBLE_DEVICES": "1"}]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")     # physical ids, as the parent was given them
    assert worker_gpu("cuda", 1, count=2) == {"CUDA_VISIBLE_DEVICES": "7"}
    assert worker_gpu("cuda", 2, count=2) == {"CUDA_VISIBLE_DEVICES": "5"}


def test_progress_in_a_log_is_lines_not_carriage_returns():
    """In a non-TTY stream (CI, a pipe, a GPU runner's log) the per-run question counter is a
    plain line every few seconds, never a \\r counter; the last update always prints."""
    import io
    from pq2verify.gsm8k.execute import _bar
    buf = io.StringIO()
    bar = _bar(3, "a legacy", 0, stream=buf)
    for _ in range(3):
        bar.set_postfix_str("36.5 tok/s")
        bar.update(1)
    bar.close()
    text = buf.getvalue()
    assert "\r" not in text
    assert text.strip().splitlines()[-1].startswith("[3/3]") and "a legacy" in text


@pytest.mark.parametrize("device,jobs,runs,threads,want", [
    ("cuda", 3, 3, None, 5),        # the H200 host: 16 cores, three processes
    ("cuda", 3, 2, None, 8),        # one run already done: two processes
    ("cuda", 3, 1, None, None),     # no workers: torch's default
    ("cuda", 1, 3, None, None),
    ("cuda", 3, 3, 7, None),        # --threads given: kept
    ("cpu", 3, 3, None, None),      # the CPU measures its idle cores itself
    ("cuda", 32, 32, None, 1),
])
def test_gpu_processes_share_the_cores(device, jobs, runs, threads, want):
    from pq2verify.gsm8k.cli import process_threads
    assert process_threads(device, jobs, runs, threads, cores=16) == want
