"""Edges of the golden store's keys and of the files a command writes, that fault injection found
unpinned: the CPU part of the ISA key read from /proc/cpuinfo (vendor and kernel-picking flags of
the first processor, x86 and ARM), the thread count and the oneDNN/MKL variables it carries, the
reason a cublas capture records; the kernel sources a path depends on (each import form followed,
a name without a kernels/<name>.py file and imports outside the kernels package not, a path whose
module has no file), which decide 'source changed, output identical'; the output contract (an
output reached through a symlink, an output folder on or inside an input, a sibling with a common
prefix, a failed rename, a FIFO written in place, the once-per-failure warning of a rewritten
JSON); and provenance (an empty PQ2VERIFY_COMMIT, +dirty from tracked files only, a tree without
git, NVML's readings and units, the backend warning kept out of the items and printed once per
report). A wrong ISA key means a looser comparison (within the bound instead of bit for bit); a
wrong source list means a changed kernel goes unreported. Expected values are written out here by
hand from planted inputs (a planted cpuinfo, a planted kernels/ tree, a planted git repository, a
fake pynvml); the functions under test never supply them. Nothing here needs a GPU or runs a
kernel."""
import builtins
import errno
import hashlib
import io
import os
import shutil
import stat
import subprocess
import sys
import threading
import types

import pytest
import torch

from pq2verify import cli, outputs, provenance, registry
from pq2verify.golden import isakey, sources, verifying

F = "tests/test_golden_keys_outputs_edges.py"


def repro(test: str) -> str:
    return f"reproduce: .venv/bin/python -m pytest -q -p no:randomly '{F}::{test}'"


# --- the ISA key: /proc/cpuinfo -------------------------------------------------------------
# two processors of an x86 host as Linux prints them (tabs before the colon); the second one's
# flags differ so that reading past the first processor shows
X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model name\t: AMD EPYC 9654 96-Core Processor
flags\t\t: fpu sse sse2 avx2 avx fma f16c avx512f avx512bw sha_ni avx512_bf16
bugs\t\t: sysret_ss_attrs

processor\t: 1
vendor_id\t: GenuineIntel
flags\t\t: fpu sse
"""
# an arm64 host: the kernel prints Features before CPU implementer (arch/arm64/kernel/cpuinfo.c)
ARM = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes sve sve2 bf16 atomics
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd4f
CPU revision\t: 0

processor\t: 1
BogoMIPS\t: 2000.00
Features\t: fp
CPU implementer\t: 0x48
"""


def _cpuinfo(monkeypatch, text):
    """isakey reads this text as /proc/cpuinfo (its module-level open is replaced)."""
    def fake(path, *a, **kw):
        return io.StringIO(text) if path == "/proc/cpuinfo" else builtins.open(path, *a, **kw)
    monkeypatch.setattr(isakey, "open", fake, raising=False)


def test_x86_cpuinfo_gives_the_first_processors_vendor_and_kernel_flags(monkeypatch):
    _cpuinfo(monkeypatch, X86)
    got = isakey._cpu()
    # vendor from vendor_id (not from "processor: 0", the first line); flags in the key's own
    # order (avx avx2 fma f16c avx512f avx512bw ... avx512_bf16), sse/sha_ni not kernel-picking
    want = ("AuthenticAMD", "avx avx2 fma f16c avx512f avx512bw avx512_bf16")
    assert got == want, repro("test_x86_cpuinfo_gives_the_first_processors_vendor_and_kernel_flags") + f"\n{got}"


def test_arm_cpuinfo_features_give_the_kernel_flags(monkeypatch):
    _cpuinfo(monkeypatch, ARM)
    flags = isakey._cpu()[1]
    assert flags == "asimd sve sve2 bf16", repro("test_arm_cpuinfo_features_give_the_kernel_flags") + f"\n{flags}"


def test_arm_cpuinfo_gives_the_implementer_as_vendor(monkeypatch):
    _cpuinfo(monkeypatch, ARM)
    # arm64 prints Features before CPU implementer; the second processor's 0x48 is not read
    got = isakey._cpu()
    assert got == ("0x41", "asimd sve sve2 bf16"), repro("test_arm_cpuinfo_gives_the_implementer_as_vendor") + f"\n{got}"


def test_no_cpuinfo_or_no_vendor_line_is_unknown(monkeypatch):
    name = "test_no_cpuinfo_or_no_vendor_line_is_unknown"
    # a cpuinfo without a vendor line: the vendor is unknown, not the first line's value ("0")
    _cpuinfo(monkeypatch, "processor\t: 0\nmodel name\t: QEMU Virtual CPU\nflags\t\t: fpu avx\n")
    assert isakey._cpu() == ("unknown", "avx"), repro(name) + f"\n{isakey._cpu()}"

    def missing(path, *a, **kw):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    monkeypatch.setattr(isakey, "open", missing, raising=False)
    assert isakey._cpu() == ("unknown", "unknown"), repro(name)


def test_isa_key_carries_threads_and_the_kernel_picking_variables(monkeypatch):
    name = "test_isa_key_carries_threads_and_the_kernel_picking_variables"
    picking = {"ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2", "ONEDNN_DEFAULT_FPMATH_MODE": "BF16",
               "MKL_ENABLE_INSTRUCTIONS": "AVX2", "MKL_CBWR": "COMPATIBLE", "MKL_DEBUG_CPU_TYPE": "5"}
    for k, v in picking.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PQ2_NOT_A_KERNEL_VARIABLE", "1")      # other variables stay out of the key
    key = isakey.isa()
    assert key["env"] == picking, repro(name) + f"\n{key['env']}"
    # the thread count splits a GEMM's reduction differently: another count is another key
    assert key["threads"] == torch.get_num_threads(), repro(name)
    other = dict(key, threads=key["threads"] + 1)
    assert isakey.isa_difference(key, other) == f"threads {key['threads']!r} -> {key['threads'] + 1!r}", repro(name)


def test_cublas_records_the_torch_reason_and_native_the_openblas_one():
    name = "test_cublas_records_the_torch_reason_and_native_the_openblas_one"
    cls, why = isakey.bits_class("interpreter", registry.get("cublas"))
    assert cls == "isa-dependent" and "torch.matmul" in why and "OpenBLAS" not in why, repro(name) + why
    cls, why = isakey.bits_class("interpreter", registry.get("native"))
    assert cls == "isa-dependent" and "OpenBLAS" in why, repro(name) + why


# --- kernel sources a path depends on -------------------------------------------------------
# a planted tree as provenance.ROOT: kernels/a.py imports in every form the docstring names
PLANT = {
    "kernels/common.py": "X = 1\n",
    "kernels/prepare.py": "Y = 2\n",
    "kernels/a.py": ("import torch\n"
                     "from . import common, b          # from . import x\n"
                     "from .c import thing             # from .x import\n"
                     "from kernels.d import y          # from kernels.x import\n"
                     "from kernels import e as alias   # from kernels import x\n"
                     "from . import nofile             # no kernels/nofile.py: not a source\n"
                     "from .. import up                # a level-2 import is not a kernel module\n"
                     "from other.pkg import z\n"),
    "kernels/b.py": "B = 1\n", "kernels/c.py": "thing = 1\n", "kernels/d.py": "y = 1\n", "kernels/e.py": "E = 1\n",
    "kernels/up.py": "U = 1\n", "kernels/unrelated.py": "Q = 1\n",
    # a module outside kernels/: its relative imports are its own package's, not kernels', and
    # a name imported from another package is no kernel module even where kernels/<name>.py exists
    "tools/m.py": "from . import b\nfrom kernels.c import thing\nfrom other.pkg import e\n",
    "tools/b.py": "",
}


@pytest.fixture
def tree(tmp_path, monkeypatch):
    for rel, text in PLANT.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    return tmp_path


def _path(module, name="planted"):
    return types.SimpleNamespace(module=module, name=name)


def test_every_import_form_is_followed_and_nothing_else(tree):
    got = sources.source_files(_path("kernels.a"))
    want = ["kernels/a.py", "kernels/b.py", "kernels/c.py", "kernels/common.py", "kernels/d.py", "kernels/e.py",
            "kernels/prepare.py"]
    assert got == want, repro("test_every_import_form_is_followed_and_nothing_else") + f"\n{got}"


def test_a_module_outside_kernels_follows_only_absolute_kernel_imports(tree):
    got = sources.source_files(_path("tools.m"))
    want = ["kernels/c.py", "kernels/common.py", "kernels/prepare.py", "tools/m.py"]
    assert got == want, repro("test_a_module_outside_kernels_follows_only_absolute_kernel_imports") + f"\n{got}"


def test_a_module_without_a_file_has_the_shared_sources_and_no_hash(tree):
    # a path registered for a test (register_path) has no kernels/<module>.py
    name = "test_a_module_without_a_file_has_the_shared_sources_and_no_hash"
    got = sources.source_hashes(_path("kernels.ghost"))["files"]
    want = {"kernels/common.py": hashlib.sha256(b"X = 1\n").hexdigest(),
            "kernels/ghost.py": None,
            "kernels/prepare.py": hashlib.sha256(b"Y = 2\n").hexdigest()}
    assert got == want, repro(name) + f"\n{got}"


def test_a_changed_imported_source_is_reported_and_an_unrelated_one_is_not(tree):
    name = "test_a_changed_imported_source_is_reported_and_an_unrelated_one_is_not"
    p = _path("kernels.a")
    rec = sources.source_hashes(p)
    g = types.SimpleNamespace(manifest={"paths": {"planted": {"source": rec}}})
    assert verifying.changed_sources(g, p) == [], repro(name)
    (tree / "kernels/unrelated.py").write_text("Q = 2\n")
    (tree / "kernels/nofile.py").write_text("")        # appears, but a.py's list was fixed at capture
    assert verifying.changed_sources(g, p) == ["kernels/nofile.py"], repro(name)
    (tree / "kernels/nofile.py").unlink()
    (tree / "kernels/c.py").write_text("thing = 2\n")
    (tree / "kernels/prepare.py").write_text("Y = 3\n")
    assert verifying.changed_sources(g, p) == ["kernels/c.py", "kernels/prepare.py"], repro(name)
    assert sources.source_hashes(p)["sha256"] != rec["sha256"], repro(name)


# --- outputs: refused before the work -------------------------------------------------------
def _refused(says, outs=(), ins=(), dirs=()):
    with pytest.raises(cli.UsageError, match=says):
        outputs.check(list(outs), list(ins), folders=list(dirs))


def test_an_output_that_is_an_input_through_a_symlink_is_refused(tmp_path):
    name = "test_an_output_that_is_an_input_through_a_symlink_is_refused"
    (tmp_path / "in.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "in.json")
    (tmp_path / "cap").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "cap")
    _refused("is the input --render", [("--json", tmp_path / "link.json")], [("--render", tmp_path / "in.json")])
    _refused("inside the input folder --dir", [("--json", tmp_path / "alias" / "m.json")], [("--dir", tmp_path / "cap")])
    assert (tmp_path / "in.json").read_text() == "{}", repro(name)


def test_an_output_folder_on_or_inside_an_input_is_refused(tmp_path):
    (tmp_path / "cap").mkdir()
    _refused("--out .*: is the input --dir", dirs=[("--out", tmp_path / "cap")], ins=[("--dir", tmp_path / "cap")])
    _refused("--out .*: inside the input folder --dir", dirs=[("--out", tmp_path / "cap" / "sub")],
             ins=[("--dir", tmp_path / "cap")])


def test_an_output_file_on_an_output_folder_is_refused(tmp_path):
    _refused("inside the folder of --out", [("--html", tmp_path / "o")], dirs=[("--out", tmp_path / "o")])


def test_siblings_with_a_common_prefix_and_absent_inputs_pass(tmp_path):
    # "cap2" is not inside "cap", "o.json" is not inside "o": a path, not a string, prefix
    (tmp_path / "cap").mkdir()
    (tmp_path / "cap2").mkdir()
    outputs.check([("--json", tmp_path / "cap2" / "r.json"), ("--html", tmp_path / "o.html")],
                  [("--dir", tmp_path / "cap"), ("--render", None)], folders=[("--out", tmp_path / "o")])
    # an output under folders that do not exist yet: the command makes them
    outputs.check([("--json", tmp_path / "new" / "deep" / "r.json")])


# --- outputs: written after the work --------------------------------------------------------
def test_a_failed_rename_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    name = "test_a_failed_rename_keeps_the_old_file_and_leaves_no_temporary"
    old = tmp_path / "r.json"
    old.write_text("old")

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(outputs.os, "replace", full)
    with pytest.raises(outputs.WriteError) as e:
        outputs.write_text(old, "new", "--json")
    assert str(e.value) == f"--json {old}: could not write: No space left on device", repro(name) + str(e.value)
    assert old.read_text() == "old" and os.listdir(tmp_path) == ["r.json"], repro(name) + str(os.listdir(tmp_path))


def test_missing_parent_folders_are_made(tmp_path):
    p = tmp_path / "a" / "b" / "r.md"
    assert outputs.write_all([("--markdown", p, "md"), ("--json", None, lambda: 1 / 0)]) == [str(p)]
    assert p.read_text() == "md", repro("test_missing_parent_folders_are_made")


def test_a_fifo_is_written_in_place_not_replaced(tmp_path):
    name = "test_a_fifo_is_written_in_place_not_replaced"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
    reader.start()
    try:
        outputs.write_text(fifo, "through the pipe", "--json")
    finally:
        if not stat.S_ISFIFO(os.stat(fifo).st_mode):
            pytest.fail(repro(name) + "\nthe FIFO was replaced by a file")
    reader.join(10)
    assert got == ["through the pipe"], repro(name) + f"\n{got}"


def test_a_rewritten_json_warns_once_per_failure_and_writes_when_it_can(tmp_path, monkeypatch):
    name = "test_a_rewritten_json_warns_once_per_failure_and_writes_when_it_can"
    real = outputs.write_text
    script = iter([False, False, True, False])     # disk full, full, room again, full again
    written = []

    def write(path, text, option):
        if not next(script):
            raise outputs.WriteError(f"{option} {path}: could not write: No space left on device")
        real(path, text, option)
        written.append(text)
    monkeypatch.setattr(outputs, "write_text", write)
    warned = []
    live = outputs.Rewritten(tmp_path / "r.json", "--json", warned.append)
    for i in range(4):
        live.save({"n": i})
    # one warning for the first failure, none for its repeat, one for a new failure after a good write
    assert len(warned) == 2 and all(w.startswith(f"--json {tmp_path / 'r.json'}: could not write") for w in warned), \
        repro(name) + f"\n{warned}"
    assert written == ['{\n "n": 2\n}'] and (tmp_path / "r.json").read_text() == '{\n "n": 2\n}', repro(name)
    assert live.failed is not None, repro(name)
    quiet = outputs.Rewritten(None, "--json", warned.append)      # --json not given: nothing at all
    quiet.save({"n": 9})
    assert len(warned) == 2 and len(written) == 1, repro(name)


# --- provenance -------------------------------------------------------------------------------
def _git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false",
                           *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def no_git_env(monkeypatch, tmp_path):
    for k in ("PQ2VERIFY_COMMIT", "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))      # never the checkout above


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to plant a repository")
def test_commit_is_dirty_for_tracked_changes_only(tmp_path, monkeypatch, no_git_env):
    name = "test_commit_is_dirty_for_tracked_changes_only"
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "k.py").write_text("a\n")
    _git(repo, "add", "k.py")
    _git(repo, "commit", "-q", "-m", "one")
    full = _git(repo, "rev-parse", "HEAD")
    monkeypatch.setattr(provenance, "ROOT", repo)
    assert provenance.commit() == full[:12], repro(name)
    (repo / "results.json").write_text("{}")       # untracked output: the tree is still the commit
    assert provenance.commit() == full[:12], repro(name)
    (repo / "k.py").write_text("b\n")
    assert provenance.commit() == full[:12] + "+dirty", repro(name)


def test_no_git_is_unknown_and_an_empty_told_commit_is_not_told(tmp_path, monkeypatch, no_git_env):
    name = "test_no_git_is_unknown_and_an_empty_told_commit_is_not_told"
    (tmp_path / "plain").mkdir()
    monkeypatch.setattr(provenance, "ROOT", tmp_path / "plain")
    assert provenance.commit() == "unknown", repro(name)
    monkeypatch.setenv("PQ2VERIFY_COMMIT", "")     # set but empty: a sender that named nothing
    assert provenance.commit() == "unknown", repro(name)


def _fake_nvml(monkeypatch, fail=False):
    """pynvml whose device 0 and device 1 read differently; power in milliwatts, as NVML gives it."""
    nv = types.ModuleType("pynvml")
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_TEMPERATURE_GPU = 1, 2, 0

    def init():
        if fail:
            raise RuntimeError("NVML Shared Library Not Found")
    nv.nvmlInit = init
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetClockInfo = lambda h, c: {(0, 1): 1980, (0, 2): 2619, (1, 1): 345, (1, 2): 405}[h, c]
    nv.nvmlDeviceGetPowerUsage = lambda h: (312500, 61000)[h]
    nv.nvmlDeviceGetTemperature = lambda h, s: (61, 33)[h]
    monkeypatch.setitem(sys.modules, "pynvml", nv)


def test_gpu_clocks_reads_device_zero_in_mhz_watts_and_celsius(monkeypatch):
    name = "test_gpu_clocks_reads_device_zero_in_mhz_watts_and_celsius"
    _fake_nvml(monkeypatch)
    got = provenance.gpu_clocks()
    assert got == {"sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "power_w": 312.5, "temp_c": 61}, repro(name) + f"\n{got}"
    _fake_nvml(monkeypatch, fail=True)
    assert provenance.gpu_clocks() == {}, repro(name)
    monkeypatch.setitem(sys.modules, "pynvml", None)        # not installed
    assert provenance.gpu_clocks() == {}, repro(name)


@pytest.mark.parametrize("dev", ["cpu", "cuda"])
def test_collect_adds_cuda_and_clocks_on_a_gpu_only(dev, monkeypatch):
    name = f"test_collect_adds_cuda_and_clocks_on_a_gpu_only[{dev}]"
    from kernels import backend
    from pq2verify import backend_status
    monkeypatch.setattr(backend, "device", lambda: dev)
    monkeypatch.setattr(backend, "name", lambda: "planted")
    monkeypatch.setattr(provenance, "gpu_clocks", lambda: {"sm_clock_mhz": 1980})
    st = {"key": "planted", "missing": []}
    monkeypatch.setattr(backend_status, "status", lambda: st)
    info = provenance.collect()
    assert info["backend"] == "planted" and info["backend_status"] is st, repro(name)
    assert ("cuda" in info, "sm_clock_mhz" in info) == ((True, True) if dev == "cuda" else (False, False)), \
        repro(name) + f"\n{info}"
    assert "backend_status" not in provenance.collect(status=False), repro(name)


ST = {"key": "sm86", "missing": ["golden capture"], "doc": "docs/NEW_BACKEND.md", "steps": ["golden capture"]}
WARN = ("WARNING: backend sm86 is missing records of its own: golden capture. Make them "
        "(docs/NEW_BACKEND.md): golden capture")


def test_markdown_keeps_the_backend_warning_out_of_the_items():
    got = provenance.markdown_lines({"commit": "abc", "backend": "x", "backend_status": ST})
    assert got == ["- commit: abc, backend: x", f"- {WARN}"], \
        repro("test_markdown_keeps_the_backend_warning_out_of_the_items") + f"\n{got}"


def test_status_once_keeps_each_backend_warning_the_first_time_only():
    other = dict(ST, key="sm90")
    infos = [{"n": 1, "backend_status": ST}, {"n": 2, "backend_status": dict(ST)}, {"n": 3, "backend_status": other},
             {"n": 4}, {"n": 5, "backend_status": ST}]
    got = provenance.status_once(infos)
    want = [{"n": 1, "backend_status": ST}, {"n": 2}, {"n": 3, "backend_status": other}, {"n": 4}, {"n": 5}]
    assert got == want, repro("test_status_once_keeps_each_backend_warning_the_first_time_only") + f"\n{got}"
