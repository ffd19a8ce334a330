"""Decode calls replayed from CUDA graphs (pq2verify/gsm8k/graphs.py): the generation and the
dispatch trace are those of the eager run, and there is one graph per (projection, M, fold
order, kernel switches). On the CPU a stand-in graph records the call at capture and re-runs it
at replay; on CUDA the real graphs (gpu marker)."""
import contextlib
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from test_gsm8k_cli import cpu_env, tiny_model  # noqa: F401  (fixtures)
from test_gsm8k_generate import _generate

pytest.importorskip("transformers")


@contextlib.contextmanager
def _muted():
    """A real replay launches kernels and runs no Python: nothing may count its calls but
    CallGraphs itself."""
    from kernels import dispatch
    trace, opened = Counter(dispatch.TRACE), list(dispatch._traces)
    dispatch._traces[:] = []
    try:
        yield
    finally:
        dispatch.TRACE.clear()
        dispatch.TRACE.update(trace)
        dispatch._traces[:] = opened


def stand_in(log: list):
    """A capture like torch.cuda.graph's: fn runs once on a static copy of x (its dispatch calls
    count, as a real capture's do), its output holds NaN until a replay computes it."""
    def capture(fn, x):
        sx = x.clone()
        y, served = fn(sx)
        y.fill_(float("nan"))
        log.append(x.shape[0])

        def replay():
            with _muted():
                y.copy_(fn(sx)[0])
        return SimpleNamespace(graph=SimpleNamespace(replay=replay), x=sx, y=y, served=Counter(served))
    return capture


@pytest.fixture
def conv(tiny_model, monkeypatch):  # noqa: F811
    from kernels import backend, emulation
    from pq2verify.gsm8k import model as mdl
    monkeypatch.setattr(backend, "_cpu_backend", "emulate")
    monkeypatch.setattr(emulation, "_GEMM", "fp32")
    monkeypatch.setenv("PQ2_KERNELS", "legacy")
    return mdl.prepare(str(tiny_model), 2, "cpu")


def _key(r):
    return r.tokens, r.topk, r.decode_m, r.text, r.stop


def test_a_graphed_generation_is_the_eager_one(conv):
    """Three questions, 10 new tokens (decode M 3 down to 1): tokens, exact log-probabilities,
    decode Ms and calls per (path, M) equal the eager run's; every decode key is captured once
    and replayed after."""
    from kernels import dispatch
    from pq2verify.gsm8k.graphs import CallGraphs
    ids = [0, 1, 2]
    eager = _generate(conv, ids, max_new=10)
    calls = Counter(conv.usage.calls)
    log = []
    conv.usage.calls = Counter()
    conv.usage.graphs = g = CallGraphs(capture=stand_in(log), device_type="cpu")
    with dispatch.trace() as seen:
        graphed = _generate(conv, ids, max_new=10)
    assert {q: _key(r) for q, r in graphed.items()} == {q: _key(r) for q, r in eager.items()}
    assert conv.usage.calls == calls, "the trace of a graphed run differs from the eager run's"
    assert sum(seen.values()) == sum(calls.values())
    assert g.replayed > g.captured > 0
    assert all(m <= g.max_m for m in log)
    assert g.graphs == len(log)


def test_one_graph_per_fold_order_switch_and_m(conv, monkeypatch):
    """The graph key holds all the call's arithmetic depends on: a stack called under another
    fold order, another kernel switch or another M gets its own graph, and each replay gives the
    eager bits of its own state; M above max_m runs eagerly."""
    from pq2verify.gsm8k.graphs import CallGraphs
    from pq2verify.gsm8k.model import PQ2Linear
    stack = next(m for m in conv.model.modules() if isinstance(m, PQ2Linear)).stack
    gen = torch.Generator().manual_seed(7)
    print("seed 7")
    x3 = torch.randn(3, stack.k, generator=gen).to(torch.bfloat16)
    x20 = torch.randn(20, stack.k, generator=gen).to(torch.bfloat16)
    u = conv.usage
    states = [((), {}), (((1, None),), {}), ((), {"PQ2_PATH_INT_GEMV": "off"})]

    def eager(x):
        u.graphs = None
        return torch.cat(stack.run(x), dim=-1)
    want = []
    for rev, env in states:
        with monkeypatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            u.reverse = rev
            want.append((eager(x3), eager(x20)))
    log = []
    g = CallGraphs(max_m=16, capture=stand_in(log), device_type="cpu")
    for _ in range(2):
        for (rev, env), (w3, w20) in zip(states, want):
            with monkeypatch.context() as mp:
                for k, v in env.items():
                    mp.setenv(k, v)
                u.reverse, u.graphs = rev, g
                for _ in range(3):
                    assert torch.equal(torch.cat(stack.run(x3), dim=-1).view(torch.int16), w3.view(torch.int16))
                    assert torch.equal(torch.cat(stack.run(x20), dim=-1).view(torch.int16), w20.view(torch.int16))
    u.reverse, u.graphs = (), None
    assert log == [3, 3, 3], "expected one graph per (fold order, switch) at M=3 and none at M=20"
    assert g.replayed == 3 * 2 * 3 - 3


@pytest.mark.gpu
@pytest.mark.parametrize("kset", ["legacy", "tuned"])
def test_cuda_graphs_give_the_eager_bits_on_the_gpu(tiny_model, monkeypatch, kset):  # noqa: F811
    """Real CUDA graphs (tuned: gemv at M = 1, small_mma at 2-16, split-K included): the same
    tokens, log-probabilities and calls per (path, M) as eager launches."""
    from pq2verify.gsm8k import model as mdl
    monkeypatch.setenv("PQ2_KERNELS", kset)
    out = {}
    for graphs in (False, True):
        conv = mdl.prepare(str(tiny_model), 2, "cuda", graphs=graphs)
        res = _generate(conv, [0, 1, 2, 3], max_new=12)
        out[graphs] = ({q: _key(r) for q, r in res.items()}, Counter(conv.usage.calls))
        if graphs:
            assert conv.usage.graphs.replayed > 0
    assert out[True] == out[False]


def test_graphs_need_cuda(tiny_model):  # noqa: F811
    from pq2verify.gsm8k import model as mdl
    with pytest.raises(ValueError, match="CUDA graphs need --device cuda"):
        mdl.prepare(str(tiny_model), 2, "cpu", graphs=True)


def test_the_cli_refuses_graphs_on_the_cpu(tmp_path, capsys, cpu_env):  # noqa: F811
    from pq2verify import cli
    rc = cli.main(["--device", "cpu", "gsm8k", "--graphs", "--limit", "1", "--out", str(tmp_path / "o")])
    assert rc == 2
    assert "CUDA graphs need --device cuda" in capsys.readouterr().err


@pytest.mark.parametrize("argv,msg", [
    (["--m", "0"], "argument --m: expected an integer >= 1, got '0'"),
    (["--m", "4,x"], "argument --m: expected an integer >= 1, got 'x'"),
    (["--steps", "0"], "argument --steps: expected an integer >= 1, got '0'"),
    (["--sets", "bogus"], "unknown kernel set"),
    (["--graphs", "--device", "cpu"], "need --device cuda"),
])
def test_forward_cost_refuses_impossible_options(argv, msg, capsys):
    """tools/profile/forward_cost.py (the graph speed-up's measurement) exits 2 before building a model."""
    import importlib.util
    from pathlib import Path
    tool = Path(__file__).resolve().parent.parent / "tools" / "profile" / "forward_cost.py"
    spec = importlib.util.spec_from_file_location("forward_cost_tool", tool)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(SystemExit) as e:
        mod.main(argv)
    assert e.value.code == 2 and msg in capsys.readouterr().err
