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
