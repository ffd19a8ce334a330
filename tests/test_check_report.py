"""What people read from check: the HTML page (worst cases first), shards that add up to the
whole selection, and the listing options of the top-level command."""
import json

import pytest

from pq2verify import cases, check_cli, cli


def _row(case, ok, ratio, failures=()):
    c = cases.Case.parse(case)
    return {"case": case, "repro": c.repro(), "ok": ok, "failures": list(failures), "path": c.path,
            "shape": c.shape, "n": c.n, "k": c.k, "m": c.m, "dtype": c.dtype, "layout": c.layout, "kind": c.kind,
            "strided": c.strided, "rel_rms_quantized": None, "tol_quantized": None, "rel_rms_dense": ratio * 4e-3,
            "tol_dense": 4e-3, "dots_exact": None, "claim": "", "claim_held": None, "deterministic": True,
            "written": True, "elem_ratio": ratio, "max_ulp": 1, "guards_intact": True, "batch_invariant": None,
            "nan_exact": True}


def _complete(rows, shard=None, total=None) -> dict:
    """A `check --json` of a run that completed, its self-checks passed."""
    return {"format": check_cli.FORMAT, "provenance": {"backend": "test"}, "complete": True,
            "selection": {"total": total or len(rows), "shard": shard, "cases": len(rows), "reruns": 1,
                          "backend": "test", "fingerprint": check_cli.fingerprint([cases.Case.parse(r["case"])
                                                                                   for r in rows], "test")},
            "selfcheck": {"status": "passed", "checks": [{"check": "x", "ok": True, "detail": ""}]}, "cases": rows}


def test_html_report_puts_failures_first(tmp_path):
    ids = [c.id for c in cases.check_cases("small", paths=["native"], ms=[1, 2, 3])]
    rows = [_row(ids[0], True, 0.9), _row(ids[1], False, 3.0, ["relative RMS too large"]), _row(ids[2], True, 0.2)]
    src = tmp_path / "r.json"
    src.write_text(json.dumps(_complete(rows)))
    out = tmp_path / "r.html"
    assert cli.main(["check", "--render", str(src), "--html", str(out)]) == 1
    page = out.read_text()
    assert page.startswith("<!doctype html>") and "2 of 3 cases passed" in page
    assert "Not a complete result" not in page          # a whole run: the one failure is the verdict
    order = [page.index(i) for i in (ids[1], ids[0], ids[2])]
    assert order == sorted(order), "the failing case, then the closest to its bound"
    assert "relative RMS too large" in page and f"./pq2 check --case {ids[1]}" in page


@pytest.mark.parametrize("n", (1, 2, 3, 7))
def test_shards_partition_the_selection(n):
    todo = cases.check_cases("small")
    parts = [check_cli.shard(todo, (i, n)) for i in range(1, n + 1)]
    ids = [c.id for p in parts for c in p]
    assert sorted(ids) == sorted(c.id for c in todo) and len(ids) == len(set(ids))
    assert all(parts), "every shard gets work"


@pytest.mark.parametrize("spec", ("0/2", "3/2", "1/0", "a/b", "2", "-1/2"))
def test_bad_shard_is_a_usage_error(spec, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["check", "--shard", spec])
    assert e.value.code == 2 and "--shard" in capsys.readouterr().err


def test_list_paths_and_cases(capsys, device):
    from kernels import backend
    assert cli.main(["--list-paths"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("native", "int_gemv", "small_gemm"))
    assert cli.main(["--device", device, "--list-cases", "golden"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed == [c.id for c in cases.golden_cases(backend.golden_key())]
    assert cli.main(["--list-cases", "nonsense"]) == 2
    assert "unknown profile" in capsys.readouterr().err


def test_golden_verify_html(tmp_path, device):
    from kernels import backend
    from pq2verify import golden
    case = golden.cases(backend.golden_key(), ["single"])[0]
    out = tmp_path / "g.html"
    rc = cli.main(["--device", device, "golden", "verify", "--paths", "single", "--case", case.id, "--html", str(out)])
    page = out.read_text()
    assert rc == 0 and page.startswith("<!doctype html>") and case.id in page and "1 of 1 golden cases" in page
