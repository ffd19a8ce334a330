"""The bounds (pq2verify.numerics) and the golden comparison (pq2verify.golden) at edges that
single planted faults (mutants) survived the rest of the suite on: the cross-ISA bound's FP32
underflow term where the absolute sum S is 0, and the Q8 allowance against an all-zero dense
reference. Each expected value is derived by hand in the test's docstring, never read from the
code under test; each test names the mutant it kills."""
import numpy as np
import pytest
import torch

from pq2verify import numerics, registry, verdicts

HERE = ".venv/bin/python -m pytest -q -p no:randomly 'tests/test_bound_golden_faults.py::{}'"
TINY = 2.0 ** -126                        # FP32's smallest normal: the underflow unit of F


def repro(name: str) -> str:
    return "reproduce: " + HERE.format(name)


# --- golden: the cross-ISA bound's underflow term -----------------------------------------------
@pytest.mark.parametrize("y_exp, want_status", [(-118, "within bound"), (-116, "different")])
def test_cross_isa_bound_keeps_the_underflow_term_where_s_is_zero(y_exp, want_status):
    """All-zero activations make S = |x| @ |W|^T = 0, so F = (K + 2)(2^-24 S + 2^-126) is the
    underflow term alone: K = 254 gives F = 256 2^-126 = 2^-118, 2 F = 2^-117. Against a golden
    of 0, y = 2^-118 (a bf16 normal, spacing there 2^-118 / 2^7 = 2^-125) has bound
    2^-117 + 2^-125 > 2^-118: within bound; y = 2^-116 has bound 2^-117 + 2^-123 < 2^-116:
    different. (An FP32 fold of zeros that flushed nothing gives exactly 0, but the bound must
    allow the flushed-subnormal term it documents.) Kills numerics.cross_isa_bound's
    `CPU_FP32_U * s + FP32_TINY` -> `- FP32_TINY` (the bound then goes negative at S = 0)."""
    name = "test_cross_isa_bound_keeps_the_underflow_term_where_s_is_zero"
    p = registry.get("cublas")
    assert p.weight == "dense" and p.arithmetic == "floating", "precondition: a dense floating path"
    k = 254
    x = torch.zeros(1, k, dtype=torch.bfloat16)
    w = torch.from_numpy(np.random.default_rng(7).standard_normal((2, k))).to(torch.bfloat16)
    want = torch.zeros(1, 2, dtype=torch.bfloat16)
    y = want.clone()
    y[0, 1] = 2.0 ** y_exp
    assert float(y[0, 1]) == 2.0 ** y_exp, "precondition: 2^y_exp is a bf16 normal"
    bound = numerics.cross_isa_bound(p, k, x, w, y, want)
    f2 = 2 * (k + 2) * TINY                                         # 2 F = 2^-117
    assert bound[0, 0] == pytest.approx(f2 + 2.0 ** -133, rel=1e-12), (
        f"bound at y = golden = 0: {bound[0, 0]!r}, want 2^-117 + the bf16 subnormal spacing 2^-133; "
        f"{repro(name)}")
    status, detail = verdicts.compare_bound(y, want, bound)
    assert status == want_status, f"y = 2^{y_exp} vs golden 0 at S = 0: {status} {detail}; {repro(name)}"


# --- the Q8 allowance against an all-zero dense reference ---------------------------------------
def test_q8_allowance_against_an_all_zero_dense_reference_is_zero():
    """With D = 0 the triangle-inequality bound e_q + tol_q |Q| / |D| has no meaning (|D| = 0);
    relative_rms against an all-zero reference is 0 for an exact match and inf otherwise, so no
    finite allowance changes a verdict there, and q8_allowance adds none: (0.0, 0.0) for Q = D = 0.
    The dense tolerance of an integer path (int_gemv, against Q8) is then the plain budget
    max(Q8_BUDGET, 0) = 0.03, and its quantized one u + 1e-5 (bf16: 2^-8 + 1e-5; the subnormal
    floor of an all-zero Q is 0). Kills numerics.q8_allowance's `... if nd else 0.0` -> `else 1.0`
    (a reported dense tolerance of 1.0)."""
    name = "test_q8_allowance_against_an_all_zero_dense_reference_is_zero"
    zeros = np.zeros((1, 4))
    e_q, allow = numerics.q8_allowance(zeros, zeros, 0.01)
    assert (e_q, allow) == (0.0, 0.0), f"q8_allowance(Q = 0, D = 0): {(e_q, allow)}, want (0.0, 0.0); {repro(name)}"
    got = numerics.rms_tolerances(registry.get("int_gemv"), torch.bfloat16, lambda which: zeros)
    assert [w for w, _, _ in got] == ["dense", "quantized"], repro(name)
    (_, tol_d, eq_d), (_, tol_q, eq_q) = got
    assert tol_d == 0.03 and eq_d == 0.0, f"dense: tolerance {tol_d!r}, e_q {eq_d!r}, want 0.03, 0.0; {repro(name)}"
    assert tol_q == pytest.approx(2.0 ** -8 + 1e-5, rel=1e-12) and eq_q is None, (
        f"quantized: tolerance {tol_q!r}, e_q {eq_q!r}; {repro(name)}")


# --- replay: the bias threshold of a single test -------------------------------------------------
@pytest.mark.parametrize("n_tests", [0, 1])
def test_bias_threshold_of_one_test_is_the_two_sided_alpha_quantile(n_tests):
    """One two-sided test at family-wise alpha = 1e-3 (no Bonferroni split; 0 tests is read as
    one): z = Phi^-1(1 - 0.0005) = 3.290527 (the standard normal table's 0.9995 quantile; the
    one-sided 0.99975 quantile of a two-test split is 3.4808). Kills numerics.bias_threshold's
    `max(n_tests, 1)` -> `max(n_tests, 2)` (one test judged at the two-test threshold)."""
    z = numerics.bias_threshold(n_tests)
    assert z == pytest.approx(3.290527, abs=2e-6), (
        f"bias_threshold({n_tests}) = {z!r}, want 3.290527; "
        f"{repro(f'test_bias_threshold_of_one_test_is_the_two_sided_alpha_quantile[{n_tests}]')}")


# --- golden: an outcome's message names the comparison made -------------------------------------
@pytest.mark.parametrize("comparison, tag", [("exact", ""), ("exact (ISA as captured)", " [exact (ISA as captured)]"),
                                             ("bound (threads 1 -> 2)", " [bound (threads 1 -> 2)]")],
                         ids=["exact", "exact-isa", "bound"])
def test_an_outcomes_message_tags_every_comparison_but_plain_exact(comparison, tag):
    """The message is '<id>: <status>', then ' [<comparison>]' unless the comparison is the
    plain bit-for-bit 'exact' (the default, which needs no word), then ' (<detail>)': a reader
    of a 'within bound' line must see which ISA difference loosened it. Kills
    golden/verifying.py Outcome.message's `comparison != "exact"` -> `==`."""
    from types import SimpleNamespace
    from pq2verify.golden.verifying import Outcome
    o = Outcome(SimpleNamespace(id="c0"), "within bound", "max 1 ulp", [], comparison)
    want = f"c0: within bound{tag} (max 1 ulp)"
    assert o.message() == want, (f"{o.message()!r}, want {want!r}; reproduce: "
                                 + HERE.format(f"test_an_outcomes_message_tags_every_comparison_but_plain_exact"))


def test_verify_logs_each_outcome_as_it_is_made(monkeypatch):
    """verify(log=) hands the log every outcome once, in order, as it is made (the captured
    cases, then the missing ones): with two captured cases c0, c1 and one missing m0 the log
    sees c0, c1, m0. The recompute and the missing-case scan are stubbed: only the loop's
    bookkeeping is pinned. Kills golden/verifying.py verify's `log(out[-1])` -> `log(out[-2])`."""
    from types import SimpleNamespace
    from pq2verify.golden import verifying
    made = lambda cid, status: verifying.Outcome(SimpleNamespace(id=cid), status)   # noqa: E731
    monkeypatch.setattr(verifying, "_Inputs", lambda g: None)
    monkeypatch.setattr(verifying, "verify_entry", lambda g, ins, e, device, kernel=None: made(e["id"], "identical"))
    monkeypatch.setattr(verifying, "missing", lambda g, paths=None, ids=None: [made("m0", "missing")])
    g = SimpleNamespace(manifest={"cases": [{"id": "c0", "path": "native"}, {"id": "c1", "path": "native"}]})
    seen = []
    out = verifying.verify(g, "cpu", log=lambda o: seen.append(o.case.id))
    assert [o.case.id for o in out] == ["c0", "c1", "m0"], repro("test_verify_logs_each_outcome_as_it_is_made")
    assert seen == ["c0", "c1", "m0"], f"logged {seen}; {repro('test_verify_logs_each_outcome_as_it_is_made')}"


def test_a_weight_off_its_hash_names_both_hashes_by_16_hex_digits():
    """A stored weight whose bytes hash to other than the manifest's sha256 is an integrity
    error naming both hashes by their first 16 hex digits and an ellipsis (the hash of the
    bytes, computed here with hashlib over the tensor's raw little-endian bytes, and the
    manifest's 'f' * 64). Kills golden/verifying.py _Inputs.weight's `got[:16]` and
    `meta['sha256'][:16]` -> `[:17]`."""
    import hashlib
    from pq2verify.golden import verifying
    from pq2verify.golden.store import GoldenIntegrityError
    data = torch.arange(8, dtype=torch.int16)
    got = hashlib.sha256(data.numpy().tobytes()).hexdigest()
    ins = object.__new__(verifying._Inputs)
    ins.g = type("G", (), {"manifest": {"weights": {"w0": {"stored": True, "sha256": "f" * 64}}}})()
    ins.stored, ins.w = {"w0": data}, {}
    with pytest.raises(GoldenIntegrityError) as ex:
        ins.weight("w0")
    want = f"weight w0 stored has sha256 {got[:16]}…, the capture recorded {'f' * 16}… "
    assert str(ex.value).startswith(want), (
        f"{str(ex.value)!r} does not start {want!r}; {repro('test_a_weight_off_its_hash_names_both_hashes_by_16_hex_digits')}")


def test_a_nondeterministic_rerun_of_a_case_within_its_bound_reports_only_the_rerun(monkeypatch):
    """A case compared within the cross-ISA bound whose first run is within it (one element one
    bf16 step off the capture, the bound 1.0 everywhere) but whose second run differs from the
    first is 'different', and the detail is the rerun's alone ('a rerun gave other bytes ...'):
    the within-bound detail describes no failure and is dropped (a capture difference is kept
    only where the first run was itself 'different'). The kernel runs, the inputs and the bound
    are stubbed; only verify_entry's verdict assembly is pinned. Kills golden/verifying.py
    verify_entry's `detail and status == "different"` -> `or`."""
    from types import SimpleNamespace
    from pq2verify import checks
    from pq2verify.golden import verifying
    name = "test_a_nondeterministic_rerun_of_a_case_within_its_bound_reports_only_the_rerun"
    c = verifying.cases("interpreter", ["native"])[0]
    e = {k: getattr(c, k) for k in checks.Case.__dataclass_fields__}
    e.update(id=c.id, weight="w0")
    want = torch.zeros(c.m, c.n, dtype=checks.DTYPES[c.dtype])
    first, second = want.clone(), want.clone()
    first[0, 0] = 2.0 ** -8                       # one element off the capture: within a bound of 1.0
    second[0, 0] = 2.0 ** -7                      # the rerun differs from the first run
    runs = iter([first, second])
    monkeypatch.setattr(verifying, "changed_sources", lambda g, p: [])
    monkeypatch.setattr(verifying, "weight_for", lambda rc, data, device: None)
    monkeypatch.setattr(verifying, "comparison", lambda g, p, now: "bound (threads 1 -> 2)")
    monkeypatch.setattr(verifying, "run_case", lambda *a, **kw: next(runs))
    monkeypatch.setattr(verifying, "fold_bound", lambda p, rc, x, w, y, want: np.ones((c.m, c.n)))
    monkeypatch.setattr(verifying, "bits_conflict", lambda g, p: "")
    ins = SimpleNamespace(y=lambda e: want, x=lambda e: None, weight=lambda k: None, isa={})
    o = verifying.verify_entry(SimpleNamespace(manifest={"paths": {}}), ins, e, "cpu")
    assert o.status == "different", f"{o.status}: {o.detail}; {repro(name)}"
    assert o.detail.startswith("a rerun gave other bytes (not deterministic): "), f"{o.detail!r}; {repro(name)}"
    assert "bound" not in o.detail, f"the within-bound detail was kept: {o.detail!r}; {repro(name)}"


# --- golden: the ISA key reads the first processor's block only -------------------------------
def _cpu_of(monkeypatch, text: str) -> tuple:
    """isakey._cpu() with /proc/cpuinfo reading `text`."""
    import builtins
    import io
    from pq2verify.golden import isakey

    def fake(path, *a, **kw):
        return io.StringIO(text) if path == "/proc/cpuinfo" else builtins.open(path, *a, **kw)
    monkeypatch.setattr(isakey, "open", fake, raising=False)
    return isakey._cpu()


def test_a_first_processor_block_without_a_vendor_leaves_the_vendor_unknown(monkeypatch):
    """/proc/cpuinfo holds one block per processor, separated by a blank line; the key is the
    first processor's. A first block with flags but no vendor line ends at its blank line once
    anything was read, so the vendor stays 'unknown' (and makes the key incomplete), never the
    second processor's vendor_id: ('unknown', 'avx'). Kills golden/isakey.py _cpu's
    `vendor != 'unknown' or flags is not None` -> `and` (which reads on into processor 1)."""
    got = _cpu_of(monkeypatch, "processor\t: 0\nflags\t\t: fpu avx\n\n"
                               "processor\t: 1\nvendor_id\t: GenuineIntel\nflags\t\t: fpu avx avx2\n")
    assert got == ("unknown", "avx"), (
        f"{got}; {repro('test_a_first_processor_block_without_a_vendor_leaves_the_vendor_unknown')}")


def test_a_first_processor_block_without_flags_leaves_the_flags_unknown(monkeypatch):
    """The mirror case: a first block with a vendor_id but no flags line ends at its blank line,
    so the flags stay 'unknown' (not the second processor's, and not read off another line of
    the block such as 'processor: 0'): ('GenuineIntel', 'unknown'). Kills golden/isakey.py _cpu's
    `vendor != 'unknown'` -> `==` (reads on into processor 1) and `k in (...) and flags is None`
    -> `or` (takes 'processor: 0' for the flags, giving '')."""
    got = _cpu_of(monkeypatch, "processor\t: 0\nvendor_id\t: GenuineIntel\n\n"
                               "processor\t: 1\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu avx avx2\n")
    assert got == ("GenuineIntel", "unknown"), (
        f"{got}; {repro('test_a_first_processor_block_without_flags_leaves_the_flags_unknown')}")


# --- golden: the commands a message prints -------------------------------------------------------
@pytest.mark.parametrize("key, dev", [("interpreter", "cpu"), ("sm90", "cuda")])
def test_capture_and_verify_hints_without_a_folder_name_the_default_one(key, dev):
    """With no folder (d=None) the hints are the default capture's commands: no --dir (the
    default needs none, and 'None' is no folder), no --model unless asked for, --paths only
    when paths are given; the device is cpu for the interpreter and cuda for a GPU key. Kills
    golden/store.py capture_hint's default `model=False` -> `True`, its `d is None or ...` ->
    `and` (prints --dir None), and repro's `d is None or ...` -> `and`."""
    from pq2verify.golden import store
    name = f"test_capture_and_verify_hints_without_a_folder_name_the_default_one[{key}-{dev}]"
    assert store.capture_hint(key) == f"./pq2 --device {dev} golden capture", repro(name)
    assert store.capture_hint(key, ["native", "mmq"]) == f"./pq2 --device {dev} golden capture --paths native,mmq", \
        repro(name)
    assert store.capture_hint(key, model=True) == f"./pq2 --device {dev} golden capture --model", repro(name)
    assert store.repro(key, "c0") == f"./pq2 --device {dev} golden verify --case 'c0'", repro(name)


def test_capture_and_verify_hints_for_another_folder_name_it(tmp_path):
    """For a folder other than the backend's default capture the hints add --dir <folder>
    (the command must make or verify that folder, not golden/<key>). Kills golden/store.py
    capture_hint's `d is None` -> `d is not None` (drops the --dir)."""
    from pq2verify.golden import store
    name = "test_capture_and_verify_hints_for_another_folder_name_it"
    d = tmp_path / "elsewhere"
    assert store.capture_hint("interpreter", ["native"], d) == \
        f"./pq2 --device cpu golden capture --paths native --dir {d}", repro(name)
    assert store.repro("interpreter", "c0", d) == f"./pq2 --device cpu golden verify --dir {d} --case 'c0'", repro(name)


def test_an_inputs_file_read_by_a_case_without_an_x_hash_names_every_case(tmp_path):
    """damaged_cases on the inputs file: case 'a' records x's sha256 (and it matches), case
    'b' (format 1) records none. No case is provably damaged, but b's activations cannot be
    checked, so every case reading the file is named: ['a', 'b'] (a capture whose damage
    cannot be located names all its readers, never none). The sha256 is computed here with
    hashlib over the tensor's raw bytes. Kills golden/store.py damaged_cases' `not bad and
    any(...)` -> `bad and any(...)` and `any` -> `all`."""
    import hashlib
    from safetensors.torch import save_file
    from pq2verify.golden import store
    xa, xb = torch.arange(4, dtype=torch.float32), torch.ones(4, dtype=torch.float32)
    save_file({"xa": xa, "xb": xb}, str(tmp_path / store.INPUTS))
    case = dict(file="y.safetensors", weight="w0", y_sha256="0" * 64)
    man = {"cases": [dict(case, id="a", x="xa", x_sha256=hashlib.sha256(xa.numpy().tobytes()).hexdigest()),
                     dict(case, id="b", x="xb")],
           "weights": {"w0": {"stored": False, "seed": 1, "sha256": "0" * 64}}}
    got = store.damaged_cases(tmp_path, man, store.INPUTS)
    assert got == ["a", "b"], f"{got}; {repro('test_an_inputs_file_read_by_a_case_without_an_x_hash_names_every_case')}"


# --- golden: a manifest whose cases or records lack fields is refused at load ------------------
def _manifest(tmp_path, man: dict):
    import json
    from pq2verify.golden import store
    d = tmp_path / "interpreter"
    d.mkdir()
    (d / store.MANIFEST).write_text(json.dumps(man))
    return d


@pytest.mark.parametrize("bad", ["no-y_sha256", "int"])
def test_a_case_lacking_a_field_or_not_a_mapping_is_refused(bad, tmp_path):
    """A format-2 case manifest (no tensor files) whose one case lacks 'y_sha256', or is the
    number 5 instead of a mapping, is damaged: load raises GoldenIntegrityError naming case 0
    and what it lacks (never passes, never a TypeError or KeyError later). Kills golden/store.py
    _check_schema's `not isinstance(e, dict) or k not in e` -> `and`."""
    from pq2verify import checks
    from pq2verify.golden import store
    case = {k: 0 for k in checks.Case.__dataclass_fields__}
    case.update(id="c0", file="y.safetensors", x="x0", weight="w0")     # no y_sha256
    man = {"format": 2, "backend_key": "interpreter", "files": {"y.safetensors": "0" * 64},
           "cases": [case if bad == "no-y_sha256" else 5], "paths": {}, "weights": {}}
    d = _manifest(tmp_path, man)
    with pytest.raises(store.GoldenIntegrityError, match="case 0 .* lacks .*y_sha256"):
        store.load(d)
        pytest.fail(f"a case {bad} loaded; "
                    f"{repro(f'test_a_case_lacking_a_field_or_not_a_mapping_is_refused[{bad}]')}")


@pytest.mark.parametrize("bad", ["no-position", "int"])
def test_a_model_record_lacking_a_field_or_not_a_mapping_is_refused(bad, tmp_path):
    """A model manifest whose one record lacks 'position' (or is the number 5) is damaged:
    load raises GoldenIntegrityError naming record 0 and what it lacks. Kills golden/store.py
    _check_schema's `not isinstance(r, dict) or k not in r` -> `and`."""
    from pq2verify.golden import store
    rec = {"key": "k0", "layer": 0, "path": "native", "weight_sha256": "0" * 64, "y_sha256": "0" * 64}
    man = {"format": 2, "kind": "model", "backend_key": "interpreter", "files": {}, "cases": [],
           "records": [rec if bad == "no-position" else 5]}
    d = _manifest(tmp_path, man)
    with pytest.raises(store.GoldenIntegrityError, match="record 0 lacks .*position"):
        store.load(d)
        pytest.fail(f"a record {bad} loaded; "
                    f"{repro(f'test_a_model_record_lacking_a_field_or_not_a_mapping_is_refused[{bad}]')}")


def test_a_file_off_its_hash_names_both_hashes_by_16_hex_digits(tmp_path):
    """A listed file whose bytes hash to other than the manifest's sha256 is refused at load,
    the message naming both hashes by their first 16 hex digits and an ellipsis (the file's,
    computed here with hashlib over b'abc', and the manifest's '0' * 64). Kills golden/store.py
    load's `got[:16]` and `want[:16]` -> `[:17]`."""
    import hashlib
    from pq2verify.golden import store
    man = {"format": 2, "backend_key": "interpreter", "files": {"y.safetensors": "0" * 64}, "cases": [],
           "paths": {}, "weights": {}}
    d = _manifest(tmp_path, man)
    (d / "y.safetensors").write_bytes(b"abc")
    got = hashlib.sha256(b"abc").hexdigest()
    with pytest.raises(store.GoldenIntegrityError) as ex:
        store.load(d)
    want = f"sha256 {got[:16]}… does not match the manifest's {'0' * 16}… "
    assert want in str(ex.value), (
        f"{str(ex.value)!r} lacks {want!r}; {repro('test_a_file_off_its_hash_names_both_hashes_by_16_hex_digits')}")
