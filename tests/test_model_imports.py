"""The model stack loads beside this repository's top-level `kernels/` package. transformers 5.25
made the hub's package of the same name a requirement and imports it when a model module loads;
from the repository root (and in the editable install) `import kernels` finds this project's
runtime instead, and every model load fails (ImportError: cannot import name 'CUDAProperties'
from 'kernels'). pyproject.toml keeps transformers below that release; this test says so by name
when an environment has moved past it, instead of failing inside a GSM8K or sm_90 tool."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_a_model_config_loads_from_the_repository_root():
    code = ("import transformers, kernels\n"
            "from transformers import LlamaConfig\n"
            "LlamaConfig()\n"
            "print(transformers.__version__, kernels.__file__)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (
        "transformers cannot load a model module beside the project's kernels/ package (does this "
        "transformers import the hub's `kernels`? pyproject.toml pins transformers<5.25 for that); "
        f"reproduce: cd {ROOT} && {sys.executable} -c 'from transformers import LlamaConfig'\n"
        + r.stderr[-1500:])
    assert str(ROOT / "kernels") in r.stdout, f"`import kernels` from the root is not the project's: {r.stdout}"
