"""Run configurations, run directories and the crash-safe generations file.

A run's directory is keyed by a hash of everything that decides its generations (model and
digits, kernel spec, data and ids, prompt format and shots, decoding settings, backend), so a
rerun of the same command resumes it and a changed setting starts a new one.

generations.jsonl gets one line per question, appended and fsync'ed as soon as the question
stops. On restart the existing lines are read and finished ids are skipped; a damaged line (a
truncated last line from a crash mid-write, or one corrupted in the middle) is set aside in
generations.jsonl.damaged with a message, every intact record is kept, and only the questions
missing are generated again: nothing is lost or written twice.
"""
import hashlib
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from kernels.spec import KernelSpec, use

from kernels import sets as kernelsets
from .. import registry

ON, OFF = ("on", "1", "true", "yes"), ("off", "0", "false", "no")


def parse_spec(spec: str) -> dict:
    """'tuned,small_mma=off' -> {'set': 'tuned', 'paths': {'small_mma': 'off'}}.
    An unknown set, path or switch value is an error."""
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise ValueError("kernel spec is empty; expected e.g. legacy, tuned or tuned,small_mma=off")
    kset, paths = "tuned", {}
    for i, p in enumerate(parts):
        if "=" not in p:
            if i != 0:
                raise ValueError(f"kernel spec {spec!r}: the set ({p!r}) must come first")
            kernelsets.check_name(p, f"kernel spec {spec!r}: set ")
            kset = p
            continue
        name, val = (s.strip().lower() for s in p.split("=", 1))
        if name not in registry.BY_NAME:
            raise ValueError(f"kernel spec {spec!r}: unknown path {name!r}; known: {', '.join(registry.BY_NAME)}")
        if val not in ON + OFF:
            raise ValueError(f"kernel spec {spec!r}: {name}={val!r}, expected on or off")
        if name in paths:
            raise ValueError(f"kernel spec {spec!r}: {name} given twice")
        paths[name] = "on" if val in ON else "off"
    return {"set": kset, "paths": dict(sorted(paths.items()))}


def spec_text(spec: dict) -> str:
    return ",".join([spec["set"]] + [f"{k}={v}" for k, v in spec["paths"].items()])


def spec_env(spec: dict) -> dict:
    """The environment a run's spec stands for: PQ2_KERNELS and only its own PQ2_PATH_* switches
    (what the run's records and a worker's command line say; the run itself uses kernel_spec)."""
    env = {"PQ2_KERNELS": spec["set"]}
    env.update({registry.get(k).env: v for k, v in spec["paths"].items()})
    return env


def kernel_spec(env: dict) -> KernelSpec:
    """The KernelSpec of a run's environment (spec_env): its set and only its own switches;
    PQ2_PATH_* variables inherited from the shell do not apply (they would silently apply to
    both runs)."""
    return KernelSpec.from_env(env)


def run_spec(spec: dict) -> KernelSpec:
    """The KernelSpec a parsed run spec ({'set', 'paths'}) runs under: `with use(run_spec(s)):`."""
    return kernel_spec(spec_env(spec))


class EnvSwitch:
    """Run a block under a run's kernel spec (spec_env's environment, as a KernelSpec through
    `kernels.use`): dispatch follows its set and its own switches alone; os.environ is not
    touched."""

    def __init__(self, env: dict):
        self.env = env
        self.spec = kernel_spec(env)
        self._use = None

    def __enter__(self):
        self._use = use(self.spec)
        self._use.__enter__()
        return self

    def __exit__(self, *exc):
        return self._use.__exit__(*exc)


RECORD_FIELDS = {"tokens": list, "topk": list, "text": str, "correct": bool, "invalid": bool, "strict_invalid": bool}


def _record(line: bytes) -> tuple[dict | None, str | None]:
    """(record, None), or (None, what is wrong with the line)."""
    try:
        rec = json.loads(line)
    except ValueError:
        return None, "not JSON"
    if not isinstance(rec, dict):
        return None, "not a JSON object"
    if not isinstance(rec.get("id"), int) or isinstance(rec.get("id"), bool) or rec["id"] < 0:
        return None, "no question id" if "id" not in rec else f"id {rec['id']!r} is not a question id"
    for k, t in RECORD_FIELDS.items():
        if not isinstance(rec.get(k), t):
            return None, f"question {rec['id']}: field {k!r} missing or not a {t.__name__}"
    return rec, None


@contextmanager
def _writes(path):
    """A failed write of a run's files is an outputs.WriteError (exit 3), not a traceback; what
    was written before it is kept, and a rerun resumes."""
    try:
        yield
    except OSError as e:
        from ..outputs import WriteError
        raise WriteError(f"--out {path}: could not write: {e.strerror or e}; the records written before "
                         "are kept: rerun the same command to resume") from None


def config_key(cfg: dict) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:12]


class RunDir:
    def __init__(self, root: Path, label: str, cfg: dict):
        self.cfg = cfg
        self.key = config_key(cfg)
        self.path = Path(root) / f"{label}-{self.key}"
        with _writes(self.path):
            self.path.mkdir(parents=True, exist_ok=True)
            (self.path / "config.json").write_text(json.dumps(cfg, indent=1, sort_keys=True) + "\n")
            self.file = self.path / "generations.jsonl"
            self.done: dict[int, dict] = self._recover()

    def _recover(self) -> dict[int, dict]:
        """Read finished lines. A damaged one (not JSON, no integer id, a field missing, or a
        last line cut short by a crash) is set aside, appended to generations.jsonl.damaged
        with a message; the intact records are all kept (the file rewritten without the damaged
        lines, atomically), and only the questions missing are generated again."""
        done = {}
        if not self.file.exists():
            return done
        data = self.file.read_bytes()
        lines = data.split(b"\n")
        tail = lines.pop()                                # after the last newline: b"" unless cut short
        keep, damaged = [], []
        for i, line in enumerate(lines, 1):
            rec, why = _record(line)
            if why:
                damaged.append((i, line, why))
                continue
            keep.append(line)
            done.setdefault(rec["id"], rec)
        if tail:
            damaged.append((len(lines) + 1, tail, "the last line was cut short (a write interrupted)"))
        if damaged:
            aside = self.file.with_name(self.file.name + ".damaged")
            with open(aside, "ab") as f:
                f.write(b"".join(line + b"\n" for _, line, _ in damaged))
                f.flush()
                os.fsync(f.fileno())
            tmp = self.file.with_name(f".{self.file.name}.tmp")
            with open(tmp, "wb") as f:
                f.write(b"".join(line + b"\n" for line in keep))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.file)
            what = "; ".join(f"line {i}: {why}" for i, _, why in damaged[:5]) + (" ..." if len(damaged) > 5 else "")
            print(f"pq2verify gsm8k: {self.file}: {len(damaged)} damaged line(s) set aside in {aside} ({what}); "
                  f"{len(keep)} intact record(s) kept; the questions missing are generated again", file=sys.stderr)
        return done

    def append(self, rec: dict) -> bool:
        """Write one question's line durably; False (and nothing written) if already done."""
        if rec["id"] in self.done:
            return False
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        with _writes(self.file), open(self.file, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        self.done[rec["id"]] = rec
        return True

    def write_json(self, name: str, obj) -> None:
        """Atomic replace, so a crash leaves the old or the new file, never half of one."""
        tmp = self.path / f".{name}.tmp"
        with _writes(self.path / name):
            tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
            os.replace(tmp, self.path / name)

    def read_json(self, name: str, default=None):
        """The file's object, or `default` where there is none. A damaged one (not JSON, or
        without the default's keys) is set aside as NAME.damaged with a message: the ledger's
        batches are then replayed, the questions already written kept."""
        f = self.path / name
        if not f.exists():
            return default
        try:
            obj = json.loads(f.read_text())
            ok = not isinstance(default, dict) or (isinstance(obj, dict) and all(
                isinstance(obj.get(k), type(v)) for k, v in default.items() if v is not None))
        except (ValueError, UnicodeDecodeError):
            ok = False
        if ok:
            return obj
        aside = f.with_name(name + ".damaged")
        with _writes(aside):
            os.replace(f, aside)
        print(f"pq2verify gsm8k: {f}: damaged, set aside as {aside}; its batches are replayed "
              "(the questions already written are kept)", file=sys.stderr)
        return default
