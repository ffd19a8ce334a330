"""A test the GPU suite runs must put what it hands a kernel on the suite's device: a CPU tensor
reaches a compiled kernel as "Pointer argument cannot be accessed from Triton (cpu tensor?)"
(tests/test_graphs.py's cache test turned the GPU suite red that way). Read from the test
sources: a test that is not marked gpu and calls a kernel wrapper directly takes the `device`
fixture, or lives in a module whose DEV/DEVICE follows backend.device()."""
import ast
import re
from pathlib import Path

HERE = Path(__file__).parent
# direct kernel calls: a kernels module's run/launch/quantize_q8, a registry path's kernel(),
# graphs.kernel_fn, the check engine told "cpu" (pq2_matmul is exempt: CPU tensors go to the
# emulation on a GPU machine)
CALL = re.compile(r"\b(?:gemv|single|small_mma|int_gemv|mmq|mmq_planes|mmq_wgmma|native|small_gemm|prepare"
                  r"|_mod\(p\)|mod)\.(?:run|launch|quantize_q8)\(|\.kernel\(\)\(|kernel_fn\("
                  r"|\bchecks\.evaluate\([^)]*[\"']cpu[\"']")


def _helpers(tree, src) -> set[str]:
    """Module-level functions (not tests, not fixtures) that call a kernel, directly or through
    another such helper: a test calling one calls a kernel (judging tests once slipped by so)."""
    funcs = {n.name: ast.get_source_segment(src, n) for n in tree.body
             if isinstance(n, ast.FunctionDef) and not n.name.startswith("test_")
             and not any("fixture" in ast.get_source_segment(src, d) for d in n.decorator_list)}
    found = {n for n, body in funcs.items() if CALL.search(body)}
    while True:
        more = {n for n, body in funcs.items() if n not in found
                and any(re.search(rf"\b{re.escape(h)}\(", body) for h in found)}
        if not more:
            return found
        found |= more


def offenders(path: Path) -> list[str]:
    src = path.read_text()
    tree = ast.parse(src)
    if re.search(r"^pytestmark\s*=.*mark\.gpu", src, re.M) or path.resolve() == Path(__file__).resolve():
        return []
    # a module whose inputs follow DEV/DEVICE = ... backend.device() (parametrized arguments too)
    module_dev = re.search(r"^(?:DEV|DEVICE)\s*=.*backend\.(?:device|select)\(", src, re.M)
    helpers = _helpers(tree, src)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        marks = " ".join(ast.get_source_segment(src, d) for d in node.decorator_list)
        # tests, and the fixtures that build their results (a fixture's kernel call once slipped by)
        if not (node.name.startswith("test_") or "fixture" in marks):
            continue
        body = ast.get_source_segment(src, node)
        # a test's helpers are followed; a fixture's are not (a fixture that builds a kernel
        # wrapper for later calls, e.g. register_path's twin, calls no kernel itself)
        calls = CALL.search(body) or (node.name.startswith("test_")
                                      and any(re.search(rf"\b{re.escape(h)}\(", body) for h in helpers))
        if "mark.gpu" in marks or not calls:
            continue
        if {"device", "cpu_only"} & {a.arg for a in node.args.args} or module_dev:
            continue
        out.append(f"{path.name}:{node.lineno} {node.name}")
    return out


def test_kernel_calls_follow_the_suite_device():
    bad = [o for f in sorted(HERE.glob("test_*.py")) for o in offenders(f)]
    assert not bad, ("tests that call a kernel without the device fixture (their tensors stay on the CPU "
                     f"under --device cuda): {bad}; reproduce: .venv/bin/python -m pytest -q {__file__}")


def test_the_scan_follows_module_helpers(tmp_path):
    """A test whose kernel call sits in a helper of its module (two levels down) is seen; one
    taking cpu_only, or calling a helper that runs no kernel, is not."""
    f = tmp_path / "test_planted_helper.py"
    f.write_text("def _inner(c):\n    return checks.evaluate(c, 'cpu')\n\n\n"
                 "def _outer(c):\n    return _inner(c)\n\n\n"
                 "def _plain(c):\n    return c\n\n\n"
                 "def test_a():\n    _outer(1)\n\n\n"
                 "def test_b(cpu_only):\n    _outer(1)\n\n\n"
                 "def test_c():\n    _plain(1)\n\n\n"
                 "def test_d():\n    y = registry.get('gemv').kernel()(x, w)\n")
    assert offenders(f) == ["test_planted_helper.py:13 test_a", "test_planted_helper.py:25 test_d"]


def test_the_scan_sees_a_cpu_only_kernel_call(tmp_path):
    f = tmp_path / "test_planted.py"
    f.write_text("def test_x():\n    from kernels import gemv\n    gemv.run(x, w)\n\n\n"
                 "def test_y(device):\n    from kernels import gemv\n    gemv.run(x, w)\n")
    assert offenders(f) == ["test_planted.py:1 test_x"]
