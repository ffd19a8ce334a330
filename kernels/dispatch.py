"""pq2_matmul: pick the kernel set's path for (weight, M), validate, launch, and record which
path served the call, so that a run can prove which code executed."""
import functools
import os
from collections import Counter
from contextlib import contextmanager

import torch

from . import backend, kernelsets, registry
from . import validate as _check
from .weights import PQ2Weight

ENV_SET = "PQ2_KERNELS"
_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")
# Every other PQ2_* variable the project reads (the emulation's GEMM, the tests' device and bench
# Ms, the ./pq2 script's venv); with PQ2_KERNELS and the PQ2_PATH_<NAME> switches of the
# registry's paths these are all there are: any other PQ2_* name is a typo and refused.
OTHER_VARS = ("PQ2_EMULATE_GEMM", "PQ2_DEVICE", "PQ2_BENCH_M", "PQ2_VENV")

TRACE: Counter = Counter()       # every call since import, per path name
_traces: list[Counter] = []      # open trace() contexts


@contextmanager
def trace():
    """Counts calls per path inside the block: `with trace() as t: ...; t['single']`."""
    c = Counter()
    _traces.append(c)
    try:
        yield c
    finally:
        # by identity: Counters compare by content, and nested traces can hold equal counts
        _traces[:] = [t for t in _traces if t is not c]


def count(name: str, n: int = 1) -> None:
    """Record n calls served by path `name` (pq2_matmul does for each call; a replayed CUDA
    graph of such calls does for the calls it holds)."""
    TRACE[name] += n
    for c in _traces:
        c[name] += n


def kernel_set(kernels: str | None = None) -> str:
    kset = kernels if kernels is not None else os.environ.get(ENV_SET, "tuned")
    return kernelsets.check_name(kset, "kernels=" if kernels is not None else f"{ENV_SET}=")


def switches() -> dict[str, bool]:
    """Per-path environment switches PQ2_PATH_<NAME>=on|off (unset: follow the set; an empty
    value is an error, not unset)."""
    for k in os.environ:
        # the names are exact: a PQ2_PATH_single would otherwise be read by nothing
        if k.upper().startswith("PQ2_PATH_"):
            p = registry.BY_NAME.get(k[9:].lower())
            if p is None:
                raise ValueError(f"{k}: no such path; known paths: {', '.join(registry.BY_NAME)}")
            if k != p.env:
                raise ValueError(f"{k}: switch names are upper case; use {p.env}")
    out = {}
    for p in registry.BY_NAME.values():
        v = os.environ.get(p.env)
        if v is None:
            continue
        s = v.strip().lower()
        if s in _ON:
            out[p.name] = True
        elif s in _OFF:
            out[p.name] = False
        else:
            raise ValueError(f"{p.env}={v!r}: expected on or off" + (" (an empty value is not 'unset': unset the "
                                                                      "variable to follow the kernel set)" if not s else ""))
    return out


def known_vars() -> list[str]:
    """Every PQ2_* variable name the project reads."""
    return [ENV_SET, *(p.env for p in registry.BY_NAME.values()), *OTHER_VARS]


def validate_env() -> None:
    """Every PQ2_* variable is one the project reads, with a valid value (the CLI calls this
    before any work; pq2_matmul once per change of the environment): raise ValueError naming
    the variable otherwise. A typo'd name (PQ2_KERNEL, PQ2_PATHS_SINGLE) would be read by
    nothing and silently change nothing; an empty value is not 'unset'."""
    import difflib
    known = known_vars()
    for k in os.environ:
        u = k.upper()
        if not u.startswith("PQ2_") or k in known:
            continue
        if u == ENV_SET:
            raise ValueError(f"{k}: the variable is {ENV_SET} (upper case)")
        if u.startswith("PQ2_PATH_"):
            switches()      # names the path or the upper-case spelling
        near = difflib.get_close_matches(u, known, n=1, cutoff=0.75)
        hint = f"did you mean {near[0]}? " if near else ""
        raise ValueError(f"{k}: not a variable pq2verify reads; {hint}known: {', '.join(known)}")
    for k in (ENV_SET, "PQ2_EMULATE_GEMM"):
        if os.environ.get(k) == "":
            raise ValueError(f"{k}='': an empty value; set a value or unset the variable")
    kernel_set()
    switches()


def backend_key(device: torch.device) -> str:
    """The backend key of tensors on `device` (pq2verify.backend.key decides it)."""
    return backend.key(device)


def candidates(kset: str, weight_kind: str, key: str, shape: tuple | None = None) -> list[registry.Path]:
    """shape (n, k, m): the call's, for the exact set's per-shape fold check (kernelsets.members)."""
    sw = switches()
    chosen = kernelsets.members(kset, key, weight=weight_kind, shape=shape)
    # on: preferred over the set's own choice (an A/B can route through any path); off: never
    forced = [p for p in registry.paths(weight=weight_kind) if sw.get(p.name)]
    return forced + [p for p in chosen if p not in forced and sw.get(p.name, True)]


_resolved: dict = {}


def clear_cache() -> None:
    """Forget resolved paths (after the exact set was re-derived, or in tests)."""
    _resolved.clear()


try:   # CPython keeps the environment as an encoded dict: reading it skips the decoding
    _ENV_RAW = os.environ._data
    _PQ2 = tuple(os.environ.encodekey(p) for p in ("PQ2_", "Pq2_", "pQ2_", "pq2_"))
except AttributeError:
    _ENV_RAW = None
# the last validated environment: (every variable's name, joined; the PQ2_* names in it; their
# values; the registry's size) and the key it gave
_env_seen: tuple = (None, (), (), 0)
_env_last: tuple = ()


def env_key() -> tuple:
    """The PQ2_* variables as sorted (name, value) pairs, validated (validate_env): a cache key
    for what the path choice reads (resolve's, and the GSM8K runner's graph keys). A typo'd
    name or a bad value raises on every call until it is fixed.

    The hot path compares, not rescans: the names of all variables joined (any name added or
    removed changes it, whatever the count), and the values of the PQ2_* names among them."""
    global _env_seen, _env_last
    if _ENV_RAW is None:
        validate_env()
        return tuple(sorted((k, v) for k, v in os.environ.items() if k.upper().startswith("PQ2_")))
    names, pq2, vals, nreg = _env_seen
    raw = _ENV_RAW
    if b"\0".join(raw) == names and nreg == len(registry.BY_NAME) and tuple([raw[k] for k in pq2]) == vals:
        return _env_last
    names = b"\0".join(raw)
    pq2 = tuple(k for k in raw if k.startswith(_PQ2))
    vals = tuple([raw[k] for k in pq2])
    validate_env()          # raises: nothing is remembered, so the next call checks again
    _env_last = tuple(sorted((os.fsdecode(k), os.fsdecode(v)) for k, v in zip(pq2, vals)))
    _env_seen = (names, pq2, vals, len(registry.BY_NAME))
    return _env_last


@functools.lru_cache(maxsize=1024)
def _serves(m: int) -> tuple:
    return tuple(p.serves(m) for p in registry.PATHS)


def resolve(m: int, w, x: torch.Tensor, kset: str) -> registry.Path:
    """The set's path for this call. Cached by everything the choice depends on (shapes,
    dtype, layout, device, the M ranges it falls in, the switches), never by a data pointer."""
    kind = "dense" if isinstance(w, torch.Tensor) else "pq2"
    layout = "dense" if kind == "dense" else w.layout
    k = x.shape[-1]
    # exact: its paths are proven per (n, k, m) (their fold orders must match there)
    shape = ((w.shape[0] if kind == "dense" else w.n), k, m) if kset == "exact" else None
    key = (kset, kind, layout, x.dtype, k, x.device, _serves(m), env_key(), shape)
    p = _resolved.get(key)
    if p is None:
        for p in candidates(kset, kind, backend_key(x.device), shape):
            if _check.unfit(p, m, x, w) is None:
                break
        else:
            raise ValueError(f"no path of kernel set {kset!r} serves M={m}, dtype={x.dtype}, layout={layout}")
        _resolved[key] = p
    return p


def validate(x, w) -> None:
    """The bad-input contract (pq2verify.validate): raise naming the argument and what was
    expected. Shapes, dtypes and devices only; a PQ2Weight's code-3 check runs once per weight."""
    _check.activations(x, rank2=False)
    _check.weight(x, w)


def pq2_matmul(x, w, *, kernels=None, path=None):
    """y[..., n] = sum_k x[..., k] W[n, k] through the set's path for this M.

    x: [..., K] bf16/fp16 (leading dims are flattened into M; a row stride is fine, a
    non-unit stride along K is copied). w: PQ2Weight (raw or prepared) or a dense matrix.
    kernels: 'legacy' | 'exact' | 'tuned' (default: $PQ2_KERNELS or 'tuned').
    path: force one registry path (an M outside its range is an error; M = 0 is empty).
    Bad input raises before any launch, naming the argument (policies: pq2verify.validate).
    The PQ2_* environment is validated once per change of it (dispatch.validate_env): a
    typo'd variable (PQ2_KERNEL=legacy) raises instead of running the default set.
    """
    env_key()               # the environment validated, once per change of it
    validate(x, w)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    n = w.n if isinstance(w, PQ2Weight) else w.shape[0]
    kset = kernel_set(kernels)
    if path is not None:
        p = registry.get(path)
        _check.path_fits(p, m, x2, w, arg=f"path={path!r}")
    else:
        p = resolve(max(m, 1), w, x2, kset)
    if m == 0:
        return x.new_empty(*lead, n)
    count(p.name)
    if x2.device.type == "cpu" and backend_key(x2.device) == "emulate":
        from .emulation import emulate
        y = emulate(p.name, x2, w)
    else:
        y = p.kernel()(x2, w, check=False)
    return y.reshape(*lead, n)
