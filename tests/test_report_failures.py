"""What a failing check looks like in check's reports: every engine check, failed by a planted
fault, renders (message, Markdown, HTML) without numpy reprs; the per-path table names the
check that failed and highlights its figure; the repro command stands in its own cell; a live
failing run writes the error map beside its report and shows it."""
import json
import re

import pytest
import torch

from pq2verify import cases, check_cli, checks, cli, registry

INT = checks.cases("small", paths=["int_gemv"], ms=[3], dtypes=["bf16"], layouts=["prepared"])[0]
GEMV = checks.cases("small", paths=["gemv"], ms=[1], dtypes=["bf16"], layouts=["prepared"])[0]


def _fault(case, what):
    real = registry.get(case.path).kernel()

    def run(x, w, *, out=None, dots=None):
        if what == "batch":                       # row i reads its last group from row i+1
            x2 = x.clone()
            x2[:, -128:] = x.roll(-1, 0)[:, -128:]
            return real(x2, w, out=out, dots=dots)
        if what == "nan":
            return real(torch.nan_to_num(x), w, out=out, dots=dots)
        y = real(x, w, out=out, dots=dots)
        if what == "scale":
            y.mul_(1.05)
        elif what == "unwritten":
            y[0] = float("nan")
        elif what == "dots" and dots is not None:
            dots[0, 0, 0] += 1
        elif what == "noise":
            y.add_(torch.randn(y.shape, device=y.device).to(y.dtype) * 1e-2)
        elif what == "guard":
            torch.as_strided(y, (1,), (1,), y.storage_offset() + y.numel()).fill_(0.0)
        return y
    return run


# (case, fault, checks run, the engine checks it must fail)
FAULTS = [
    (INT, "scale", ("rms",), {"rms quantized", "rms dense", "per-element"}),
    (INT, "unwritten", ("rms",), {"written"}),
    (GEMV, "dots", ("exact",), {"dots", "exactness claim"}),
    (INT, "noise", ("determinism",), {"determinism"}),
    (INT, "batch", ("batch",), {"batch invariance"}),
    (INT, "nan", ("nan",), {"nan propagation"}),
    (INT, "guard", ("rms",), {"guard band"}),
    (INT, "scale", ("fold",), {"declared fold"}),
]


@pytest.fixture(scope="module")
def failed(device):
    out = []
    for case, what, run, want in FAULTS:
        if "fold" in run and device == "cuda":
            continue      # the declared-fold check runs on the CPU only (checks.evaluate)
        r = checks.evaluate(case, device, checks=run, reruns=2, kernel=_fault(case, what))
        assert want <= set(r.failed), (what, r.failed, r.message())
        out.append(r)
    return out


NUMPY_REPR = re.compile(r"\bnp\.|array\(|float64\(|int64\(")


def test_no_numpy_repr_in_any_failure_text(failed):
    rows = [r.to_json() for r in failed]
    texts = {"message " + ", ".join(r.failed): r.message() for r in failed}
    texts["markdown"] = check_cli.markdown(rows, [{"backend": "test"}])
    texts["html"] = check_cli.html(rows, [{"backend": "test"}])
    texts["json"] = json.dumps(rows, default=str)
    bad = {k: NUMPY_REPR.findall(v) for k, v in texts.items() if NUMPY_REPR.search(v)}
    assert not bad, bad


def test_the_per_path_table_names_the_failed_check_and_highlights_it(failed, device):
    rows = [r.to_json() for r in failed]
    t = check_cli.path_table(rows)
    by = {cells[0].text: cells for cells, _ in t.rows}
    col = {c: i for i, c in enumerate(t.columns)}
    ig = by["int_gemv"]
    named = set(ig[col["failed checks"]].text.split(", "))
    planted = {"rms dense", "per-element", "written", "determinism", "batch invariance", "nan propagation",
               "guard band"} | ({"declared fold"} if device == "cpu" else set())   # as the fixture ran them
    assert planted <= named, named
    for column in ("pass", "max elem/bound", "deterministic", "written", "guards intact", "batch invariant",
                   "NaN exact", "failed checks"):
        assert ig[col[column]].bad, f"{column} is not highlighted"
    g = by["gemv"]
    assert g[col["dots exact"]].bad and g[col["claim held"]].bad and not g[col["max elem/bound"]].bad
    md = "\n".join(t.markdown())
    assert "| **0** |" in md and "**dots, exactness claim**" in md
    assert '<td class="bad">dots, exactness claim</td>' in t.html()


def test_the_repro_command_is_its_own_cell(failed):
    rows = [r.to_json() for r in failed]
    t = check_cli.case_table(rows)
    i = t.columns.index("reproduce")
    assert {cells[i].text for cells, _ in t.rows} == {r.case.repro() for r in failed}
    assert all(cells[i].code for cells, _ in t.rows)
    md = check_cli.markdown(rows, [{"backend": "test"}])
    for r in failed:      # alone on its line, ready to paste
        assert f"\n  {r.case.repro()}\n" in md and f"| `{r.case.repro()}` |" in md
    assert f'<td class="repro"><code>{r.case.repro()}</code></td>' in check_cli.html(rows, [{"backend": "test"}])


def test_a_failing_run_writes_its_error_map_beside_the_report(device, tmp_path, monkeypatch, capsys):
    import importlib
    mod = importlib.import_module(registry.get(INT.path).module)
    real = mod.run

    def run(x, w, *, out=None, dots=None, check=True):
        y = real(x, w, out=out, dots=dots, check=check)
        y[:, 64:128] *= 1.0625                 # one block of columns wrong
        return y
    monkeypatch.setattr(mod, "run", run)
    md, page = tmp_path / "r.md", tmp_path / "r.html"
    rc = cli.main(["--device", device, "check", "--case", INT.id, "--reruns", "1", "--skip-selfcheck",
                   "--markdown", str(md), "--html", str(page)])
    assert rc == 1, capsys.readouterr()
    pngs = sorted(p.name for p in tmp_path.glob("r.*.png"))
    assert len(pngs) == 1 and pngs[0].startswith("r.int_gemv"), pngs
    assert f"![error map of {INT.id}]({pngs[0]})" in md.read_text()
    assert '<img alt="error map of ' in page.read_text() and "## Failures" in md.read_text()


def test_the_json_holds_the_per_path_table(device, tmp_path):
    j = tmp_path / "r.json"
    assert cli.main(["--device", device, "check", "--case", INT.id, "--reruns", "1", "--skip-selfcheck",
                     "--json", str(j)]) == 0
    d = json.loads(j.read_text())
    t = d["per_path"]
    assert t["columns"][0] == "path" and [r["cells"][0] for r in t["rows"]] == ["int_gemv"]
    assert t == check_cli.path_table(d["cases"]).json() and t["rows"][0]["bad"] == []
