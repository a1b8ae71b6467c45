"""What the benchmark scripts record of the CPU they ran on.

Virtual machines often name their CPU only by its brand (``AMD EPYC``), and
the kinds this project's figures come from differ in generation and in
whether AVX-512 is exposed: the family and model numbers and the widest
vector level say which kind a result file measured.
"""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU as ``/proc/cpuinfo`` (or the text given) describes its first
    processor: its model name, family and model numbers and the widest
    vector level its flags report, e.g. ``'AMD EPYC (family 25, model 17;
    AVX-512)'``; the platform's name where there is no such file (another
    system) or it names no model (aarch64)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor only
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name")
    if not name:
        return platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    if "avx512f" in flags:
        level = "AVX-512"
    elif {"avx2", "fma"} <= flags:
        level = "AVX2"
    else:
        level = "no AVX2"
    family, model = fields.get("cpu family"), fields.get("model")
    numbers = f"family {family}, model {model}; " if family and model else ""
    return f"{name} ({numbers}{level})"
