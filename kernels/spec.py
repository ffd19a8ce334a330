"""KernelSpec: which kernel set runs and which per-path switches apply, as one explicit value.

The environment's meaning (PQ2_KERNELS=legacy|exact|tuned, PQ2_PATH_<NAME>=on|off) is read into
a KernelSpec at the entry point (`KernelSpec.from_env()`, validated, once per change of the
environment); an A/B runs each side inside `with kernels.use(spec):` instead of rewriting
os.environ. Inside such a block dispatch follows the spec alone: the environment's own set and
switches do not apply (they would silently apply to both sides)."""
import contextlib
import os
from dataclasses import dataclass

from . import sets, table

ENV_SET = "PQ2_KERNELS"
_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")
# Every other PQ2_* variable the project reads (the emulation's GEMM, the tests' device and bench
# Ms, the ./pq2 script's venv); with PQ2_KERNELS and the PQ2_PATH_<NAME> switches of the
# table's paths these are all there are: any other PQ2_* name is a typo and refused.
OTHER_VARS = ("PQ2_EMULATE_GEMM", "PQ2_DEVICE", "PQ2_BENCH_M", "PQ2_VENV")


@dataclass(frozen=True)
class KernelSpec:
    kset: str = "tuned"
    switches: tuple = ()        # sorted (path name, on) pairs; a path not named follows the set

    def __post_init__(self):
        sets.check_name(self.kset, "kernel spec: set ")
        names = [n for n, _ in self.switches]
        for n, on in self.switches:
            table.get(n)
            if type(on) is not bool:
                raise ValueError(f"kernel spec: {n}={on!r}, expected True or False")
        if len(set(names)) != len(names):
            raise ValueError(f"kernel spec: a path switched twice in {self.switches!r}")
        object.__setattr__(self, "switches", tuple(sorted(self.switches)))

    @classmethod
    def of(cls, kset: str = "tuned", **switches: bool) -> "KernelSpec":
        """KernelSpec.of('tuned', small_mma=False)."""
        return cls(kset, tuple(switches.items()))

    @classmethod
    def from_env(cls, environ=None) -> "KernelSpec":
        """The spec PQ2_KERNELS and the PQ2_PATH_<NAME> switches of `environ` (default
        os.environ) say; ValueError naming the variable for a bad one."""
        env = os.environ if environ is None else environ
        return cls(kernel_set_env(env), tuple(env_switches(env).items()))

    def switch_map(self) -> dict[str, bool]:
        return dict(self.switches)

    def text(self) -> str:
        return ",".join([self.kset] + [f"{n}={'on' if on else 'off'}" for n, on in self.switches])


def kernel_set_env(environ=None) -> str:
    env = os.environ if environ is None else environ
    return sets.check_name(env.get(ENV_SET, "tuned"), f"{ENV_SET}=")


def env_switches(environ=None) -> dict[str, bool]:
    """Per-path environment switches PQ2_PATH_<NAME>=on|off (unset: follow the set; an empty
    value is an error, not unset)."""
    env = os.environ if environ is None else environ
    known = table.by_name()
    for k in env:
        # the names are exact: a PQ2_PATH_single would otherwise be read by nothing
        if k.upper().startswith("PQ2_PATH_"):
            p = known.get(k[9:].lower())
            if p is None:
                raise ValueError(f"{k}: no such path; known paths: {', '.join(known)}")
            if k != p.env:
                raise ValueError(f"{k}: switch names are upper case; use {p.env}")
    out = {}
    for p in known.values():
        v = env.get(p.env)
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


# Process-wide, as the environment it stands in for is (threads a block starts follow it too).
_stack: list = []


def active() -> KernelSpec | None:
    """The spec of the innermost open `use` block, or None (the environment's)."""
    return _stack[-1] if _stack else None


@contextlib.contextmanager
def use(spec: KernelSpec):
    """Dispatch follows `spec` inside the block, whatever the environment's PQ2_KERNELS and
    PQ2_PATH_* say; restored after, nested blocks included."""
    if not isinstance(spec, KernelSpec):
        raise TypeError(f"kernels.use: expected a KernelSpec, got {type(spec).__name__}")
    stack = _stack
    stack.append(spec)
    try:
        yield spec
    finally:
        # by identity: equal specs can be nested
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is spec:
                del stack[i]
                break
