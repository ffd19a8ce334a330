"""pq2verify selftest: every planted fault is caught on two paths (one integer, one floating),
the faults really change what they claim to, a fault that no check catches makes the selftest
fail with a reproduction command, and bad options are usage errors."""
import functools
import json
from dataclasses import replace

import pytest
import torch

from pq2verify import checks, cli, graphs, registry, selftest

pytestmark = pytest.mark.selftest

# one integer and one floating path, the cheapest on the interpreter (the lead runs all on the GPU)
QUICK = ("int_gemv", "small_gemm")


@pytest.mark.parametrize("name", QUICK)
def test_every_applicable_fault_is_caught(name, device):
    # this path's verdicts only (selftest.run tries each path on its own): the two paths run on
    # two xdist workers at once, and nothing is computed twice
    vs = {v.fault: v for v in selftest.run([name], device=device)}
    assert set(vs) == set(selftest.BY_NAME)
    bad = [f"{v.fault}: {v.cell()} ({v.repro})" for v in vs.values() if not v.ok]
    assert not bad, "\n".join(bad)
    for v in vs.values():
        assert (v.status == "n/a") == bool(selftest.BY_NAME[v.fault].not_applicable(registry.get(name), device))
        assert v.status == "n/a" or v.caught_by
    if device != "cuda":   # never counted as caught where it cannot run
        assert vs["host_value"].status == "n/a" and vs["host_value"].reason == "n/a on cpu: needs CUDA graphs"
        assert not vs["host_value"].caught_by
    if registry.get(name).weight == "dense":
        assert vs["neighbour_scale"].status == "n/a"
    # the classes each fault is aimed at are among the checks that caught it
    assert "written" in vs["last_row"].caught_by and "guard band" in vs["past_the_end"].caught_by
    assert "nan propagation" in vs["nan_finite"].caught_by
    assert "determinism" in vs["fold_order"].caught_by


def test_faults_change_what_they_claim(device):
    """Plain faults change a plain call's bits; the others only in their setting: a stale tile
    on the next call with other inputs, NaN-to-0 only with a NaN, a store past the end only into
    a guarded buffer, a baked host value not at all in eager."""
    p = registry.get("int_gemv")
    ctx = selftest.Context(p, device, "no golden in this test")
    for f in selftest.FAULTS:
        if f.plain:
            assert selftest._inert(ctx, f) == "", f.name
    (x, w), (x2, _) = ctx.graph_inputs(1), ctx.graph_inputs(2)
    real = graphs.kernel_fn(p)

    b = selftest.Broken(p, selftest.BY_NAME["stale_tile"])
    assert graphs.same_bits(b(x, w), real(x, w)) and b.fired == 0
    assert not graphs.same_bits(b(x2, w), real(x2, w)) and b.fired == 1

    b = selftest.Broken(p, selftest.BY_NAME["nan_finite"])
    assert graphs.same_bits(b(x, w), real(x, w)) and b.fired == 0
    xn = x.clone()
    xn[0, 5] = float("nan")
    assert torch.isnan(real(xn, w)[0]).all() and not torch.isnan(b(xn, w)).any() and b.fired == 1

    b = selftest.Broken(p, selftest.BY_NAME["past_the_end"])
    b(x, w)                                    # an exactly sized output: nothing written past it
    assert b.fired == 0
    damage = []
    checks.call(p, ctx.inp, kernel=b, guards=damage)
    assert b.fired == 1 and damage and "after" in damage[0]

    if device != "cuda":
        b = selftest.Broken(p, selftest.BY_NAME["host_value"])
        assert graphs.same_bits(b(x, w), real(x, w))


def test_a_missing_check_leaves_its_fault_undetected(device, monkeypatch, capsys):
    """The suite without its NaN check: the NaN fault is never even injected (no check feeds a
    NaN), so the selftest reports it UNDETECTED with the command that reproduces it, exits 1."""
    monkeypatch.setattr(checks, "evaluate", functools.partial(
        checks.evaluate, checks=("rms", "exact", "determinism", "batch")))
    assert cli.main(["--device", device, "selftest", "--paths", "int_gemv", "--faults", "nan_finite"]) == 1
    out = capsys.readouterr().out
    assert "UNDETECTED: never injected" in out
    assert f"reproduce: pq2verify --device {device} selftest --paths int_gemv --faults nan_finite" in out


def test_a_new_registry_path_is_covered_with_no_edit(device, monkeypatch):
    new = replace(registry.get("int_gemv"), name="int_gemv_again")
    monkeypatch.setattr(registry, "PATHS", registry.PATHS + (new,))
    monkeypatch.setattr(registry, "BY_NAME", {**registry.BY_NAME, new.name: new})
    vs = selftest.run(faults=["ulp"], device=device, paths=None)
    assert [v.path for v in vs] == [p.name for p in registry.PATHS]
    v = vs[-1]
    assert v.path == "int_gemv_again" and v.status == "caught" and "per-element" in v.caught_by


@pytest.mark.parametrize("argv, why", [
    (["--paths", "bogus"], "--paths: unknown 'bogus'"),
    (["--faults", "ulp,bogus"], "--faults: unknown 'bogus'"),
    (["--paths", ","], "--paths: selects nothing"),
    (["--faults", " "], "--faults: selects nothing"),
    (["--json", "/nonexistent-dir/x.json"], "--json /nonexistent-dir/x.json"),
    (["--markdown", "/nonexistent-dir/x.md"], "--markdown /nonexistent-dir/x.md"),
])
def test_bad_options_are_usage_errors(argv, why, capsys, device):
    assert cli.main(["--device", device, "selftest", *argv]) == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err


def test_json_and_markdown(tmp_path, capsys, device):
    j, m = tmp_path / "s.json", tmp_path / "s.md"
    assert cli.main(["--device", device, "selftest", "--paths", "small_gemm", "--faults", "last_col,neighbour_scale",
                     "--json", str(j), "--markdown", str(m)]) == 0
    d = json.loads(j.read_text())
    assert d["summary"] == {"ok": True, "caught": 1, "UNDETECTED": 0, "n/a": 1, "error": 0}
    assert [v["fault"] for v in d["verdicts"]] == ["last_col", "neighbour_scale"]
    assert "| last_col | written" in m.read_text()
    assert "last_col" in capsys.readouterr().out


def test_a_check_failing_on_the_unbroken_path_credits_no_fault(device, monkeypatch):
    """If the real path already fails a check (here: one output 1 ulp off in every call), that
    check cannot be said to catch a fault: the verdict is an error, and the selftest fails."""
    import kernels.int_gemv as mod
    p = registry.get("int_gemv")
    monkeypatch.setattr(mod, "run", selftest.Broken(p, selftest.BY_NAME["ulp"], run=mod.run))
    [v] = selftest.run(["int_gemv"], ["last_col"], device=device)
    assert v.status == "error" and "the unbroken path already fails per-element" in v.reason, v.reason
    assert not selftest.summary([v])["ok"]
