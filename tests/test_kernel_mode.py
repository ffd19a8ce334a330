"""The process's kernel mode is decided once (kernels.backend.select) and nothing flips it:
Triton makes a kernel interpreted or compiled when its module is imported, so a flip leaves the
modules imported meanwhile broken for every test after (conftest checks each test for this)."""
import subprocess
import sys

from kernels import backend
from pq2verify import provenance

FLIP = """
import os
from kernels import backend
backend.select("cpu")
import kernels.common
assert backend.mixed_kernels() == [], backend.mixed_kernels()
state = backend.mode_state()
os.environ.pop("TRITON_INTERPRET")        # what the GSM8K CPU set-up used to do
kernels.common.INTERPRET = False
import kernels.single                     # imported while flipped: compiled, INTERPRET bound False
assert backend.mode_state() != state
backend.restore_mode(state)
assert backend.mode_state() == state
print("\\n".join(backend.mixed_kernels()))
"""


def test_a_kernel_module_imported_in_the_other_mode_is_named():
    r = subprocess.run([sys.executable, "-c", FLIP], capture_output=True, text=True, cwd=provenance.ROOT)
    assert r.returncode == 0, r.stderr
    found = r.stdout.splitlines()
    assert "kernels.single._single_kernel is a JITFunction" in found
    assert "kernels.prepare.INTERPRET = False (kernels.common says True)" in found


GLUON = """
from kernels import backend
backend.select("cpu")
import kernels.common, kernels.mmq_wgmma
assert kernels.mmq_wgmma._wgmma_kernel.is_gluon() and kernels.common.INTERPRET
print(backend.mixed_kernels())
"""


def test_gluon_functions_are_not_named_as_the_other_mode():
    """A gluon.jit function is never interpreted: under the interpreter it is still a (Gluon)
    JITFunction, and that is not a kernel imported in the wrong mode."""
    r = subprocess.run([sys.executable, "-c", GLUON], capture_output=True, text=True, cwd=provenance.ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def test_the_cpu_backend_is_switched_for_a_block_only():
    assert backend.cpu_backend() == "interpreter"
    try:
        with backend.using_cpu_backend("emulate"):
            assert backend.cpu_backend() == "emulate"
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert backend.cpu_backend() == "interpreter"
