"""What this machine's CPU can compute fast: its vector extensions, read once from /proc/cpuinfo.

    from vit_keras.cpu import cpu_features
    cpu_features().describe()   # "Intel(R) Xeon(R) Processor, 2 cores: AVX2, AVX-512, VNNI, BF16, AMX"
    cpu_features().bf16         # bfloat16 matrix units (AVX512_BF16 or AMX-BF16)

Standard library only. Where /proc/cpuinfo can't be read (not Linux) no extension is assumed.
"""

import dataclasses
import functools
import os
import platform

# (label, the /proc/cpuinfo flags any of which gives it), in the order ``describe`` lists them.
EXTENSIONS = (("AVX2", ("avx2",)), ("AVX-512", ("avx512f",)), ("VNNI", ("avx512_vnni", "avx_vnni")),
              ("BF16", ("avx512_bf16", "amx_bf16")), ("AMX", ("amx_bf16", "amx_int8")))


@dataclasses.dataclass(frozen=True)
class CpuFeatures:
    """A CPU's model name, the cores this process may use, and its /proc/cpuinfo flags."""

    name: str
    cores: int
    flags: frozenset

    def has(self, label):
        """Whether the CPU has the extension ``label`` (one of EXTENSIONS' labels)."""
        flags = dict(EXTENSIONS).get(label)
        if flags is None:
            raise ValueError(f"Unknown extension {label!r}; valid: {', '.join(label for label, _ in EXTENSIONS)}.")
        return any(flag in self.flags for flag in flags)

    @property
    def bf16(self):
        """bfloat16 dot products in hardware (AVX512_BF16 or AMX-BF16)."""
        return self.has("BF16")

    @property
    def int8_dot(self):
        """int8 dot products in hardware (VNNI or AMX-INT8)."""
        return self.has("VNNI") or "amx_int8" in self.flags

    def describe(self):
        found = [label for label, _ in EXTENSIONS if self.has(label)]
        return f"{self.name}, {self.cores} cores: {', '.join(found) or 'no AVX2'}"


@functools.lru_cache(maxsize=1)
def cpu_features(cpuinfo="/proc/cpuinfo"):
    """This machine's ``CpuFeatures`` (cached)."""
    fields = {}  # the first processor's "model name" and "flags"
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    flags = frozenset(fields.get("flags", "").split())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return CpuFeatures(name, cores, flags)
