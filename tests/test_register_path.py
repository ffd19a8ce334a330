"""A path added through the register_path fixture (a kernel, its kernels.table entry and the
suite's claims, nothing else) goes through `pq2verify check`, golden capture and verify, the
selftest and the bench's numerics gate with no other edit.

The path, "twin", is int_gemv's kernel under its own name and entry (M 1-16, both layouts),
validating against its own entry; it claims int_gemv's dots and bytes, which it has by
construction, so every check it goes through must pass and every planted fault be caught."""
import json
import types

import pytest

from kernels import config as protocol
from kernels import table, validate
from pq2verify import registry

ENTRY = table.Entry("twin", "kernels.twin", "tuned", 1, 16, counterpart="int_gemv",
                    description="int_gemv's kernel under another name (tests/test_register_path.py)")
CLAIMS = dict(tol_reason=registry._OUT, dots_equal_to="int_gemv", bit_identical_to="int_gemv")


def _twin() -> types.ModuleType:
    from kernels import int_gemv
    mod = types.ModuleType(ENTRY.module)

    def run(x, w, *, out=None, dots=None, check=True, config=None):
        if check:
            validate.kernel_args(ENTRY.module, x, w, out, dots)
        return int_gemv.run(x, w, out=out, dots=dots, check=False, config=config)

    mod.run = run
    mod.config = int_gemv.config
    mod.configs = lambda interpret: protocol.sweep("twin", lambda n, k, m: int_gemv.config(n, k, m, interpret))
    mod.fold = int_gemv.fold
    return mod


@pytest.fixture
def twin(register_path):
    return register_path(ENTRY, _twin(), **CLAIMS)


def test_the_fixture_adds_and_removes_the_path(register_path, cpu_only):
    from kernels import dispatch
    p = register_path(ENTRY, _twin(), **CLAIMS)
    assert registry.get("twin") is p and table.get("twin") is p and p.tol_reason == registry._OUT
    assert "PQ2_PATH_TWIN" in dispatch.known_vars()
    with pytest.raises(ValueError, match="path 'twin' exists already"):
        register_path(ENTRY, _twin())


def test_the_path_is_gone_after_the_test():
    assert "twin" not in registry.BY_NAME and "twin" not in table.by_name()


def test_its_entry_is_its_bad_input_contract(twin, device):
    import torch
    from pq2verify import cases, checks
    dev = "cuda" if device == "cuda" else "cpu"
    c = cases.check_cases("small", paths=["twin"], ms=[2], dtypes=["bf16"], layouts=["raw"])[0]
    inp = checks.Inputs(c, dev)
    x17 = torch.zeros(17, inp.x.shape[1], dtype=inp.x.dtype, device=dev)
    with pytest.raises(ValueError, match=r"^twin serves M in 1-16, got M=17$"):
        twin.kernel()(x17, inp.w)


def test_pq2verify_check_runs_it(twin, run_cli, tmp_path, device):
    out = tmp_path / "check.json"
    rc, stdout, err = run_cli(["--device", device, "check", "--paths", "twin", "--m", "3", "--dtype", "bf16",
                               "--layout", "raw", "--skip-selfcheck", "--json", out])
    assert rc == 0, stdout + err
    res = json.loads(out.read_text())
    rows = res["cases"]
    assert res["complete"] and rows and {r["path"] for r in rows} == {"twin"}, stdout
    assert all(r["ok"] and r["claim"] == "bytes == int_gemv" and r["claim_held"] for r in rows), stdout


def test_the_check_engine_holds_its_claims(twin, device):
    from pq2verify import cases, checks
    todo = [c for c in cases.check_cases("small", paths=["twin"], ms=[1, 3], dtypes=["bf16"]) if c.shape == "b"]
    assert todo
    for c in todo:
        r = checks.evaluate(c, device, reruns=2)
        assert r.ok, r.message()
        assert r.dots_exact and r.claim_held


def test_golden_capture_and_verify(twin, device, tmp_path):
    from kernels import backend
    from pq2verify import cases, golden
    todo = cases.golden_cases(backend.golden_key(), paths=["twin"])[:2]
    assert todo
    golden.capture(tmp_path / "g", todo, device, log=lambda *a: None)
    g = golden.load(tmp_path / "g")
    outs = golden.verify(g, device, paths=["twin"], ids=[c.id for c in todo])
    assert outs and all(o.ok for o in outs), [o.message() for o in outs if not o.ok]


def test_selftest_catches_faults_planted_in_it(twin, device):
    from pq2verify import selftest
    verdicts = selftest.run(paths=["twin"], faults=["last_row", "neighbour_scale"], device=device)
    assert [v.status for v in verdicts] == ["caught"] * 2, [v.cell() for v in verdicts]


def test_the_bench_gate_passes_it(twin, device):
    from pq2verify import bench, checks
    from pq2verify.bench import Config, Shape
    case = bench.bench_case("twin", Shape("b", 64, 384), 2, Config())
    g = bench.gate(case, checks.Inputs(case, device), device, reruns=1, record_output=False)
    assert g.ok and g.status == "PASS", g.reason
