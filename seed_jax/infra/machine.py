"""The machine a figure was measured on, for benchmark lines and result tables."""
from __future__ import annotations


def cpu_fields(keys=("model name", "cpu family", "model", "flags")) -> dict[str, str]:
  """The first processor's `keys` in /proc/cpuinfo ({} where it cannot be read)."""
  fields: dict[str, str] = {}
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        key = key.strip()
        if key in keys and key not in fields:
          fields[key] = value.strip()
        if len(fields) == len(keys):
          break
  except OSError:
    pass
  return fields


def cpu_description() -> str:
  """The CPU as /proc/cpuinfo names it, with its family and model numbers and its AVX-512 / bf16 instruction
  sets: "AMD EPYC" alone does not tell Zen 3 from Zen 4, and figures from two CPU models are not comparable."""
  fields = cpu_fields()
  if "model name" not in fields:
    return "unknown"
  flags = set(fields.get("flags", "").split())
  sets = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in flags] or ["no AVX-512"]
  return (f"{fields['model name']} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')}, "
          f"{', '.join(sets)})")
