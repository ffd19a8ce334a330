"""Where a result came from: versions, commit, backend, GPU and its clocks."""
import datetime
import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def commit() -> str:
    """HEAD (+dirty) of this checkout. A sender that copies the work tree to another machine
    names the commit in PQ2VERIFY_COMMIT: that wins (marked as told), because a copied tree may
    carry a stale .git or none."""
    told = os.environ.get("PQ2VERIFY_COMMIT")
    if told:
        return f"{told} (told)"
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha + ("+dirty" if dirty else "") if sha else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def gpu_clocks() -> dict:
    """SM and memory clock (MHz), power (W) and temperature now, through NVML; {} without it."""
    try:
        import pynvml as nv
    except ImportError:
        return {}
    try:
        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(0)
        return {"sm_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                "mem_clock_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
                "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                "temp_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)}
    except Exception:  # NVML absent or refused: provenance then says so by omission
        return {}


def collect(status: bool = True) -> dict:
    """status: add "backend_status", what this backend lacks of its own records
    (backend_status.status; its "missing" is empty when nothing is). A record that is itself
    one of those files (derive's) leaves it out: it would describe the state before it."""
    import torch
    import triton
    from kernels import backend
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit(), "backend": backend.name(), "torch": torch.__version__,
            "triton": triton.__version__, "python": platform.python_version(), "host": platform.node()}
    if backend.device() == "cuda":
        info["cuda"] = torch.version.cuda
        info.update(gpu_clocks())
    if status:
        from . import backend_status
        info["backend_status"] = backend_status.status()
    return info


def flat(info: dict) -> dict:
    """The provenance items a report prints as `key: value` (the backend status is a record of
    its own, printed as its own line: `status_line`)."""
    return {k: v for k, v in info.items() if k != "backend_status"}


def status_line(info: dict) -> str | None:
    """The report line that says what this result's backend lacked of its own records, or None."""
    from . import backend_status
    return backend_status.line(info.get("backend_status"))


def markdown_lines(info: dict) -> list[str]:
    """A provenance record as Markdown lines: its items, then the backend warning if any."""
    warn = status_line(info)
    return ["- " + ", ".join(f"{k}: {v}" for k, v in flat(info).items())] + ([f"- {warn}"] if warn else [])


def status_once(infos: list[dict]) -> list[dict]:
    """Provenance records of one report (a sharded run's), each backend warning kept only the
    first time it appears, so N shards of one backend give one line, not N."""
    seen, out = [], []
    for info in infos:
        st = info.get("backend_status") if isinstance(info, dict) else None
        if st is not None and st in seen:
            info = flat(info)
        elif st is not None:
            seen.append(st)
        out.append(info)
    return out
