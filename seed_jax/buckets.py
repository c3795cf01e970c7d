"""Shape buckets: batch and length are rounded up to a few sizes so a long run compiles few programs."""
from __future__ import annotations

from typing import Sequence


def bucket(n: int, sizes: Sequence[int], what: str) -> int:
  """Smallest size in `sizes` that holds `n`; a clear error when none does."""
  for s in sorted(sizes):
    if n <= s:
      return s
  raise ValueError(f"{what} of {n} exceeds the largest bucket {max(sizes)}")


def pow2_sizes(lo: int, hi: int) -> tuple[int, ...]:
  """lo, 2*lo, 4*lo, ... up to and including hi (hi need not be a power of two)."""
  out, s = [], lo
  while s < hi:
    out.append(s)
    s *= 2
  return tuple(out + [hi])


class CompileCounter:
  """Counts distinct (function, static shape) keys: each new key is one XLA compilation."""

  def __init__(self):
    self.keys: set[tuple] = set()

  def see(self, key: tuple) -> bool:
    new = key not in self.keys
    self.keys.add(key)
    return new

  @property
  def count(self) -> int:
    return len(self.keys)
