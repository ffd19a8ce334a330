"""Every config a path's chooser can pick, forced (docs/ADDING_A_PATH.md, "Configs"): the
interpreter's `configs(True)` and the GPU's `configs(False)` of each registry path's kernel file,
each run once through `run(..., config=)` on a small shape built from the config's own fields,
so that its tiles, split count and chunks really occur. Each run is judged like a case: relative
RMS and the per-element bound against the FP64 reference (checks.evaluate), split partials
poisoned with NaN and counted, and for integer paths the emulation's bytes under the config."""
import importlib
import inspect

import pytest

from kernels import splitk
from kernels import backend, emulation
from kernels.format import PQ2Weight
from pq2verify import cases, checks, registry
from pq2verify.bits import same_bits
from pq2verify.inputs import ACTIVATION_KINDS
from test_adding_a_path import rowdot  # noqa: F401,F811  (the fixture installing the documented example)

HERE = "tests/test_configs.py"
TILES = ("BM", "BN", "BK", "GB", "GC", "num_warps")      # powers of two by the protocol


def _mod(p):
    return importlib.import_module(p.module)


def _key(c: dict) -> tuple:
    return tuple(sorted(c.items()))


def _configs(p, modes=(True, False), same=_key) -> list[dict]:
    """configs(mode) for each interpreter mode, one of each `same` key; plus, for a True/False
    field, its other value forced into the first config where no config picks it (e.g. SWAP: a
    documented switch the choosers leave off)."""
    mod = _mod(p)
    out = {}
    for c in [c for mode in modes for c in mod.configs(mode)]:
        out.setdefault(same(c), c)
    base = list(out.values())
    for f in sorted({f for c in base for f, v in c.items() if type(v) is bool}):
        for v in (False, True):
            if not any(c[f] is v for c in base):
                # into the first config that takes it (gemv's FUSE needs SPLIT = 1)
                for c in ({**b, f: v} for b in base):
                    try:
                        _shape(p, c)
                    except (AssertionError, ValueError):
                        continue
                    out.setdefault(same(c), c)
                    break
                else:
                    raise AssertionError(f"{p.name}: no config of the chooser takes {f}={v}")
    return list(out.values())


def _label(c: dict) -> str:
    return "-".join(f"{f}{int(v) if type(v) is bool else v}" for f, v in c.items()) or "default"


def _shape(p, cfg: dict) -> tuple[int, int, int]:
    """(N, K, M) where the config's geometry occurs: every split full but the last, which lacks
    one group (or 128 columns of K); else 2 GB (or GC) + 1 groups (a ragged last step); N two
    tiles, the second ragged (one ragged tile where BN x groups is large: the interpreter's time
    goes as tile size x tiles x groups); M one past an M tile where the config and path allow,
    else one short of it."""
    if "groups_per_split" in cfg:
        per, s = cfg["groups_per_split"], cfg["SPLIT"]
        k = 128 * (s * per - (per > 1))
    elif "k_per_split" in cfg:
        kps, s = cfg["k_per_split"], cfg["SPLIT"]
        k = s * kps - (128 if kps > 128 else 0)
    else:
        k = 128 * (2 * cfg.get("GB", cfg.get("GC", 1)) + 1)
    bn = cfg.get("BN", 16)
    n = (2 if bn * k <= 4096 * 128 else 1) * bn - min(3, bn // 2)
    bm = cfg.get("BM")
    hi = p.m_max or 1 << 20
    for m in ([bm + 1, bm - 1, bm] if bm else [13]):
        m = min(max(m, p.m_min), hi)
        try:
            p.fold(n, k, m, interpret=True, config=cfg)
            return n, k, m
        except ValueError:
            continue
    raise AssertionError(f"{p.name}: no M in {p.m_range()} takes config {cfg} at N={n}, K={k}")


def _case(p, cfg: dict, i: int) -> cases.Case:
    """A seeded check case on _shape; dtype, layout and input kind rotate with i."""
    n, k, m = _shape(p, cfg)
    dts = [d for d in cases.DTYPES if cases.DTYPES[d] in p.dtypes]
    return cases.seeded(cases.Case(p.name, "forced", n, k, m, dts[i % len(dts)],
                                   p.layouts[(i // len(dts)) % len(p.layouts)],
                                   ACTIVATION_KINDS[i % len(ACTIVATION_KINDS)]))


def _protocol_gap(p) -> str:
    mod = _mod(p)
    for fn, args in (("config", ("n", "k", "m", "interpret")), ("configs", ("interpret",)),
                     ("fold", ("n", "k", "m", "interpret", "config")), ("run", ("config",))):
        f = getattr(mod, fn, None)
        if f is None or not set(args) <= set(inspect.signature(f).parameters):
            return f"{p.module} exports no {fn}({', '.join(args)}) (docs/ADDING_A_PATH.md, Configs)"
    return ""


def _geometry(c: dict) -> tuple:
    """The interpreter runs one program at a time: num_warps and num_stages change nothing there,
    so on the CPU configs equal but for them run once (a GPU runs each)."""
    return _key({f: v for f, v in c.items() if f not in ("num_warps", "num_stages")})


def _params():
    """The CPU suite forces both choosers' configs; a GPU the GPU chooser's only (the
    interpreter's wide tiles are never picked there, and some would not fit in registers)."""
    cpu = backend.device() == "cpu"
    for p in registry.PATHS:
        if _protocol_gap(p):
            yield pytest.param(p.name, None, 0, id=f"{p.name}-no-protocol")
            continue
        for i, c in enumerate(_configs(p, (True, False) if cpu else (False,), _geometry if cpu else _key)):
            yield pytest.param(p.name, c, i, id=f"{p.name}-{_label(c)}")


@pytest.mark.parametrize("path", [p.name for p in registry.PATHS])
def test_the_kernel_file_follows_the_config_protocol(path):
    p = registry.get(path)
    assert not _protocol_gap(p), _protocol_gap(p)
    mod = _mod(p)
    for interpret in (True, False):
        got = mod.configs(interpret)
        assert got and all(isinstance(c, dict) for c in got), f"{p.module}.configs({interpret}): {got!r}"
        n, k, m = _shape(p, got[0])
        fields = set(got[0])
        assert all(set(c) == fields for c in got), f"{p.module}.configs({interpret}): fields differ"
        assert set(mod.config(n, k, m, interpret)) == fields, f"{p.module}.config({n}, {k}, {m}, {interpret})"


def _force(p, cfg: dict, i: int, device, node: str) -> None:
    """Run path p under cfg on _case(p, cfg, i) and judge it (see the module docstring)."""
    c = _case(p, cfg, i)
    mod = _mod(p)
    calls = []

    def run(x, w, **kw):
        calls.append((x, w, mod.run(x, w, config=cfg, **kw)))
        return calls[-1][2]

    with splitk.poisoned() as handed:
        r = checks.evaluate(c, device, checks=("rms",), kernel=run)
    where = f"\n  forced config: {cfg}\n  reproduce: .venv/bin/python -m pytest -q --device {device} '{HERE}::{node}'"
    assert r.ok, r.message() + where
    split = cfg.get("SPLIT", 1)
    assert handed == ([split * c.m * c.n] if split > 1 else []), (
        f"{c.id}: SPLIT={split} forced but partials handed out were {handed}" + where)
    if device == "cpu" and p.weight == "pq2" and p.arithmetic == "integer":
        # the interpreter's bytes (on a GPU the fold may contract into an FMA)
        x, w, y = calls[0]
        want = emulation.emulate(p.name, x, w, config=cfg)
        assert same_bits(y, want), f"{c.id}: kernel bytes differ from the emulation's under the config" + where


@pytest.mark.parametrize("path,cfg,i", list(_params()))
def test_forced_config(path, cfg, i, device, request):
    p = registry.get(path)
    assert cfg is not None, _protocol_gap(p)
    _force(p, cfg, i, device, request.node.name)


def test_the_documented_example_follows_the_protocol(rowdot, device, request):
    """docs/ADDING_A_PATH.md's kernel file (installed by test_adding_a_path's fixture) passes
    the same protocol checks with no edit here."""
    assert not _protocol_gap(rowdot), _protocol_gap(rowdot)
    for i, cfg in enumerate(_configs(rowdot)):
        _force(rowdot, cfg, i, device, request.node.name)
    with pytest.raises(ValueError, match="config field BN=24: not a power of two"):
        rowdot.fold(64, 256, 2, config={"BN": 24})


def _split_path():
    """An integer path with a SPLIT field: the one the split tests force."""
    for p in registry.PATHS:
        if p.weight == "pq2" and p.arithmetic == "integer" and not _protocol_gap(p) and p.serves(1) \
                and "SPLIT" in _mod(p).config(64, 768, 1, True):
            return p
    pytest.skip("no registry path with a SPLIT field serves M=1")


def _forced_pair(p):
    """Config with SPLIT=2 (three groups a split) and one with SPLIT=1 covering the same six groups."""
    base = _mod(p).config(64, 768, 1, True)
    return {**base, "groups_per_split": 3, "SPLIT": 2}, {**base, "groups_per_split": 6, "SPLIT": 1}


def test_a_forced_split_really_runs(device):
    """Forcing changes what runs: SPLIT=2 hands out [2, M, N] partials and folds two group
    ranges, SPLIT=1 hands out none; both pass the per-element bound."""
    p = _split_path()
    two, one = _forced_pair(p)
    c = cases.seeded(cases.Case(p.name, "forced", 64, 768, 1, "fp16", p.layouts[-1], "heavy"))
    inp = checks.Inputs(c, device)
    for cfg, want in ((two, [2 * 64]), (one, [])):
        with splitk.poisoned() as handed:
            r = checks.evaluate(c, device, checks=("rms",), inp=inp,
                                kernel=lambda x, w, cfg=cfg, **kw: _mod(p).run(x, w, config=cfg, **kw))
        assert r.ok, r.message()
        assert handed == want, (cfg, handed)
    plans = [emulation.kernel_plan(p.name, 1, inp.w, config=cfg) for cfg in (two, one)]
    assert [len(plan) for plan in plans] == [2, 1]


def test_a_kernel_that_ignores_the_forced_config_fails(device, monkeypatch):
    """The forced-config check catches a run() that runs another config than the one forced
    (SPLIT=1 forced, SPLIT=2 run). Planted as that other config rather than as the kernel's own
    choice, which splits this shape on the interpreter but not on every GPU."""
    p = _split_path()
    mod = _mod(p)
    real = mod.run
    two, one = _forced_pair(p)
    monkeypatch.setattr(mod, "run", lambda x, w, *, config=None, **kw: real(x, w, config=two, **kw))
    with pytest.raises(AssertionError, match=r"SPLIT=1 forced but partials handed out were \[\d+\]"):
        _force(p, one, 0, device, "test_a_kernel_that_ignores_the_forced_config_fails")


def test_the_emulation_bytes_follow_the_forced_config(device):
    """The bytes comparison sees the forced config: on inputs whose FP32 fold order shows in
    bf16 bytes, the kernel under SPLIT=2 gives the emulation's bytes under SPLIT=2 and not
    those under SPLIT=1 (so a kernel or an emulation that ignored the config would fail).
    Group 4 cancels group 0 (same weights, activations negated and 2^16 times the others'):
    where the split falls decides which small groups are rounded against the large partial."""
    if device == "cuda":
        pytest.skip("the interpreter's bits: the GPU's fold may contract into an FMA")
    p = _split_path()
    two, one = _forced_pair(p)
    c = cases.seeded(cases.Case(p.name, "forced", 64, 768, 1, "bf16", p.layouts[-1], "normal"))
    inp = checks.Inputs(c, device)
    blocks = inp.w.to_raw().data.view(64, 6, 34).clone()       # raw: per row 6 x (scale, 32 code bytes)
    blocks[:, 4] = blocks[:, 0]
    w = PQ2Weight.from_raw(blocks.reshape(64, -1))
    w = w.to_prepared() if c.layout == "prepared" else w
    x = inp.x.clone()
    x[:, :128] *= 2.0 ** 16
    x[:, 512:640] = -x[:, :128]
    y = _mod(p).run(x, w, config=two)
    assert same_bits(y, emulation.emulate(p.name, x, w, config=two))
    assert not same_bits(y, emulation.emulate(p.name, x, w, config=one))


def _bad_configs(cfg: dict, k: int) -> list[tuple[object, str]]:
    """(config, pattern its ValueError must match): cfg with one field broken at a time."""
    bad = [({"NOPE": 1}, r"config field 'NOPE' unknown"), ("SPLIT=2", r"config must be a dict")]
    for f, v in cfg.items():
        if type(v) is bool:
            bad.append(({**cfg, f: 1}, rf"config field {f}=1: expected True or False"))
        elif f in TILES:
            bad.append(({**cfg, f: 3 * v}, rf"config field {f}={3 * v}: not a power of two"))
    for per, total in (("groups_per_split", k // 128), ("k_per_split", k)):
        if per in cfg:
            many = -(-total // cfg[per]) + 1
            bad.append(({**cfg, "SPLIT": many}, rf"config field SPLIT={many}: split {many - 1} would be empty"))
            bad.append(({**cfg, "SPLIT": 1}, rf"config field SPLIT=1: 1 x {per}={cfg[per]} covers {cfg[per]} of the {total}"))
    return bad


@pytest.mark.parametrize("path", [p.name for p in registry.PATHS])
def test_a_bad_forced_config_is_a_value_error_naming_the_field(path, device):
    p = registry.get(path)
    assert not _protocol_gap(p), _protocol_gap(p)
    cfgs = _mod(p).configs(True)
    cfg = next((c for c in cfgs if c.get("SPLIT", 1) > 1), cfgs[0])
    c = _case(p, cfg, 0)
    for bad, pattern in _bad_configs(cfg, c.k):
        with pytest.raises(ValueError, match=pattern):
            p.fold(c.n, c.k, c.m, interpret=True, config=bad)
    # run refuses before any launch (a launch would fill out)
    inp = checks.Inputs(c, device)
    out = inp.x.new_full((c.m, c.n), float("nan"))
    with pytest.raises(ValueError, match=r"config field 'NOPE' unknown"):
        _mod(p).run(inp.x, inp.w, out=out, config={"NOPE": 1})
    assert out.isnan().all()
