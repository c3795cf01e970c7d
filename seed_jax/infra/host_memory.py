"""The driver's host memory between updates: what it holds, and handing freed pages back.

Every update frees gigabytes of host buffers (rollout records, packed rows, XLA's CPU arrays) in blocks of many
sizes; glibc keeps freed blocks in its arenas, so the resident size drifts up and swings by the update's working
set although nothing is kept. `release` returns those pages to the kernel once per update."""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc

import jax


def rss_mb() -> float:
  """This process's resident memory (0 where /proc is missing)."""
  try:
    with open("/proc/self/status") as f:
      return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
  except (OSError, StopIteration, ValueError):
    return 0.0


def live_arrays_mb() -> float:
  """Bytes of every jax array still referenced (this process's shards): what the run keeps, not what it freed."""
  return sum(s.data.nbytes for a in jax.live_arrays() for s in a.addressable_shards) / 2 ** 20


@functools.cache
def _malloc_trim():
  name = ctypes.util.find_library("c")
  try:
    return ctypes.CDLL(name).malloc_trim if name else None
  except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
    return None


def release() -> dict[str, float]:
  """Collects Python's garbage and returns glibc's free pages; the memory metrics measured after it."""
  gc.collect()
  if (trim := _malloc_trim()) is not None:
    trim(0)
  return {"mem/host_rss_mb": rss_mb(), "mem/live_arrays_mb": live_arrays_mb()}
