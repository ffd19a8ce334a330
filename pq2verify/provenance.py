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


def collect() -> dict:
    import torch
    import triton
    from . import backend
    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit(), "backend": backend.name(), "torch": torch.__version__,
            "triton": triton.__version__, "python": platform.python_version(), "host": platform.node()}
    if backend.device() == "cuda":
        info["cuda"] = torch.version.cuda
        info.update(gpu_clocks())
    return info
