"""docs/ADDING_A_PATH.md, followed literally: its kernel file, table entry and claims, added
as `kernels.rowdot` through the register_path fixture (the supported way for a test to add a
path), go through the suite's checks with no other edit."""
import importlib.util
import re
from pathlib import Path

import pytest
import torch

from kernels import table
from kernels import dispatch, emulation
from pq2verify import cases, checks, golden, registry, selftest

DOC = Path(__file__).parents[1] / "docs" / "ADDING_A_PATH.md"


def _blocks():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    kernel = next(b for b in blocks if b.lstrip().startswith('"""# kernels/rowdot.py'))
    entry = next(b for b in blocks if b.startswith("# table entry and claims"))
    return kernel, entry


@pytest.fixture
def rowdot(tmp_path, register_path):
    kernel, entry = _blocks()
    f = tmp_path / "rowdot.py"
    f.write_text(kernel)
    spec = importlib.util.spec_from_file_location("kernels.rowdot", f)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ns = {"Entry": table.Entry, "_OUT": registry._OUT}
    exec(entry, ns)
    assert ns["ENTRY"].module == "kernels.rowdot", ns["ENTRY"]
    return register_path(ns["ENTRY"], mod, **ns["CLAIMS"])


def test_the_example_passes_the_check_engine(rowdot, device):
    todo = [c for c in cases.check_cases("small", paths=["rowdot"], ms=[1, 3]) if c.shape == "b"]
    assert len(todo) == 8
    for c in todo:
        r = checks.evaluate(c, device, reruns=2)
        assert r.ok, r.message()
        assert r.dots_exact and r.claim_held and r.guards_intact and r.nan_exact


def test_the_emulation_reads_its_fold(rowdot, device):
    if device == "cuda":
        pytest.skip("the interpreter's bits: the GPU's fold may contract into an FMA")
    c = cases.check_cases("small", paths=["rowdot"], ms=[3], dtypes=["bf16"], layouts=["raw"])[0]
    inp = checks.Inputs(c, device)
    want = rowdot.kernel()(inp.x.contiguous(), inp.w)
    got = emulation.emulate("rowdot", inp.x.contiguous(), inp.w, interpret=True)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_dispatch_switch_and_trace_reach_it(rowdot, device, monkeypatch):
    monkeypatch.setenv("PQ2_PATH_ROWDOT", "on")
    c = cases.check_cases("small", paths=["rowdot"], ms=[2], dtypes=["bf16"], layouts=["prepared"])[0]
    inp = checks.Inputs(c, device)
    with dispatch.trace() as t:
        dispatch.pq2_matmul(inp.x, inp.w)
    assert dict(t) == {"rowdot": 1}


def test_golden_capture_and_verify(rowdot, device, tmp_path):
    from kernels import backend
    todo = cases.golden_cases(backend.golden_key(), paths=["rowdot"])[:2]
    golden.capture(tmp_path / "g", todo, device, log=lambda *a: None)
    g = golden.load(tmp_path / "g")
    outs = golden.verify(g, device, paths=["rowdot"], ids=[c.id for c in todo])
    assert outs and all(o.ok for o in outs), [o.message() for o in outs if not o.ok]


def test_selftest_covers_it(rowdot, device):
    verdicts = selftest.run(paths=["rowdot"], faults=["last_row", "neighbour_scale", "past_the_end"],
                            device=device)
    assert [v.status for v in verdicts] == ["caught"] * 3, [v.cell() for v in verdicts]
