"""What machine a benchmark ran on, recorded next to every figure: the CPU model, whether it multiplies bf16
natively (AVX512-BF16 / AMX: bf16 is 2-3x faster there and ~15x slower elsewhere), cores and load."""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

# environment variables that make torch, MKL and oneDNN use a smaller instruction set than the CPU offers
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def cpu_info() -> dict:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    info = {"model": model or platform.processor(), "avx512_bf16": "avx512_bf16" in text,
            "amx_bf16": "amx_bf16" in text, "cores": os.cpu_count()}
    limits = {name: os.environ[name] for name in ISA_LIMITS if os.environ.get(name)}
    if limits:  # kernels restricted below what the CPU has (e.g. AVX2 on an AVX-512 machine): say so
        info["isa_limits"] = limits
    return info


def uptime() -> str:
    """`uptime`'s line (the load averages), or "" where it is unavailable."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
