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
    """Per-path environment switches PQ2_PATH_<NAME>=on|off (unset: follow the set)."""
    for k in os.environ:
        # the names are exact: a PQ2_PATH_single would otherwise be read by nothing
        if k.upper().startswith("PQ2_PATH_"):
            p = registry.BY_NAME.get(k[9:].lower())
            if p is None:
                raise ValueError(f"{k}: no such path; known paths: {', '.join(registry.BY_NAME)}")
            if k != p.env:
                raise ValueError(f"{k}: switch names are upper case; use {p.env}")
    out = {}
    for p in registry.PATHS:
        v = os.environ.get(p.env)
        if v is None or v == "":
            continue
        s = v.strip().lower()
        if s in _ON:
            out[p.name] = True
        elif s in _OFF:
            out[p.name] = False
        else:
            raise ValueError(f"{p.env}={v!r}: expected on or off")
    return out


def validate_env() -> None:
    """Every PQ2_KERNELS / PQ2_PATH_* variable read by dispatch is valid (the CLI calls this
    before any work): raise ValueError naming the variable otherwise."""
    for k in os.environ:
        if k.upper() == ENV_SET and k != ENV_SET:
            raise ValueError(f"{k}: the variable is {ENV_SET} (upper case)")
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


_ENV_NAMES = (ENV_SET,) + tuple(p.env for p in registry.PATHS)
try:   # CPython keeps the environment as an encoded dict: reading it skips 9 encode/decode pairs
    _ENV_RAW, _ENV_KEYS = os.environ._data, tuple(os.environ.encodekey(n) for n in _ENV_NAMES)
except AttributeError:
    _ENV_RAW = None


def env_key() -> tuple:
    """What the path choice reads from the environment ($PQ2_KERNELS, every PQ2_PATH_* switch),
    as a cache key (resolve's, and the GSM8K runner's graph keys)."""
    # A new variable (a typo'd switch too) changes the count, so it is rescanned and refused.
    if _ENV_RAW is not None:
        return (len(_ENV_RAW),) + tuple(_ENV_RAW.get(k) for k in _ENV_KEYS)
    env = os.environ
    return (len(env),) + tuple(env.get(n) for n in _ENV_NAMES)


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
    """
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
