"""Shape buckets: batch and length are rounded up to a few sizes so a long run compiles few programs; counters
of the programs compiled and of the padded token slots the buckets cost."""
from __future__ import annotations

import dataclasses
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


def prompt_sizes(lo: int, hi: int, fine_from: int = 256) -> tuple[int, ...]:
  """Powers of two from lo up to `fine_from`, then four sizes per octave (256, 320, 384, 448, 512, 640, ...),
  up to and including hi: a prompt past `fine_from` pads at most 25 % (a power of two: up to 100 %; an agent's
  step prompts of 300-450 tokens filled 512 slots) for a few more compiled programs, which the persistent
  compilation cache keeps across runs."""
  out = [s for s in pow2_sizes(lo, hi) if s < min(fine_from, hi)]
  s = max(lo, fine_from)
  while s < hi:
    out.append(s)
    s += 1 << (s.bit_length() - 3)  # a quarter of the octave's power of two
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


@dataclasses.dataclass
class TokenCount:
  """Token positions a bucketed device function computed (`*_forwarded`: every slot of its padded arrays)
  against those of the real rows (`*_real`), split into prompt positions (a sampler's prefill) and response
  positions (its decode steps; the scored responses of a re-score or update), with the rows of each. Sums over
  calls; `b - a` is what happened between two copies."""
  prompt_forwarded: int = 0
  prompt_real: int = 0
  response_forwarded: int = 0
  response_real: int = 0
  rows_forwarded: int = 0
  rows_real: int = 0
  # Prompt positions a sampler took from a shared head instead of computing (prefix.py): counted in prompt_real
  # (the prompts' length), not in prompt_forwarded (what was computed).
  prompt_reused: int = 0
  # Iterations of a sampler's decode loop, each one forward of all its rows or slots (response_forwarded / rows).
  decode_steps: int = 0

  @property
  def forwarded(self) -> int:
    return self.prompt_forwarded + self.response_forwarded

  @property
  def real(self) -> int:
    return self.prompt_real + self.response_real

  def add(self, other: "TokenCount") -> None:
    for f in dataclasses.fields(self):
      setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

  def copy(self) -> "TokenCount":
    return dataclasses.replace(self)

  def __sub__(self, other: "TokenCount") -> "TokenCount":
    return TokenCount(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in dataclasses.fields(self)})

  def metrics(self, prefix: str) -> dict[str, float]:
    """`{prefix}_forwarded` / `_real` (all positions) and the response and row parts a FLOP count needs."""
    return {f"{prefix}_forwarded": float(self.forwarded), f"{prefix}_real": float(self.real),
            f"{prefix}_response_forwarded": float(self.response_forwarded),
            f"{prefix}_response_real": float(self.response_real),
            f"{prefix}_rows_forwarded": float(self.rows_forwarded), f"{prefix}_rows_real": float(self.rows_real),
            f"{prefix}_prompt_reused": float(self.prompt_reused), f"{prefix}_decode_steps": float(self.decode_steps)}
