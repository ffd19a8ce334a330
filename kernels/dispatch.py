"""pq2_matmul: pick the kernel set's path for (weight, M), validate, launch, and record which
path served the call, so that a run can prove which code executed. The set and the per-path
switches come from the KernelSpec of an open `kernels.use(spec)` block, else from the
environment (kernels.spec: validated once per change of it)."""
import functools
import os
from collections import Counter
from contextlib import contextmanager

import torch

from . import backend, table
from . import sets as kernelsets
from . import spec as _spec
from . import validate as _check
from .format import PQ2Weight
from .spec import ENV_SET, OTHER_VARS, KernelSpec, use  # noqa: F401

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
    if kernels is not None:
        return kernelsets.check_name(kernels, "kernels=")
    a = _spec.active()
    return a.kset if a is not None else _spec.kernel_set_env()


def switches() -> dict[str, bool]:
    """Per-path switches: the open `use` block's spec's, else the environment's
    PQ2_PATH_<NAME>=on|off (unset: follow the set; an empty value is an error, not unset)."""
    a = _spec.active()
    return a.switch_map() if a is not None else _spec.env_switches()


def current_spec() -> KernelSpec:
    """The KernelSpec dispatch follows now: the open `use` block's, else the environment's."""
    a = _spec.active()
    return a if a is not None else KernelSpec.from_env()


def known_vars() -> list[str]:
    """Every PQ2_* variable name the project reads."""
    return [ENV_SET, *(p.env for p in table.by_name().values()), *OTHER_VARS]


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
            _spec.env_switches()      # names the path or the upper-case spelling
        near = difflib.get_close_matches(u, known, n=1, cutoff=0.75)
        hint = f"did you mean {near[0]}? " if near else ""
        raise ValueError(f"{k}: not a variable pq2verify reads; {hint}known: {', '.join(known)}")
    for k in (ENV_SET, "PQ2_EMULATE_GEMM"):
        if os.environ.get(k) == "":
            raise ValueError(f"{k}='': an empty value; set a value or unset the variable")
    _spec.kernel_set_env()
    _spec.env_switches()


def backend_key(device: torch.device) -> str:
    """The backend key of tensors on `device` (kernels.backend.key decides it)."""
    return backend.key(device)


def candidates(kset: str, weight_kind: str, key: str, shape: tuple | None = None) -> list[table.Entry]:
    """shape (n, k, m): the call's, for the exact set's per-shape fold check (kernelsets.members)."""
    sw = switches()
    chosen = kernelsets.members(kset, key, weight=weight_kind, shape=shape)
    # on: preferred over the set's own choice (an A/B can route through any path); off: never
    forced = [p for p in table.paths(weight=weight_kind) if sw.get(p.name)]
    return forced + [p for p in chosen if p not in forced and sw.get(p.name, True)]


_resolved: dict = {}


def clear_cache() -> None:
    """Forget resolved paths and the M ranges each path serves (after the exact set was
    re-derived, or a table changed in tests)."""
    _resolved.clear()
    _serves.cache_clear()


try:   # CPython keeps the environment as an encoded dict: reading it skips the decoding
    _ENV_RAW = os.environ._data
    _PQ2 = tuple(os.environ.encodekey(p) for p in ("PQ2_", "Pq2_", "pQ2_", "pq2_"))
except AttributeError:
    _ENV_RAW = None
# the last validated environment: (every variable's name, joined; the PQ2_* names in it; their
# values; the table's size) and the key it gave
_env_seen: tuple = (None, (), (), 0)
_env_last: tuple = ()


def env_key() -> tuple:
    """The PQ2_* variables as sorted (name, value) pairs, validated (validate_env), plus
    ("kernels.use", spec) inside a `use` block: a cache key for what the path choice reads
    (resolve's, and the GSM8K runner's graph keys). A typo'd name or a bad value raises on
    every call until it is fixed.

    The hot path compares, not rescans: the names of all variables joined (any name added or
    removed changes it, whatever the count), and the values of the PQ2_* names among them."""
    global _env_seen, _env_last
    if _ENV_RAW is None:
        validate_env()
        a = _spec.active()
        key = tuple(sorted((k, v) for k, v in os.environ.items() if k.upper().startswith("PQ2_")))
        return key if a is None else key + (("kernels.use", a),)
    names, pq2, vals, nreg = _env_seen
    raw = _ENV_RAW
    a = _spec.active()
    if b"\0".join(raw) == names and nreg == len(table.by_name()) and tuple([raw[k] for k in pq2]) == vals:
        return _env_last if a is None else _env_last + (("kernels.use", a),)
    names = b"\0".join(raw)
    pq2 = tuple(k for k in raw if k.startswith(_PQ2))
    vals = tuple([raw[k] for k in pq2])
    validate_env()          # raises: nothing is remembered, so the next call checks again
    _env_last = tuple(sorted((os.fsdecode(k), os.fsdecode(v)) for k, v in zip(pq2, vals)))
    _env_seen = (names, pq2, vals, len(table.by_name()))
    return _env_last if a is None else _env_last + (("kernels.use", a),)


@functools.lru_cache(maxsize=1024)
def _serves(m: int) -> tuple:
    return tuple(p.serves(m) for p in table.all_paths())


def resolve(m: int, w, x: torch.Tensor, kset: str) -> table.Entry:
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
    """The bad-input contract (kernels.validate): raise naming the argument and what was
    expected. Shapes, dtypes and devices only; a PQ2Weight's code-3 check runs once per weight."""
    _check.activations(x, rank2=False)
    _check.weight(x, w)


def pq2_matmul(x, w, *, kernels=None, path=None):
    """y[..., n] = sum_k x[..., k] W[n, k] through the set's path for this M.

    x: [..., K] bf16/fp16 (leading dims are flattened into M; a row stride is fine, a
    non-unit stride along K is copied). w: PQ2Weight (raw or prepared) or a dense matrix.
    kernels: 'legacy' | 'exact' | 'tuned' (default: $PQ2_KERNELS or 'tuned').
    path: force one table path (an M outside its range is an error; M = 0 is empty).
    Bad input raises before any launch, naming the argument (policies: kernels.validate).
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
        p = table.get(path)
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
