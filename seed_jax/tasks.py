"""The task stream: which tasks each update plays (and which of them this process plays), and the fixed
evaluation panels and the chunks they are played in."""
from __future__ import annotations

import zlib
from typing import Iterator, Sequence

import ml_collections
import numpy as np

from seed_jax import shares
from seed_jax.envs.base import Task


def spread(tasks: Sequence[Task], n: int) -> list[Task]:
  """`n` tasks evenly spaced over a panel (panels are ordered by family), or all of them for n = 0."""
  if not n or n >= len(tasks):
    return list(tasks)
  return [tasks[i] for i in np.linspace(0, len(tasks) - 1, n).round().astype(int)]


def tasks_for_update(tasks: Sequence[Task], u: int, per_update: int, seed: int) -> list[Task]:
  """Deterministic task stream: epoch e visits the training tasks in permutation(seed, e)."""
  out = []
  for k in range(u * per_update, (u + 1) * per_update):
    epoch, pos = divmod(k, len(tasks))
    out.append(tasks[np.random.default_rng([seed, epoch]).permutation(len(tasks))[pos]])
  return out


def my_update_episodes(n_tasks: int, group_size: int) -> list[tuple[int, int]]:
  """(task b, rollout g) of this process's episodes of an update: its share of the tasks (shares.my_tasks),
  group_size rollouts each."""
  return [(b, g) for b in shares.my_tasks(n_tasks) for g in range(group_size)]


def eval_panels(family, cfg: ml_collections.ConfigDict) -> dict[str, list[Task]]:
  """split -> its fixed panel: eval.max_tasks tasks spread over the split (all of them for 0), or with
  eval.draws that many tasks drawn with replacement (the reference's protocol)."""
  splits = [s for s in cfg.eval.split.split(",") if s]
  if cfg.eval.get("draws", 0):
    return {s: draws(family.tasks(cfg.env, s), cfg.eval.draws, cfg.seed, s) for s in splits}
  return {s: spread(family.tasks(cfg.env, s), cfg.eval.max_tasks) for s in splits}


def draws(tasks: Sequence[Task], n: int, seed: int, split: str) -> list[Task]:
  """`n` tasks drawn uniformly with replacement, seeded by (seed, split): the same draws on every process, run
  and resume, independent across splits. A task drawn twice is played twice, as two episodes."""
  rng = np.random.default_rng([seed, zlib.crc32(split.encode())])
  return [tasks[i] for i in rng.integers(0, len(tasks), n)]


def eval_chunk(cfg: ml_collections.ConfigDict) -> int:
  """Panel episodes played at once (over all processes): one update's episodes or eval.batch_envs."""
  return max(cfg.rollout.tasks_per_update * cfg.rollout.group_size, cfg.eval.batch_envs)


def eval_chunks(n_tasks: int, chunk: int) -> Iterator[tuple[int, int, list[int]]]:
  """(chunk index c, its first task, the panel indices this process plays) of a panel of `n_tasks` played
  `chunk` episodes at once."""
  for c, start in enumerate(range(0, n_tasks, chunk)):
    yield c, start, [start + j for j in shares.my_tasks(min(chunk, n_tasks - start))]
