"""What `golden verify` must refuse (issue 10): a capture with cases dropped, stored bytes changed
in one element (outputs, activations, weights; first, middle, last element and the tails past
the last full tile), an isa-dependent capture moved past its derived bound, and output paths it
cannot write. Each test breaks a throwaway copy (tmp_path) and checks the failure names the case
with a command that reproduces it."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from kernels import backend
from pq2verify import checks, cli, golden, golden_cli, provenance, registry

pytestmark = [pytest.mark.golden]

DEVICE = backend.device()
KEY = backend.golden_key()
INTERP = KEY == "interpreter"

# M=17 and N=40 are multiples of no tile the kernels use (16, 32, 64 on both backends), so the
# last row and the columns past 32 are tails shorter than a tile.
TAMPER = [checks._seeded(checks.Case(p, "t", 40, 256, 17, "bf16", "prepared", "outliers")) for p in ("mmq", "native")]
EXACT, FLOATING = TAMPER
IDS = [c.id for c in TAMPER]
POSITIONS = {"first": (0, 0), "middle": (8, 20), "last": (16, 39), "last-row tail": (16, 3),
             "last-column tail": (5, 35)}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A capture of the two TAMPER cases on this device."""
    d = tmp_path_factory.mktemp("contract") / KEY
    man = golden.capture(d, TAMPER, DEVICE, log=lambda s: None)
    assert [e["id"] for e in man["cases"]] == IDS, man["refused"]
    return d


def _copy(src, tmp_path):
    d = tmp_path / src.name
    shutil.copytree(src, d)
    return d


def _manifest(d):
    return json.loads((d / golden.MANIFEST).read_text())


def _write_manifest(d, man):
    (d / golden.MANIFEST).write_text(json.dumps(man))


def _edit_tensor(d, name, key, fn):
    t = load_file(str(d / name))
    t[key] = fn(t[key].clone())
    save_file(t, str(d / name))


def _flip(i, j, by=1):
    """The element [i, j] moved by `by` in its bit pattern (1 = one ulp for a finite float)."""
    def fn(t):
        t.view({1: torch.uint8, 2: torch.int16}[t.element_size()])[i, j] += by
        return t
    return fn


def _flip_byte(t):
    """The middle byte of a uint8 tensor with its lowest bit flipped."""
    t.view(-1)[t.numel() // 2] ^= 1
    return t


def _resign(d, name, case_id=None):
    """Make the manifest vouch for a changed file (and a case's y hash): what a careless
    recapture or a hand edit would leave, so only the deeper checks remain."""
    man = _manifest(d)
    man["files"][name] = golden.sha256_file(d / name)
    if case_id:
        e = next(e for e in man["cases"] if e["id"] == case_id)
        e["y_sha256"] = golden.tensor_sha256(load_file(str(d / name))[case_id])
    _write_manifest(d, man)


def _cli(capsys, *argv):
    try:
        rc = cli.main(["--device", DEVICE, "golden", *argv])
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out + out.err


# --- one element changed anywhere: outputs --------------------------------------------------
@pytest.mark.parametrize("where", POSITIONS)
def test_one_output_element_changed_is_caught_by_its_hash(where, tiny, tmp_path, capsys):
    d = _copy(tiny, tmp_path)
    _edit_tensor(d, "mmq.safetensors", EXACT.id, _flip(*POSITIONS[where]))
    with pytest.raises(golden.GoldenIntegrityError) as e:
        golden.load(d)
    msg = str(e.value)
    assert "mmq.safetensors: sha256" in msg and f"1 cases affected: {EXACT.id}" in msg
    assert f"reproduce: {golden.repro(KEY, EXACT.id, d)}" in msg and "--case" in msg
    rc, out = _cli(capsys, "verify", "--dir", str(d), "--case", EXACT.id)
    assert rc == 1 and "ERROR" in out and EXACT.id in out and "reproduce: ./pq2 --device" in out
    # the file hash re-signed: the case's own y hash still catches it
    _resign(d, "mmq.safetensors")
    (o,) = golden.verify(golden.load(d), DEVICE, ids=[EXACT.id])
    assert o.status == "integrity" and "does not match its recorded sha256" in o.detail and not o.ok
    rc, out = _cli(capsys, "verify", "--dir", str(d), "--case", EXACT.id)
    assert rc == 1 and f"FAIL {EXACT.id}: integrity" in out and f"reproduce: {golden.repro(KEY, EXACT.id, d)}" in out


@pytest.mark.parametrize("where", POSITIONS)
def test_one_output_element_changed_and_resigned_is_caught_by_recomputing(where, tiny, tmp_path):
    """A golden that is wrong in one element yet vouched for by every hash (a bad recapture):
    the recomputed output differs there, on an exact path by one ulp."""
    d = _copy(tiny, tmp_path)
    i, j = POSITIONS[where]
    _edit_tensor(d, "mmq.safetensors", EXACT.id, _flip(i, j))
    _resign(d, "mmq.safetensors", EXACT.id)
    (o,) = golden.verify(golden.load(d), DEVICE, ids=[EXACT.id])
    assert o.status == "different" and o.comparison == "exact"
    assert f"1 of {17 * 40} elements differ, first at [{i}, {j}]" in o.detail and "max 1 ulp" in o.detail


# --- one element changed: inputs --------------------------------------------------------------
def test_one_activation_changed_is_caught_by_its_hash(tiny, tmp_path, capsys):
    d = _copy(tiny, tmp_path)
    e = next(e for e in _manifest(d)["cases"] if e["id"] == EXACT.id)
    _edit_tensor(d, golden.INPUTS, e["x"], _flip(16, 255))           # the last element of x
    with pytest.raises(golden.GoldenIntegrityError, match=r"inputs.safetensors: sha256") as err:
        golden.load(d)
    assert f"2 cases affected: {EXACT.id}, {FLOATING.id}" in str(err.value)   # both read this x
    _resign(d, golden.INPUTS)
    res = golden.verify(golden.load(d), DEVICE, ids=IDS)
    assert [o.status for o in res] == ["integrity"] * 2
    assert all(f"activations {e['x']} of {o.case.id} do not match their recorded sha256" in o.detail for o in res)
    rc, out = _cli(capsys, "verify", "--dir", str(d), "--case", EXACT.id)
    assert rc == 1 and f"FAIL {EXACT.id}: integrity" in out and "reproduce: ./pq2 --device" in out


def test_a_damaged_input_names_only_the_cases_that_read_it(tmp_path):
    """Three cases, the third with an x of its own (M = 18): one element of that x changed names
    that case alone; a tensor added to the inputs file, read by no case, changes the file's hash
    but names no case."""
    other = checks._seeded(checks.Case("mmq", "t", 40, 256, 18, "bf16", "prepared", "outliers"))
    d = tmp_path / KEY
    golden.capture(d, TAMPER + [other], DEVICE, log=lambda s: None)
    man = _manifest(d)
    e = next(e for e in man["cases"] if e["id"] == other.id)
    assert len(man["cases"]) == 3 and all(c["x"] != e["x"] for c in man["cases"] if c["id"] != other.id)
    # a capture is shared and diffed: files readable by all, the manifest in one canonical form
    assert all((d / f).stat().st_mode & 0o777 == 0o644 for f in man["files"]), man["files"]
    text = (d / golden.MANIFEST).read_text()
    assert text == json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n"
    clean = tmp_path / "clean"
    shutil.copytree(d, clean)
    _edit_tensor(d, golden.INPUTS, e["x"], _flip(0, 0))
    with pytest.raises(golden.GoldenIntegrityError) as err:
        golden.load(d)
    assert f"1 cases affected: {other.id}" in str(err.value), str(err.value)
    t = load_file(str(clean / golden.INPUTS))
    t["unread"] = torch.zeros(4)
    save_file(t, str(clean / golden.INPUTS))
    with pytest.raises(golden.GoldenIntegrityError) as err:
        golden.load(clean)
    assert "no case's tensor changed (the change is outside them)" in str(err.value), str(err.value)


def test_one_weight_byte_changed_is_caught_by_its_hash(tiny, tmp_path):
    d = _copy(tiny, tmp_path)
    man = _manifest(d)
    wkey = next(e["weight"] for e in man["cases"] if e["id"] == EXACT.id)
    assert man["weights"][wkey]["stored"]
    _edit_tensor(d, golden.INPUTS, wkey, _flip_byte)
    with pytest.raises(golden.GoldenIntegrityError, match=rf"2 cases affected: {EXACT.id}"):
        golden.load(d)
    _resign(d, golden.INPUTS)
    res = golden.verify(golden.load(d), DEVICE, ids=IDS)
    assert [o.status for o in res] == ["integrity"] * 2
    assert all(f"weight {wkey} stored has sha256" in o.detail for o in res)


# --- cases dropped from the capture -----------------------------------------------------------
@pytest.fixture
def committed(tmp_path):
    """A copy of this backend's committed capture."""
    src = golden.default_dir(KEY)
    if not (src / golden.MANIFEST).exists():
        assert KEY not in golden.COMMITTED, f"the committed capture {src} is missing"
        pytest.skip(f"no capture is committed for {KEY}")
    return _copy(src, tmp_path)


def test_a_dropped_case_is_missing(committed, capsys):
    man = _manifest(committed)
    gone = next(e for e in man["cases"] if e["path"] == "cublas")
    man["cases"].remove(gone)
    _write_manifest(committed, man)
    res = golden.verify(golden.load(committed), DEVICE, paths=["cublas"])
    bad = [o for o in res if not o.ok]
    assert [(o.case.id, o.status) for o in bad] == [(gone["id"], "missing")]
    assert "not in the capture; capture it: ./pq2 --device" in bad[0].detail and "--paths cublas" in bad[0].detail
    rc, out = _cli(capsys, "verify", "--dir", str(committed), "--paths", "cublas")
    assert rc == 1 and f"FAIL {gone['id']}: missing" in out and "reproduce: ./pq2 --device" in out


def test_a_dropped_path_is_missing_case_by_case(committed):
    man = _manifest(committed)
    man["cases"] = [e for e in man["cases"] if e["path"] != "cublas"]
    del man["files"]["cublas.safetensors"], man["paths"]["cublas"]
    _write_manifest(committed, man)
    (committed / "cublas.safetensors").unlink()
    res = golden.verify(golden.load(committed), DEVICE, paths=["cublas"])
    want = sorted(c.id for c in golden.cases(KEY, ["cublas"]))
    assert sorted(o.case.id for o in res if o.status == "missing") == want
    assert res and not any(o.ok for o in res)


def test_a_case_whose_output_entry_is_gone_or_off_its_hash(committed):
    man = _manifest(committed)
    a, b = [e["id"] for e in man["cases"] if e["path"] == "cublas"][:2]
    t = load_file(str(committed / "cublas.safetensors"))
    del t[a]
    save_file(t, str(committed / "cublas.safetensors"))
    man["files"]["cublas.safetensors"] = golden.sha256_file(committed / "cublas.safetensors")
    next(e for e in man["cases"] if e["id"] == b)["y_sha256"] = "0" * 64
    _write_manifest(committed, man)
    res = {o.case.id: o for o in golden.verify(golden.load(committed), DEVICE, ids=[a, b])}
    assert res[a].status == "integrity" and f"has no output for case {a}" in res[a].detail
    assert res[b].status == "integrity" and f"output of {b} does not match its recorded sha256" in res[b].detail


def test_unknown_case_id_is_a_usage_error(committed, capsys):
    rc, out = _cli(capsys, "verify", "--dir", str(committed), "--case", "native:bogus")
    assert rc == 2 and "--case 'native:bogus': not a golden case of backend" in out


def test_an_empty_selection_never_passes(committed, capsys, monkeypatch):
    rc, out = _cli(capsys, "verify", "--dir", str(committed), "--kernels", "legacy", "--paths", "single")
    assert rc == 2 and "no path matches --kernels legacy --paths single" in out
    monkeypatch.setattr(golden, "verify", lambda *a, **k: [])
    rc, out = _cli(capsys, "verify", "--dir", str(committed))
    assert rc == 1 and "FAIL: no golden case was verified" in out


# --- format 1 (golden/sm90 as committed) is read as it is --------------------------------------
def test_format_1_reads_and_upgrades_without_touching_tensors(tiny, tmp_path):
    d = _copy(tiny, tmp_path)
    man = _manifest(d)
    for e in man["cases"]:
        del e["x_sha256"]
    for rec in man["paths"].values():
        for k in ("bits", "bits_reason", "isa"):
            del rec[k]
    man["format"] = 1
    _write_manifest(d, man)
    before = {f.name: golden.sha256_file(f) for f in d.glob("*.safetensors")}
    g = golden.load(d)
    assert all(o.ok for o in golden.verify(g, DEVICE, ids=IDS))
    if INTERP:     # the CPU it was captured on is unknown: the floating path by the bound
        assert golden.comparison(g, registry.get("native"), golden.isa()).startswith("bound (the capture's ISA was not")
    up = golden.upgrade(d)
    assert up["format"] == golden.FORMAT and all("x_sha256" in e for e in up["cases"])
    assert {n: r["bits"] for n, r in up["paths"].items()} == \
        {n: golden.bits_class(KEY, registry.get(n))[0] for n in ("mmq", "native")}
    assert all(r["isa"] is None for r in up["paths"].values())
    assert {f.name: golden.sha256_file(f) for f in d.glob("*.safetensors")} == before
    assert all(o.ok for o in golden.verify(golden.load(d), DEVICE, ids=IDS))


def test_every_weight_is_stored_whatever_its_size(tmp_path, monkeypatch):
    """torch's CPU randn bits follow ATen's CPU capability, so a weight regenerated from its seed
    on another host may differ: a capture stores each weight, even one over the old 64 KB cut,
    and verify reads it (a format-1 capture's regenerated weight still verifies by its hash)."""
    big = checks._seeded(checks.Case("cublas", "t", 96, 512, 1, "bf16", "dense", "normal"))   # 96 KB
    man = golden.capture(tmp_path / KEY, [big], DEVICE, log=lambda s: None)
    (meta,) = man["weights"].values()
    assert meta["stored"] and meta["n"] * meta["k"] * 2 > 64 * 1024
    real = golden.make_weight
    monkeypatch.setattr(golden.capturing, "make_weight", lambda meta: pytest.fail("a stored weight was regenerated"))
    assert [o.status for o in golden.verify(golden.load(tmp_path / KEY), DEVICE, ids=[big.id])] == ["identical"]
    monkeypatch.setattr(golden.capturing, "make_weight", real)
    m = _manifest(tmp_path / KEY)
    for v in m["weights"].values():
        v["stored"] = False                                  # as format 1 wrote large weights
    _write_manifest(tmp_path / KEY, m)
    assert [o.status for o in golden.verify(golden.load(tmp_path / KEY), DEVICE, ids=[big.id])] == ["identical"]


# --- bits that depend on the CPU --------------------------------------------------------------
needs_interp = pytest.mark.skipif(not INTERP, reason="isa-dependent bits exist only on the interpreter backend")


def _nudge(monkeypatch, path, i, j, by):
    """Every call of `path` returns its output with element [i, j] moved by `by` ulps."""
    real = registry.Path.kernel

    def kernel(self):
        run = real(self)
        if self.name != path:
            return run

        def nudged(x, w, *, out=None, dots=None):
            y = run(x, w, out=out)
            y.view(torch.int16)[i, j] += by
            return y
        return nudged
    monkeypatch.setattr(registry.Path, "kernel", kernel)


def _other_cpu(monkeypatch):
    real = golden.isa
    monkeypatch.setattr(golden.isakey, "isa", lambda: dict(real(), torch_cpu_capability="ANOTHER"))


def test_isa_key_equal_only_when_complete():
    now = golden.isa()
    assert golden.isa_difference(now, now) == ""
    assert golden.isa_difference(None, now) == "the capture's ISA was not recorded"
    assert golden.isa_difference(now, dict(now, threads=now["threads"] + 1)) == \
        f"threads {now['threads']!r} -> {now['threads'] + 1!r}"
    blind = dict(now, numpy_blas="openblas core unknown")
    assert golden.isa_difference(blind, blind) == "this machine's ISA key is incomplete (numpy_blas unknown)"


@needs_interp
def test_capture_records_bits_and_isa(tiny):
    paths = _manifest(tiny)["paths"]
    assert paths["native"]["bits"] == "isa-dependent" and paths["native"]["isa"] == golden.isa()
    assert "OpenBLAS" in paths["native"]["bits_reason"]
    assert paths["mmq"]["bits"] == "exact" and paths["mmq"]["isa"] is None
    assert golden.bits_class(KEY, registry.get("cublas"))[0] == "isa-dependent"
    assert {p.name for p in registry.PATHS if golden.bits_class(KEY, p)[0] == "exact"} == \
        {p.name for p in registry.PATHS if p.arithmetic == "integer"}


@needs_interp
def test_same_isa_is_compared_exactly(tiny, monkeypatch):
    g = golden.load(tiny)
    (o,) = golden.verify(g, DEVICE, ids=[FLOATING.id])
    assert o.status == "identical" and o.comparison == "exact (ISA as captured)"
    _nudge(monkeypatch, "native", 3, 7, 1)
    (o,) = golden.verify(g, DEVICE, ids=[FLOATING.id])
    assert o.status == "different" and "first at [3, 7]" in o.detail and "max 1 ulp" in o.detail


@needs_interp
def test_other_isa_is_compared_within_the_bound(tiny, monkeypatch):
    g = golden.load(tiny)
    _other_cpu(monkeypatch)
    (o,) = golden.verify(g, DEVICE, ids=[FLOATING.id])
    assert o.status == "identical" and o.comparison.startswith("bound (torch_cpu_capability ")
    assert o.comparison.endswith("-> 'ANOTHER')")
    _nudge(monkeypatch, "native", 3, 7, 1)          # what another CPU's fold order does: 1 ulp
    (o,) = golden.verify(g, DEVICE, ids=[FLOATING.id])
    assert o.status == "within bound" and o.ok and "1 of 680 elements differ, max 1 ulp" in o.detail


@needs_interp
def test_other_isa_still_fails_two_ulps_past_the_bound(tiny, monkeypatch):
    g = golden.load(tiny)
    ins = golden._Inputs(g)
    e = next(e for e in g.manifest["cases"] if e["id"] == FLOATING.id)
    want, x = ins.y(e), ins.x(e)
    w = golden.weight_for(FLOATING, ins.weight(e["weight"]), DEVICE)
    bound = golden.fold_bound(registry.get("native"), FLOATING, x, w, want, want)
    # an element away from a binade edge, where two ulps are past its bound
    from reference import metrics
    two = 2 * metrics.spacing(want.double().numpy(), torch.bfloat16)
    mant = want.view(torch.int16).numpy() & 0x7F
    i, j = np.argwhere((two > 1.05 * bound) & (mant >= 2) & (mant <= 0x7D))[0]
    _other_cpu(monkeypatch)
    _nudge(monkeypatch, "native", int(i), int(j), 2)
    (o,) = golden.verify(g, DEVICE, ids=[FLOATING.id])
    assert o.status == "different" and o.comparison.startswith("bound")
    assert f"1 of 680 elements outside the bound (1 differ), first at [{i}, {j}]" in o.detail and "(2 ulp)" in o.detail


@needs_interp
def test_integer_path_stays_exact_on_another_isa(tiny, monkeypatch):
    g = golden.load(tiny)
    _other_cpu(monkeypatch)
    _nudge(monkeypatch, "mmq", 16, 39, 1)
    (o,) = golden.verify(g, DEVICE, ids=[EXACT.id])
    assert o.status == "different" and o.comparison == "exact" and "first at [16, 39]" in o.detail


@needs_interp
def test_committed_floating_captures_hold_on_other_cpu_dispatch():
    """The committed capture under the dispatch of another x86 machine: torch's kernels without
    AVX (ATEN_CPU_CAPABILITY=default), oneDNN capped at AVX2, numpy's OpenBLAS on its Haswell
    kernels. The bits differ (cublas M=17 by 1 ulp); the verdict must not."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default", ONEDNN_MAX_CPU_ISA="AVX2", OPENBLAS_CORETYPE="Haswell")
    r = subprocess.run([sys.executable, "-m", "pq2verify.cli", "--device", "cpu", "golden", "verify",
                        "--paths", "cublas,native,small_gemm"], cwd=provenance.ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "PASS: 25 of 25 golden cases" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    assert "compared within the derived bound" in r.stdout


# --- output paths are checked before any work -------------------------------------------------
@pytest.fixture
def no_work(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("work started before the bad output path was refused")
    for name in ("capture", "verify", "load", "cases"):
        monkeypatch.setattr(golden, name, refuse)
    monkeypatch.setattr(golden_cli, "_importable", refuse)


def test_capture_into_an_unwritable_dir_is_refused_first(tmp_path, capsys, no_work):
    f = tmp_path / "file"
    f.write_text("x")
    rc, out = _cli(capsys, "capture", "--dir", str(f / "golden"))
    assert rc == 2 and f"--dir {f / 'golden'}: {f} is not a directory" in out, out
    rc, out = _cli(capsys, "capture", "--model", "--dir", str(f))
    assert rc == 2 and f"--dir {f / 'model'}: {f} is not a directory" in out, out


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs Linux /proc: a directory no one can create files in")
def test_capture_and_json_into_a_read_only_dir_are_refused_first(capsys, no_work):
    rc, out = _cli(capsys, "capture", "--dir", "/proc/pq2-golden")
    assert rc == 2 and "--dir /proc/pq2-golden: cannot write to /proc" in out, out
    rc, out = _cli(capsys, "verify", "--json", "/proc/pq2-golden.json")
    assert rc == 2 and "--json /proc/pq2-golden.json: cannot write to /proc" in out, out


def test_json_under_a_file_is_refused_first(tmp_path, capsys, no_work):
    (tmp_path / "f").write_text("x")
    rc, out = _cli(capsys, "verify", "--json", str(tmp_path / "f" / "r.json"))
    assert rc == 2 and f"--json {tmp_path / 'f' / 'r.json'}: {tmp_path / 'f'} is not a directory" in out, out


# --- golden compares everything it holds (issue 23, class 4) ----------------------------------
# Each test plants one fault in a throwaway capture or in a kernel (monkeypatched) and requires a
# failure that names it; none of them reads the verdict's class from the function under test.
def _resign_all(d, name):
    """The manifest vouches for the file `name` as it now is: its file hash, and the y or x hash
    of every case that reads a changed tensor of it."""
    man = _manifest(d)
    man["files"][name] = golden.sha256_file(d / name)
    t = load_file(str(d / name))
    for e in man["cases"]:
        if name == golden.INPUTS and e["x"] in t:
            e["x_sha256"] = golden.tensor_sha256(t[e["x"]])
        elif e["file"] == name and e["id"] in t:
            e["y_sha256"] = golden.tensor_sha256(t[e["id"]])
    _write_manifest(d, man)


# (file, tensor, cut, the shape the cut leaves, the case's whole shape)
TRUNCATIONS = {
    "output, last row dropped": ("mmq.safetensors", "y", lambda t: t[:16].contiguous(), (16, 40), (17, 40)),
    "output, a prefix of its elements": ("mmq.safetensors", "y", lambda t: t.reshape(-1)[:600].contiguous(),
                                         (600,), (17, 40)),
    "output, last column dropped": ("mmq.safetensors", "y", lambda t: t[:, :39].contiguous(), (17, 39), (17, 40)),
    "activations, last row dropped": (golden.INPUTS, "x", lambda t: t[:16].contiguous(), (16, 256), (17, 256)),
}


@pytest.mark.parametrize("how", TRUNCATIONS)
def test_a_capture_holding_part_of_a_tensor_fails_as_integrity(how, tiny, tmp_path):
    """A capture whose tensor is cut short, with every hash re-signed: verify must say the capture
    does not hold the whole tensor (not compare the part it holds, nor call it a kernel diff)."""
    name, which, cut, got, whole = TRUNCATIONS[how]
    d = _copy(tiny, tmp_path)
    e = next(e for e in _manifest(d)["cases"] if e["id"] == EXACT.id)
    _edit_tensor(d, name, e["x"] if which == "x" else EXACT.id, cut)
    _resign_all(d, name)
    res = golden.verify(golden.load(d), DEVICE, ids=[EXACT.id])
    assert [o.status for o in res] == ["integrity"], [o.message() for o in res]
    assert f"is {got} torch.bfloat16, the case's whole tensor is {whole} torch.bfloat16" in res[0].detail
    assert "does not hold all of it" in res[0].detail


def test_a_case_the_kernel_cannot_run_is_refused_at_capture_and_fails_verify(tmp_path, monkeypatch, capsys):
    """An expected case whose kernel raises (e.g. 'not supported here') is neither skipped nor
    fatal to the capture: it is recorded as refused, and verify fails it as missing."""
    real = registry.Path.kernel

    def kernel(self):
        run = real(self)
        if self.name != "native":
            return run

        def unsupported(x, w, *, out=None, dots=None):
            raise NotImplementedError("native: not on this backend")
        return unsupported

    monkeypatch.setattr(registry.Path, "kernel", kernel)
    d = tmp_path / KEY
    native, mmq = (golden.cases(KEY, [p])[0] for p in ("native", "mmq"))      # cases the code expects
    man = golden.capture(d, [native, mmq], DEVICE, log=lambda s: None)
    assert [e["id"] for e in man["cases"]] == [mmq.id]
    assert man["refused"] == [{"id": native.id, "why": "raised NotImplementedError: native: not on this backend"}]
    (o,) = golden.missing(golden.load(d), ids=[native.id])
    assert o.status == "missing" and not o.ok and "refused at capture (raised NotImplementedError" in o.detail
    # and a kernel that raises at verify time is an error of that case, never a skip
    def gone(x, w, *, out=None, dots=None):
        raise NotImplementedError("gone")
    monkeypatch.setattr(registry.Path, "kernel", lambda self: gone)
    (o,) = golden.verify(golden.load(d), DEVICE, ids=[mmq.id])
    assert o.status == "error" and not o.ok and "NotImplementedError: gone" in o.detail


def _code_class(path: str) -> str:
    """The bits class this test expects, from the module docstring's rule: only a floating path
    on the interpreter has CPU-dependent bits."""
    return "isa-dependent" if INTERP and registry.get(path).arithmetic == "floating" else "exact"


@pytest.mark.parametrize("path", ["native", "mmq"])
def test_a_manifest_bits_claim_never_decides_and_is_reported(path, tiny, tmp_path, monkeypatch):
    """A manifest that records the other class for a path (exact for a bounded one, bounded for
    an exact one): the comparison stays the code's, and the disagreement is a failure."""
    case = {"native": FLOATING, "mmq": EXACT}[path]
    claim = "exact" if _code_class(path) == "isa-dependent" else "isa-dependent"
    d = _copy(tiny, tmp_path)
    man = _manifest(d)
    man["paths"][path]["bits"] = claim
    _write_manifest(d, man)
    g = golden.load(d)
    (o,) = golden.verify(g, DEVICE, ids=[case.id])
    assert o.status == "integrity" and not o.ok
    assert f"the manifest records bits {claim!r} for {path}, the code decides {_code_class(path)!r}" in o.detail
    # on another CPU the code's class decides: an exact path's 1-ulp change stays a difference
    _other_cpu(monkeypatch)
    if _code_class(path) == "exact":
        _nudge(monkeypatch, path, 3, 7, 1)
        (o,) = golden.verify(g, DEVICE, ids=[case.id])
        assert o.status == "different" and o.comparison == "exact" and "first at [3, 7]" in o.detail
    else:
        assert golden.comparison(g, registry.get(path), golden.isa()).startswith("bound (torch_cpu_capability")


def test_the_running_backend_decides_the_class_not_the_manifest(tiny, tmp_path, monkeypatch, capsys):
    """A capture whose manifest names another backend than the one running is refused, and the
    class of a path is the running backend's (a GPU never compares a floating path by the CPU
    bound because a manifest says 'interpreter')."""
    d = _copy(tiny, tmp_path)
    g = golden.load(d)
    other = "sm90" if INTERP else "interpreter"
    monkeypatch.setattr(backend, "golden_key", lambda: other)
    how = golden.comparison(g, registry.get("native"), golden.isa())
    assert how == "exact" if other != "interpreter" else how.startswith("bound")
    with pytest.raises(golden.OtherBackend, match=rf"holds the capture of backend '{KEY}'; this run is on '{other}'"):
        golden.verify(g, DEVICE, ids=IDS)
    rc, out = _cli(capsys, "verify", "--dir", str(d))
    assert rc == 2 and f"holds the capture of backend '{KEY}'" in out


def _rewriting(monkeypatch, path, mode):
    """`path`'s run from its second call on: 'rewrites' moves its output by one ulp at [0, 0] and
    writes that into the buffer it returned before too (so two results read from the kernel's
    own buffers are one tensor); 'cached' returns the buffer of its first call."""
    real = registry.Path.kernel
    state = {"first": None, "calls": 0}

    def kernel(self):
        run = real(self)
        if self.name != path:
            return run

        def aliasing(x, w, *, out=None, dots=None):
            state["calls"] += 1
            if state["calls"] == 1:
                state["first"] = run(x, w, out=out)
                return state["first"]
            if mode == "cached":
                return state["first"]
            y = run(x, w, out=out)
            y.view(torch.int16)[0, 0] += 1
            state["first"].copy_(y)
            return y
        return aliasing
    monkeypatch.setattr(registry.Path, "kernel", kernel)


@pytest.mark.parametrize("mode", ["rewrites", "cached"])
def test_a_rerun_that_aliases_its_output_is_caught_in_verify(mode, tiny, monkeypatch):
    g = golden.load(tiny)
    _rewriting(monkeypatch, "mmq", mode)
    (o,) = golden.verify(g, DEVICE, ids=[EXACT.id])
    assert not o.ok
    if mode == "rewrites":
        assert o.status == "different" and "a rerun gave other bytes (not deterministic)" in o.detail
        assert "first at [0, 0]" in o.detail
    else:
        assert o.status == "error" and "ignored out=" in o.detail


def test_a_rerun_that_aliases_its_output_is_refused_at_capture(tmp_path, monkeypatch):
    _rewriting(monkeypatch, "mmq", "rewrites")
    man = golden.capture(tmp_path / KEY, [EXACT], DEVICE, log=lambda s: None)
    assert man["cases"] == []
    assert man["refused"] == [{"id": EXACT.id, "why": "a rerun gave other bytes (not deterministic)"}]


def test_run_case_refuses_a_result_on_an_earlier_storage(tiny):
    """The storage guard itself: a result that is the storage of a tensor given in `avoid` (an
    earlier run's buffer, the golden) is refused, and the returned tensor is a copy."""
    g = golden.load(tiny)
    ins = golden._Inputs(g)
    e = next(e for e in g.manifest["cases"] if e["id"] == EXACT.id)
    x, w = ins.x(e), golden.weight_for(EXACT, ins.weight(e["weight"]), DEVICE)
    bufs = []
    y = golden.run_case(EXACT, x, w, DEVICE, keep=bufs)
    assert len(bufs) == 1 and y.untyped_storage().data_ptr() != bufs[0].untyped_storage().data_ptr()
    earlier = []

    def hands_back(x, w, *, out=None, dots=None):
        earlier.append(out)        # as if this buffer were one it had returned before
        return out
    with pytest.raises(AssertionError, match="the storage of an earlier result"):
        golden.run_case(EXACT, x, w, DEVICE, kernel=hands_back, avoid=earlier)


@pytest.mark.parametrize("extra", ["stale.safetensors", "notes.txt", ".manifest.json.tmp", "sub/"])
def test_unlisted_files_in_a_capture_fail_naming_them(extra, tiny, tmp_path, capsys):
    d = _copy(tiny, tmp_path)
    if extra.endswith("/"):
        (d / extra).mkdir()
    else:
        (d / extra).write_text("x")
    with pytest.raises(golden.GoldenIntegrityError, match=rf"holds 1 file\(s\) its manifest does not list: {extra}"):
        golden.load(d)
    rc, out = _cli(capsys, "verify", "--dir", str(d))
    assert rc == 1 and "ERROR (integrity)" in out and extra in out
    assert f"reproduce: ./pq2 --device {'cpu' if INTERP else 'cuda'} golden verify --dir {d}" in out


def test_a_case_capture_may_hold_its_model_capture_folder(tiny, tmp_path):
    d = _copy(tiny, tmp_path)
    (d / "model").mkdir()
    assert golden.load(d).manifest["cases"]
    (d / "model" / "stray.bin").write_text("x")
    (d / "model" / golden.MANIFEST).write_text(json.dumps({"format": 2, "kind": "model", "backend_key": KEY,
                                                           "files": {}, "cases": [], "records": []}))
    with pytest.raises(golden.GoldenIntegrityError, match="does not list: stray.bin"):
        golden.load(d / "model")


def test_a_case_off_its_capture_and_off_its_own_rerun_reports_both(tiny):
    """The first recomputation one ulp off the capture at [0, 0], the second one ulp off at
    [1, 1] instead: 'different', and the detail keeps the capture's difference (first at [0, 0],
    vs captured) before the rerun's (not deterministic). Kills golden/verifying.py
    `detail and status == "different"` -> `!=` (the capture's difference would be dropped)."""
    run = registry.get(EXACT.path).kernel()
    calls = []

    def drifting(x, w, *, out=None, dots=None):
        y = run(x, w, out=out)
        i = len(calls)
        calls.append(i)
        y.view(torch.int16)[i, i] += 1
        return y
    (o,) = golden.verify(golden.load(tiny), DEVICE, ids=[EXACT.id], kernel=drifting)
    assert len(calls) == 2 and o.status == "different", (calls, o.status, o.detail)
    first, _, rerun = o.detail.partition("; a rerun gave other bytes (not deterministic): ")
    assert "1 of " in first and "first at [0, 0]" in first and "vs captured" in first, o.detail
    assert "first at [0, 0]" in rerun and "vs the first run" in rerun, o.detail
