"""pq2verify.sanitize's verdicts from compute-sanitizer logs (the tool itself runs on a GPU):
errors are placed by the path markers, a library finding counts only when the library alone
shows it too, and an error no marker places (or no summary at all) fails."""
from pq2verify import sanitize as san

M = san.MARK


def log(*parts, summary):
    return "\n".join(["========= COMPUTE-SANITIZER", *parts, f"========= ERROR SUMMARY: {summary} errors"])


def section(name, errors=0, kind="Invalid __global__ write of size 4 bytes"):
    return "\n".join([f"{M} {name} begin", *[f"========= {kind}" for _ in range(errors)], f"{M} {name} end"])


def test_clean_run_passes():
    v, ok, _ = san.judge(log(section("a"), section("b"), summary=0), ["a", "b"], {})
    assert ok and v == {"a": "clean", "b": "clean"}


def test_an_error_in_our_path_fails_and_is_placed():
    v, ok, _ = san.judge(log(section("a"), section("b", 2), summary=2), ["a", "b"], {})
    assert not ok and v["b"] == "2 error(s)" and v["a"] == "clean"


def test_library_finding_needs_the_control_to_show_it():
    lib = {"cublas": "cuBLAS"}
    u = "    Uninitialized access to 0x10 on access by cudaMemcpy source"
    with_ctrl = log(section("control", 3, u), section("cublas", 5, u), summary=8)
    v, ok, _ = san.judge(with_ctrl, ["cublas"], lib)
    assert ok and v["cublas"].startswith("5 in cuBLAS")
    v, ok, _ = san.judge(log(section("control"), section("cublas", 5, u), summary=5), ["cublas"], lib)
    assert not ok and v["cublas"] == "5 error(s)"


def test_unplaced_errors_or_no_summary_fail():
    # 7 errors summed up but only 2 printed inside markers (a print limit, say)
    assert not san.judge(log(section("a", 2), summary=7), ["a"], {})[1]
    assert not san.judge("\n".join([section("a")]), ["a"], {})[1]


def test_unfinished_path_fails():
    text = log(f"{M} a begin", summary=0)
    v, ok, _ = san.judge(text, ["a"], {})
    assert not ok and v["a"] == "did not finish"


def test_an_error_is_counted_once_with_its_detail_lines_and_the_paths_output():
    # a report's first line names the error; the lines under it (location, thread, address,
    # backtrace) and the program's own output inside the markers are not more errors
    report = "\n".join([f"{M} b begin", "checking b at M=1",
                        "========= Invalid __global__ read of size 4 bytes",
                        "=========     at gemv_kernel+0x1a0 in gemv.py:88",
                        "=========     by thread (3,0,0) in block (7,0,0)",
                        "=========     Address 0x7f00 is out of bounds",
                        "=========     Saved host backtrace up to driver entry point at kernel launch time",
                        f"{M} b end"])
    v, ok, line = san.judge(log(section("a"), report, summary=1), ["a", "b"], {})
    assert not ok and v == {"a": "clean", "b": "1 error(s)"}
    assert "not attributed to a path: 0" in line


def test_an_unfinished_path_and_a_path_with_errors_both_fail_the_tool():
    # each counts on its own: one does not cancel the other
    v, ok, _ = san.judge(log(f"{M} a begin", section("b", 1), summary=1), ["a", "b"], {})
    assert not ok and v == {"a": "did not finish", "b": "1 error(s)"}


def test_racecheck_summary_counts_errors_and_leaves_warnings():
    def race(errs, warns, body):
        return "\n".join(["========= COMPUTE-SANITIZER", body,
                          f"========= RACECHECK SUMMARY: {errs + warns} hazards displayed ({errs} errors, {warns} warnings)"])
    warn = "========= Warning: Race reported between Read access at k+0x10 and Write access at k+0x20"
    err = "========= Error: Race reported between Write access at k+0x30 and Write access at k+0x40"
    body = "\n".join([f"{M} a begin", warn, f"{M} a end"])
    v, ok, _ = san.judge(race(0, 1, body), ["a"], {})
    assert ok and v == {"a": "clean"}
    body = "\n".join([f"{M} a begin", err, err, warn, f"{M} a end"])
    v, ok, line = san.judge(race(2, 1, body), ["a"], {})
    assert not ok and v == {"a": "2 error(s)"} and "error summary=2" in line
