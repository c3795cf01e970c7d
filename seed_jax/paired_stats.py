"""Paired statistics of two training arms run on the same seeds (same seed: same random keys): per-seed
differences, McNemar's exact test over the evaluation episodes, and where two runs' rollouts first differ.

Pure functions on plain values (no JAX), so the experiment's summary and any later analysis share them.
"""
from __future__ import annotations

import math
from typing import Any, Hashable, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

# One evaluation's outcomes: {(split, temperature): {(task_id, panel index): solved}}.
Outcomes = dict[tuple[str, float], dict[tuple[str, int], bool]]


def mean_se(rows: Sequence[Any]) -> tuple[Any, Any]:
  """Mean and standard error (ddof 1; 0 for a single row) over axis 0: numbers give scalars, rows of a curve
  give one value per point (NaN for no rows)."""
  a = np.asarray(rows, float)
  if not len(a):
    return math.nan, math.nan
  se = a.std(axis=0, ddof=1) / np.sqrt(len(a)) if len(a) > 1 else np.zeros_like(a[0])
  return a.mean(axis=0), se


def outcomes(episodes: Iterable[Mapping[str, Any]]) -> Outcomes:
  """The episode rows of one evaluation (evaluate.evaluate's: split, temperature, task_id, index, success,
  termination) as outcomes per panel; env errors are left out, as in the success rates."""
  out: Outcomes = {}
  for e in episodes:
    if e["termination"] != "env_error":
      out.setdefault((e["split"], float(e["temperature"])), {})[(e["task_id"], int(e["index"]))] = bool(e["success"])
  return out


def success_rate(solved: Mapping[Any, bool]) -> float:
  return float(np.mean(list(solved.values()))) if solved else math.nan


def paired_differences(arm: Mapping[Hashable, float], base: Mapping[Hashable, float]) -> dict[Hashable, float]:
  """arm - base per seed, over the seeds both have."""
  return {s: arm[s] - base[s] for s in arm if s in base}


class McNemar(NamedTuple):
  b: int  # pairs the arm solved and the baseline did not
  c: int  # pairs the baseline solved and the arm did not
  p: float  # exact two-sided binomial p-value of b against b + c fair coin flips


def mcnemar_p(b: int, c: int) -> float:
  """Exact McNemar: 2 P(X <= min(b, c)) for X ~ Binomial(b + c, 1/2), capped at 1 (1 without discordant pairs)."""
  n = b + c
  return min(1.0, 2 * sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n)


def mcnemar(pairs: Iterable[tuple[bool, bool]]) -> McNemar:
  """McNemar counts and p-value of (arm solved, baseline solved) pairs."""
  pairs = list(pairs)
  b = sum(a and not z for a, z in pairs)
  c = sum(z and not a for a, z in pairs)
  return McNemar(b, c, mcnemar_p(b, c))


def pair_episodes(arm: Mapping[Hashable, Mapping[Any, bool]], base: Mapping[Hashable, Mapping[Any, bool]]
                  ) -> list[tuple[bool, bool]]:
  """(arm, baseline) outcome pairs pooled over seeds: the same seed's same episode (task, panel index), which
  both runs played with the same keys."""
  return [(arm[s][k], base[s][k]) for s in arm if s in base for k in arm[s] if k in base[s]]


def first_divergence(a: Mapping[int, Any], b: Mapping[int, Any]) -> tuple[int | None, int]:
  """(first update whose values differ or None, updates compared) over the updates where both runs have a
  value (None or NaN: not measured)."""
  known = lambda v: v is not None and not (isinstance(v, float) and math.isnan(v))
  common = sorted(u for u in a if u in b and known(a[u]) and known(b[u]))
  return next((u for u in common if a[u] != b[u]), None), len(common)
