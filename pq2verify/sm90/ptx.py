"""What a PDL-launched kernel touches before it waits, read from its PTX.

A kernel launched with programmatic dependent launch may start while the previous kernel in
the stream still runs; until `griddepcontrol.wait` it may only read memory no earlier kernel
writes (the weights, by the contract in kernels/gemv.py) and may write nothing. On a GPU a
violation shows only when the two grids happen to overlap; in the PTX it is certain.

`before_wait` follows every register back to the kernel parameters it was computed from, over
the straight-line code before the first wait (conservatively: in an inline-asm block `{...}`
every register takes the union of the block's), and reports each global memory access there
whose address comes from a parameter outside `allowed`, and each global write or atomic there
at all. The wait must be reached on every path: a branch, call, return or exit before it, or a
guarded (predicated) wait, is itself a violation (a wait taken only in some configs or
programs, e.g. only when the kernel splits, would otherwise prove nothing for the others)."""
import re

_PARAM = re.compile(r"\[(\w+_param_(\d+))\]")
_REG = re.compile(r"%[a-z]+\d+")
_GUARD = re.compile(r"^@!?%p\d+\s+")
_LOADS = ("ld.global", "ld.volatile.global", "cp.async", "prefetch.global")
_WRITES = ("st.global", "st.volatile.global", "atom.", "red.", "multimem.", "cp.reduce", "st.async")
_FLOW = re.compile(r"^(?:bra|brx|call|ret|exit)\b")


def statements(ptx: str, entry: str) -> list[str]:
    """The body of .entry `entry` as statements, without comments, directives and labels; an
    inline-asm block (between LLVM's begin/end markers, or one `{...}` line) is one statement
    in braces."""
    start = ptx.index(f".entry {entry}(")
    out, block = [], None
    for raw in ptx[ptx.index("\n{", start) + 2:].splitlines():
        if "begin inline asm" in raw:
            block = []
            continue
        if "end inline asm" in raw:
            out.append("{" + "; ".join(block) + "}")
            block = None
            continue
        line = raw.split("//")[0].strip()
        if line == "}":
            break
        if not line or line.startswith(".") or line.endswith(":"):
            continue
        (out if block is None else block).append(line.rstrip(";"))
    return out


def _addresses(stmt: str) -> list[str]:
    """The 64-bit registers inside [ ] (global addresses; shared ones are 32-bit)."""
    return [r for grp in re.findall(r"\[([^\]]*)\]", stmt) for r in _REG.findall(grp) if r.startswith("%rd")]


def before_wait(ptx: str, entry: str, params: list[str], allowed: set[str]) -> list[str]:
    """Violations (one line each) in .entry `entry` before its first griddepcontrol.wait;
    params: the kernel's parameter names in PTX order (param_i is params[i]). A kernel with no
    wait at all is itself a violation."""
    taint: dict[str, set[str]] = {}
    bad = []

    def of(regs):
        return set().union(*(taint.get(r, set()) for r in regs))
    for stmt in statements(ptx, entry):
        parts = [x.strip() for x in stmt.strip("{} ").split(";") if x.strip()] if stmt.startswith("{") else [stmt]
        waits = [x for x in parts if "griddepcontrol.wait" in x]
        if waits:
            if any(_GUARD.match(x) for x in waits):
                return bad + [f"{entry}: griddepcontrol.wait is predicated, so some threads may skip it: {stmt}"]
            return bad
        s = _GUARD.sub("", stmt)
        if s.startswith("{"):
            # inline asm: its statements, if any touch global memory, judged one by one
            inner = [_GUARD.sub("", x) for x in parts]
            for x in inner:
                bad += _judge(x, of, allowed)
            regs = _REG.findall(s)
            t = of(regs)
            for r in regs:
                taint[r] = t
            continue
        bad += _judge(s, of, allowed)
        regs = _REG.findall(s)
        if not regs or s.startswith(_LOADS + _WRITES):
            continue
        t = of(regs[1:])
        m = _PARAM.search(s)
        if m:
            t = t | {params[int(m.group(2))]}
        taint[regs[0]] = t
    return bad + [f"{entry}: no griddepcontrol.wait"]


def _judge(stmt: str, of, allowed: set[str]) -> list[str]:
    if _FLOW.match(stmt):
        return [f"control flow before griddepcontrol.wait (the wait may be skipped on some path): {stmt}"]
    if stmt.startswith(_WRITES):
        return [f"global write before griddepcontrol.wait (address from {sorted(of(_addresses(stmt))) or 'no parameter'}): {stmt}"]
    if stmt.startswith(_LOADS):
        from_ = of(_addresses(stmt))
        if from_ - allowed:
            return [f"global read of {sorted(from_ - allowed)} before griddepcontrol.wait: {stmt}"]
    return []
