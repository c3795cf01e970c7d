"""What each process owns of an update, and the host data gathered across processes.

Every process plays the episodes of its share of the update's task groups (`my_tasks`), so a group's G
rollouts, and the group statistics of its advantages, stay on one host. What the update reports or dumps is
gathered (`gather_trajectories`, `gather_tokens`); the PPO mini-batches are drawn over one global, canonical
order of the step-samples (`MinibatchDraw`), so they hold the same samples for any process count.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, Sequence, TypeVar

import jax
import numpy as np

from seed_jax.buckets import TokenCount
from seed_jax.envs.base import Trajectory
from seed_jax.infra import distributed

T = TypeVar("T")


def my_tasks(n: int) -> list[int]:
  """This process's positions among `n` tasks (or panel episodes) every process lists identically."""
  return my_share(range(n))


def my_share(items: Sequence[T]) -> list[T]:
  """This process's items of a list every process holds identically (round-robin: items[p::P])."""
  return distributed.host_slice(items, jax.process_index(), jax.process_count())


def gather_shares(mine: Sequence[T]) -> list[T]:
  """The inverse of `my_share`: every process's items back in the order of the list they were shared from."""
  if jax.process_count() == 1:
    return list(mine)
  parts = distributed.allgather_objects(list(mine))
  out: list = [None] * sum(map(len, parts))
  for p, part in enumerate(parts):
    out[p::len(parts)] = part
  return out


def from_writer(fn: Callable[[], T]) -> T:
  """fn() as process 0 computes it (it alone reads, repairs and writes the workdir's files), on every process;
  no process returns before process 0 has run it."""
  return distributed.allgather_objects(fn() if distributed.is_writer() else None)[0]


def _slim(t: Trajectory) -> Trajectory:
  """The trajectory without its prompts, log-probs and frames: what metrics and dumps read."""
  steps = [dataclasses.replace(s, prompt_text="", prompt_tokens=[], logps=[], image=None) for s in t.steps]
  return dataclasses.replace(t, steps=steps)


def gather_trajectories(trajs: Sequence[Trajectory]) -> list[Trajectory]:
  """Every process's trajectories (slimmed unless there is one process), in (group, trajectory) order, the
  order one process plays them in."""
  if jax.process_count() == 1:
    return list(trajs)
  everyone = distributed.allgather_objects([_slim(t) for t in trajs])
  return sorted((t for part in everyone for t in part), key=lambda t: (t.group_id, t.traj_id))


def gather_records(records: Sequence[dict], key=lambda r: (r["group"], r["traj"])) -> list[dict]:
  """Every process's dump records, sorted by `key`."""
  if jax.process_count() == 1:
    return list(records)
  return sorted((r for part in distributed.allgather_objects(list(records)) for r in part), key=key)


def gather_concat(x_N: np.ndarray) -> np.ndarray:
  """Every process's rows of a per-sample array, concatenated (for means over the whole update)."""
  if jax.process_count() == 1:
    return np.asarray(x_N)
  return np.concatenate([np.asarray(p) for p in distributed.allgather_objects(np.asarray(x_N))])


def gather_tokens(tokens: dict[str, TokenCount]) -> dict[str, TokenCount]:
  """Per phase, the token positions summed over processes."""
  if jax.process_count() == 1:
    return tokens
  total: dict[str, TokenCount] = {}
  for part in distributed.allgather_objects(tokens):
    for k, t in part.items():
      total.setdefault(k, TokenCount()).add(t)
  return total


class MinibatchDraw:
  """Mini-batches over the canonical order of every process's step-samples, keyed (group, trajectory, step):
  one process's order, so the same seed draws the same mini-batches for any process count; each process
  then takes its own members."""

  def __init__(self, local_keys: Sequence[tuple[int, int, int]]):
    everyone = sorted(k for part in distributed.allgather_objects(list(local_keys)) for k in part)
    where = {k: i for i, k in enumerate(local_keys)}
    self.local_of = np.asarray([where.get(k, -1) for k in everyone], np.int64)  # -1: another process's
    self.total = len(everyone)

  def minibatches(self, rng: np.random.Generator, per: int, epochs: int) -> Iterator[np.ndarray]:
    """This process's sample indices of each mini-batch of `per`, `epochs` passes (the same count everywhere)."""
    for _ in range(epochs):
      order = rng.permutation(self.total)
      for start in range(0, self.total, per):
        mine = self.local_of[order[start:start + per]]
        yield mine[mine >= 0]


def step_keys(trajs: Sequence[Trajectory]) -> list[tuple[int, int, int]]:
  """(group, trajectory, step) of each step-sample, in batch.collect_samples order."""
  return [(t.group_id, t.traj_id, j) for t in trajs for j in range(len(t.steps))]
