"""The layers import downwards only: kernels/ (the runtime) imports torch, triton and the
standard library, never the suite (pq2verify) or the oracle (reference); reference/ (the FP64
oracle) imports neither the suite nor the runtime, so a bug in the runtime's decoder cannot hide
in both. Read from the source (AST), every import form: `import X`, `from X import y`, relative
imports resolved against the file's package, and a constant module name handed to
importlib.import_module, __import__ or importlib.util.find_spec."""
import ast
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
IMPORT_CALLS = {"import_module", "__import__", "find_spec"}
# What the runtime may import besides itself and the standard library.
RUNTIME_THIRD_PARTY = {"torch", "triton", "numpy"}


def imports(source: str, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, the text of module `module`
    (e.g. 'kernels.gemv'; a package's __init__ is named as the package plus '.__init__')."""
    package = module.rsplit(".", 1)[0] if "." in module else ""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                base = parts[:len(parts) - (node.level - 1)] if node.level - 1 <= len(parts) else []
                head = ".".join(base + ([node.module] if node.module else []))
            else:
                head = node.module or ""
            if node.module:
                found.append((node.lineno, head))
            # `from . import x` / `from pkg import x`: x may be a module
            found += [(node.lineno, f"{head}.{a.name}" if head else a.name) for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in IMPORT_CALLS and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def _under(name: str, top: str) -> bool:
    return name == top or name.startswith(top + ".")


def violations(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for f in sorted((ROOT / folder).rglob("*.py")):
        rel = f.relative_to(ROOT)
        module = ".".join(rel.with_suffix("").parts)
        for line, name in imports(f.read_text(), module):
            if any(_under(name, top) for top in forbidden):
                out.append(f"{rel}:{line} imports {name}")
    return out


REPRO = "python -m pytest -p no:randomly -q tests/test_layering.py"


def test_the_detector_sees_every_import_form():
    src = ("import pq2verify\nfrom pq2verify.cases import SHAPES\nfrom .. import pq2verify as s\n"
           "from ..reference import pq2\nimport importlib\nm = importlib.import_module('pq2verify.registry')\n"
           "n = __import__('reference.pq2')\nfrom . import table\nimport pq2verifyx\n")
    names = [n for _, n in imports(src, "kernels.gemv")]
    assert {"pq2verify", "pq2verify.cases", "pq2verify.cases.SHAPES", "reference",
            "reference.pq2", "pq2verify.registry", "kernels.table"} <= set(names), names
    bad = [n for n in names if any(_under(n, t) for t in ("pq2verify", "reference"))]
    assert "pq2verifyx" not in bad and "kernels.table" not in bad
    # `from .. import pq2verify` in kernels/gemv.py names the top-level pq2verify package
    assert (3, "pq2verify") in [(ln, n) for ln, n in imports(src, "kernels.gemv") if n == "pq2verify"]


def test_kernels_import_neither_the_suite_nor_the_oracle():
    bad = violations("kernels", ("pq2verify", "reference"))
    assert not bad, "the runtime imports the suite or the oracle:\n  " + "\n  ".join(bad) + f"\nrepro: {REPRO}"


def test_kernels_import_only_torch_triton_and_the_standard_library():
    bad = []
    for f in sorted((ROOT / "kernels").rglob("*.py")):
        rel = f.relative_to(ROOT)
        for line, name in imports(f.read_text(), ".".join(rel.with_suffix("").parts)):
            top = name.split(".")[0]
            if top and top != "kernels" and top not in RUNTIME_THIRD_PARTY and top not in sys.stdlib_module_names:
                bad.append(f"{rel}:{line} imports {name}")
    assert not bad, "the runtime imports beyond torch, triton and the standard library:\n  " + \
        "\n  ".join(bad) + f"\nrepro: {REPRO}"


def test_reference_imports_neither_the_suite_nor_the_runtime():
    bad = violations("reference", ("pq2verify", "kernels"))
    assert not bad, "the oracle imports the suite or the runtime:\n  " + "\n  ".join(bad) + f"\nrepro: {REPRO}"


def module_aliases(source: str) -> list[int]:
    """Lines of `source` that put a module into sys.modules under another name (`sys.modules[k] =
    m`, `.update`, `.setdefault`, `.__setitem__`, through any name `sys` or `sys.modules` is bound to):
    the alias shims a move leaves behind, which let old import names live on."""
    tree = ast.parse(source)
    sys_names, mod_names = {"sys"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            sys_names |= {a.asname for a in node.names if a.name == "sys" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" and not node.level:
            mod_names |= {a.asname or a.name for a in node.names if a.name == "modules"}

    def is_modules(e) -> bool:
        return (isinstance(e, ast.Attribute) and e.attr == "modules" and isinstance(e.value, ast.Name)
                and e.value.id in sys_names) or (isinstance(e, ast.Name) and e.id in mod_names)

    lines = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        if any(isinstance(t, ast.Subscript) and is_modules(t.value) for t in targets):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("update", "setdefault", "__setitem__") and is_modules(node.func.value):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_alias_detector_sees_every_form():
    assert module_aliases("import sys\nimport kernels.format as f\nsys.modules[__name__] = f\n") == [3]
    assert module_aliases("import sys; from .report import html as _m; sys.modules[__name__] = _m\n") == [1]
    assert module_aliases("import sys as s\ns.modules.update({'a': 1})\ns.modules.setdefault('b', 2)\n") == [2, 3]
    assert module_aliases("from sys import modules as m\nm['x'] = 1\nm.__setitem__('y', 2)\n") == [2, 3]
    # reading sys.modules is no alias (pq2verify/registry.py hands itself to kernels.table)
    assert module_aliases("import sys\ntable.attach(sys.modules[__name__])\nx = sys.modules.get('a')\n") == []


def test_no_module_is_an_alias_of_another():
    """A moved module is imported from its new home by every caller; the old name is deleted, never
    kept as an alias (two names for one module let old imports and monkeypatch targets live on)."""
    bad = []
    for folder in ("pq2verify", "kernels", "reference"):
        for f in sorted((ROOT / folder).rglob("*.py")):
            bad += [f"{f.relative_to(ROOT)}:{line}" for line in module_aliases(f.read_text())]
    assert not bad, "modules that alias another through sys.modules (import the real module, delete " \
        "the alias):\n  " + "\n  ".join(bad) + f"\nrepro: {REPRO}"
