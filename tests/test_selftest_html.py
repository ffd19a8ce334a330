"""selftest's HTML page says what its markdown says: a fault not caught makes the page FAIL,
its row is marked and its reproduce line is shown; a known hole is listed, not hidden; a run in
which every fault was caught is a PASS. Verdicts are built by hand, so the right page is known
without running a kernel; the CLI's --html writes the same page as selftest.html."""
import re

from pq2verify import cli, selftest
from pq2verify.selftest import Verdict

HERE = "tests/test_selftest_html.py"


def _v(fault, path, status, **kw):
    return Verdict(fault=fault, path=path, status=status, **kw)


def _rows(page: str) -> list[tuple[str, str]]:
    """(class, first cell) of every body row of the page's first table."""
    body = page.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return re.findall(r'<tr class="([^"]*)"><td>([^<]*)</td>', body)


def test_an_undetected_fault_fails_the_page_and_marks_its_row():
    vs = [_v("ulp", "gemv", "caught", caught_by=["bits"]),
          _v("last_row", "gemv", "UNDETECTED", repro="./pq2 selftest --paths gemv --faults last_row"),
          _v("ulp", "mmq", "caught", caught_by=["bits"]),
          _v("last_row", "mmq", "caught", caught_by=["written"])]
    page = selftest.html(vs)
    where = f"\n  reproduce: .venv/bin/python -m pytest -q '{HERE}::test_an_undetected_fault_fails_the_page_and_marks_its_row'"
    assert 'class="verdict-fail">FAIL: 3 caught, 1 undetected' in page, page[:600] + where
    assert 'class="verdict-pass"' not in page, where
    assert _rows(page) == [("", "ulp"), ("fail", "last_row")], f"{_rows(page)}" + where
    assert "./pq2 selftest --paths gemv --faults last_row" in page, where


def test_a_known_hole_is_listed_and_a_clean_run_passes():
    vs = [_v("ulp", "gemv", "caught", caught_by=["bits"]),
          _v("host_value", "gemv", "known hole", reason="no graph check on this backend", repro="R1"),
          _v("past_the_end", "gemv", "n/a", reason="not on this device")]
    page = selftest.html(vs)
    where = f"\n  reproduce: .venv/bin/python -m pytest -q '{HERE}::test_a_known_hole_is_listed_and_a_clean_run_passes'"
    assert 'class="verdict-pass">PASS: 1 caught, 0 undetected, 1 known holes' in page, page[:600] + where
    assert "Known holes" in page and "no graph check on this backend" in page and "R1" in page, where
    assert all(cls == "" for cls, _ in _rows(page)), f"{_rows(page)}" + where


def test_a_flagged_control_and_an_error_fail_the_page():
    for status in ("FALSE ALARM", "error"):
        page = selftest.html([_v("ulp", "gemv", "caught", caught_by=["bits"]),
                              _v("element_inside", "gemv", status, reason="flagged")])
        assert 'class="verdict-fail"' in page and ("fail", "element_inside") in _rows(page), (
            f"{status}: {_rows(page)}\n  reproduce: .venv/bin/python -m pytest -q '{HERE}'")


def test_nothing_applicable_is_not_a_pass():
    page = selftest.html([_v("past_the_end", "gemv", "n/a", reason="not on this device")])
    assert 'class="verdict-fail"' in page and "no selected fault was applicable" in page


def test_the_cli_takes_html_as_an_output(tmp_path):
    """--html is an output of the contract (outputs.check refuses it on an input or beside
    another output before any work)."""
    args = cli.build_parser().parse_args(["selftest", "--html", str(tmp_path / "s.html")])
    assert ("--html", str(tmp_path / "s.html")) in cli.output_paths(args)
