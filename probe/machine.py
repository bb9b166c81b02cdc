"""What the probe worker reports about itself, with every result and in its heartbeat."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from typing import Any


def _sysctl(name: str) -> str | None:
    try:
        out = subprocess.run(
            ["sysctl", "-n", name], capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _linux_cpu() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _memory_bytes() -> int | None:
    if platform.system() == "Darwin":
        value = _sysctl("hw.memsize")
        return int(value) if value and value.isdigit() else None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _mlx_device() -> str | None:
    # Importing mlx is what the worker does anyway; the main side never calls this.
    try:
        import mlx.core as mx

        return str(mx.default_device())
    except Exception:  # a broken mlx install is itself worth reporting
        return None


def describe_machine() -> dict[str, Any]:
    """Chip, memory, OS, and the mlx / mlx-lm versions, as plain JSON values."""
    darwin = platform.system() == "Darwin"
    chip = _sysctl("machdep.cpu.brand_string") if darwin else _linux_cpu()
    os_name = f"macOS {platform.mac_ver()[0]}" if darwin else platform.platform()
    return {
        "chip": chip or platform.processor() or platform.machine(),
        "arch": platform.machine(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "os": os_name,
        "python": platform.python_version(),
        "mlx": _version("mlx"),
        "mlx_lm": _version("mlx-lm"),
        "mlx_device": _mlx_device(),
    }
