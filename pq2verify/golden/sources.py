"""The kernel sources a path's capture records by hash (its module, kernels/common.py,
kernels/prepare.py and the kernel modules it imports), so a changed source is reported."""

import ast
from pathlib import Path

from .. import provenance, registry
from .store import sha256_bytes, sha256_file


# --- kernel sources ------------------------------------------------------------------------
def _module_file(modname: str) -> Path:
    return provenance.ROOT / (modname.replace(".", "/") + ".py")


def _kernel_imports(f: Path) -> set[str]:
    """kernels/<name>.py files a module imports directly (from .x / kernels.x / from . import x)."""
    out = set()
    pkg = f.parent.name
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 and pkg == "kernels":
                names = [node.module] if node.module else [a.name for a in node.names]
            elif node.level == 0 and node.module and node.module.startswith("kernels."):
                names = [node.module.split(".", 1)[1]]
            elif node.level == 0 and node.module == "kernels":
                names = [a.name for a in node.names]
            else:
                continue
            out |= {n for n in names if (provenance.ROOT / "kernels" / f"{n}.py").exists()}
    return out


def source_files(path: registry.Path) -> list[str]:
    """The path's module file, kernels/common.py, kernels/prepare.py, and the kernel modules it
    imports directly (relative to the repository root)."""
    f = _module_file(path.module)
    files = {f.relative_to(provenance.ROOT).as_posix(), "kernels/common.py", "kernels/prepare.py"}
    if f.exists():
        files |= {f"kernels/{n}.py" for n in _kernel_imports(f)}
    return sorted(files)


def source_hashes(path: registry.Path) -> dict:
    files = {rel: (sha256_file(provenance.ROOT / rel) if (provenance.ROOT / rel).exists() else None)
             for rel in source_files(path)}
    combined = sha256_bytes("".join(f"{k}:{v}\n" for k, v in sorted(files.items())).encode())
    return {"sha256": combined, "files": files}
