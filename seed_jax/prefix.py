"""Shared-prefix prefill: a prompt whose head (chat header, instructions, task, the steps so far) was prefilled
before, earlier in the same call or rollout, takes that head's keys and values from the earlier prompt's cache
and prefills only its tail, which attends to the head through the cache.

A token's keys and values depend only on the tokens up to it and their positions, so a shared head's are the
same in every prompt that starts with it: the tail's numbers are the full prefill's (tests/test_prefix.py).
Heads are reused at prompt-bucket lengths (a run compiles few programs) and only inside one `Heads` scope,
where the weights are fixed: one `Sampler.generate` call, one `slots.serve` (a rollout). The scope keeps the
prompts it prefilled, oldest dropped first beyond its byte budget (sampler.prefix_reuse_mb).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from seed_jax.decode import front_pad
from seed_jax.models import transformer as tf
from seed_jax.models import xla_cpu
from seed_jax.models.spec import ModelSpec


@dataclasses.dataclass(eq=False)  # entries are compared by identity
class Entry:
  """A prefilled prompt: its ids, the bytes its cache row holds, that row (None until prefilled) and each
  token's slot there."""
  ids: np.ndarray
  nbytes: int
  cache: tf.KVCache | None = None
  slot_N: np.ndarray | None = None


def slot_bytes(spec: ModelSpec, dtype) -> int:
  """Cache bytes per slot of one row: keys and values of every layer, in the cache's storage dtype."""
  return 2 * spec.n_layers * spec.n_kv_heads * spec.head_dim * jnp.dtype(xla_cpu.storage_dtype(dtype)).itemsize


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
  """How many leading tokens a and b share."""
  n = min(len(a), len(b))
  differ = np.flatnonzero(a[:n] != b[:n])
  return int(differ[0]) if differ.size else n


class Heads:
  """The prompts prefilled in one scope, to lend their heads to later prompts of that scope."""

  def __init__(self, sizes: Sequence[int], budget_bytes: int):
    self.sizes = sorted(sizes)  # head lengths that may be reused: the sampler's prompt buckets
    self.budget = budget_bytes
    self.entries: list[Entry] = []

  def match(self, ids: np.ndarray, fits: Callable[[int], bool]) -> tuple[Entry, int] | None:
    """The entry sharing the longest head with `ids` and the head length to reuse: the longest bucket size
    within the shared tokens that leaves at least one token to prefill and `fits` (the tail's bucket too)."""
    best = max(self.entries, key=lambda e: common_prefix(ids, e.ids), default=None)
    if best is None:
      return None
    shared = min(common_prefix(ids, best.ids), len(ids) - 1)
    usable = [s for s in self.sizes if s <= shared and fits(s)]
    return (best, usable[-1]) if usable else None

  def keep(self, entry: Entry, pinned: Sequence[Entry]) -> bool:
    """Keeps `entry` (to be prefilled), the oldest entries not `pinned` (this call's heads) dropped while the
    kept caches would exceed the budget; False when it cannot fit."""
    while sum(e.nbytes for e in self.entries) + entry.nbytes > self.budget:
      old = next((e for e in self.entries if e not in pinned), None)
      if old is None:
        return False
      self.entries.remove(old)
    self.entries.append(entry)
    return True


@jax.jit
def take_head(cache: tf.KVCache, slot_S):
  """Keys and values of slots slot_S of a one-row cache, in that order (the head's tokens)."""
  return (tuple(jnp.take(k, slot_S, axis=3) for k in cache.k), tuple(jnp.take(v, slot_S, axis=2) for v in cache.v))


@functools.partial(jax.jit, static_argnames=("spec", "dtype", "max_new"))
def prefill_tail(params, head_k, head_v, tokens_1T, valid_1T, *, spec: ModelSpec, dtype, max_new: int):
  """One prompt whose first s tokens' keys and values are head_k / head_v: its cache (the head at slots
  [0, s), the tail left-padded at [s, s + T), room for max_new more), next-token logits and next position."""
  s, T = head_k[0].shape[-1], tokens_1T.shape[1]
  positions_1T = s + tf.left_pad_positions(valid_1T)
  params = tf.cast_params(params, dtype)
  hidden_1TD, cache = tf.prefill_after_head(params, spec, head_k, head_v, tokens_1T, positions_1T,
                                            valid_1T.astype(jnp.int32), s + T + max_new, dtype)
  logits_1V = tf.logits_from_hidden(params, spec, hidden_1TD[:, -1:], dtype)[:, 0]
  return cache, logits_1V, positions_1T[:, -1] + 1


@jax.jit
def take_rows(cache: tf.KVCache, logits_UV, pos_U, src_R):
  """Rows src_R of a prefill's cache, logits and positions."""
  take = lambda a: jnp.take(a, src_R, axis=0)
  return (cache.replace(k=tuple(map(take, cache.k)), v=tuple(map(take, cache.v)), segment_BS=take(cache.segment_BS)),
          take(logits_UV), take(pos_U))


@functools.partial(jax.jit, donate_argnums=(0, 1, 2))
def put_row(cache: tf.KVCache, logits_UV, pos_U, one: tf.KVCache, logits_1V, pos_1, u):
  """Row u of a prefill's cache, logits and positions replaced by one row's (its slots front-padded to theirs),
  in place."""
  one = front_pad(one, cache.segment_BS.shape[1] - one.segment_BS.shape[1])
  put = lambda a, x: jax.lax.dynamic_update_slice_in_dim(a, x.astype(a.dtype), u, axis=0)
  return (cache.replace(k=tuple(map(put, cache.k, one.k)), v=tuple(map(put, cache.v, one.v)),
                        segment_BS=put(cache.segment_BS, one.segment_BS)), put(logits_UV, logits_1V), put(pos_U, pos_1))


def row(cache: tf.KVCache, u: int, slots: int) -> tf.KVCache:
  """Row u of a cache, its first `slots` slots (the prompt's; the decode room dropped)."""
  return cache.replace(k=tuple(k[u:u + 1, ..., :slots] for k in cache.k),
                       v=tuple(v[u:u + 1, :, :slots] for v in cache.v), segment_BS=cache.segment_BS[u:u + 1, :slots])
