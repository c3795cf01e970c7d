"""Shared-prefix prefill: a prompt whose head (chat header, instructions, task, the steps so far) was prefilled
before, earlier in the same call or rollout, takes that head's keys and values from the earlier prompt's cache
and prefills only its tail, which attends to the head through the cache.

A token's keys and values depend only on the tokens up to it and their positions, so a shared head's are the
same in every prompt that starts with it: the tail's numbers are the full prefill's (tests/test_prefix.py).
The whole shared head is reused, whatever its length: it sits left-padded in the slots before the tail's
bucket, so no program depends on the head's length (a run compiles few programs).
Heads are reused only inside one `Heads` scope, where the weights are fixed: one `Sampler.generate` call, one
`slots.serve` (a rollout). The scope keeps the prompts it prefilled, oldest dropped first beyond its byte budget
(sampler.prefix_reuse_mb).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

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

  def __init__(self, min_shared: int, budget_bytes: int):
    self.min_shared = min_shared  # shorter heads save less than a prompt's own tail prefill costs
    self.budget = budget_bytes
    self.entries: list[Entry] = []

  def match(self, ids: np.ndarray, fits: Callable[[int], bool]) -> tuple[Entry, int] | None:
    """The entry sharing the longest head with `ids` and that head's length, leaving at least one token to
    prefill; None where it is shorter than min_shared or its tail does not `fit` the call."""
    best = max(self.entries, key=lambda e: common_prefix(ids, e.ids), default=None)
    if best is None:
      return None
    shared = min(common_prefix(ids, best.ids), len(ids) - 1)
    return (best, shared) if shared >= self.min_shared and fits(shared) else None

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


def take_head(cache: tf.KVCache, slot_H):
  """Keys and values of slots slot_H of a one-row cache, in that order (the head's tokens, after padding)."""
  return (tuple(jnp.take(k, slot_H, axis=3) for k in cache.k), tuple(jnp.take(v, slot_H, axis=2) for v in cache.v))


def prefill_tail(params, head_k, head_v, head_valid_1H, tokens_1T, valid_1T, *, spec: ModelSpec, dtype,
                 max_new: int):
  """One prompt whose first s tokens' keys and values are head_k / head_v, left-padded in H slots (head_valid_1H
  marks the s): its cache (the head at slots [0, H), the tail left-padded at [H, H + T), room for max_new more),
  next-token logits and next position."""
  positions_1T = jnp.sum(head_valid_1H, axis=1, keepdims=True) + tf.left_pad_positions(valid_1T)
  params = tf.cast_params(params, dtype)
  slots = head_valid_1H.shape[1] + tokens_1T.shape[1] + max_new
  hidden_1TD, cache = tf.prefill_after_head(params, spec, head_k, head_v, head_valid_1H, tokens_1T, positions_1T,
                                            valid_1T.astype(jnp.int32), slots, dtype)
  logits_1V = tf.logits_from_hidden(params, spec, hidden_1TD[:, -1:], dtype)[:, 0]
  return cache, logits_1V, positions_1T[:, -1] + 1


def put_row(cache: tf.KVCache, logits_UV, pos_U, one: tf.KVCache, logits_1V, pos_1, u):
  """Row u of a prefill's cache, logits and positions replaced by one row's (of as many slots)."""
  put = lambda a, x: jax.lax.dynamic_update_slice_in_dim(a, x.astype(a.dtype), u, axis=0)
  return (cache.replace(k=tuple(map(put, cache.k, one.k)), v=tuple(map(put, cache.v, one.v)),
                        segment_BS=put(cache.segment_BS, one.segment_BS)), put(logits_UV, logits_1V), put(pos_U, pos_1))


@functools.partial(jax.jit, static_argnames=("slots",))
def row(cache: tf.KVCache, u, slots: int) -> tf.KVCache:
  """Row u of a cache, its first `slots` slots (the prompt's; the decode room dropped)."""
  take = lambda a, axis: jax.lax.slice_in_dim(jax.lax.dynamic_index_in_dim(a, u, 0), 0, slots, axis=axis)
  return cache.replace(k=tuple(take(k, 3) for k in cache.k), v=tuple(take(v, 2) for v in cache.v),
                       segment_BS=take(cache.segment_BS, 1))


@functools.partial(jax.jit, static_argnames=("spec", "dtype", "max_new"), donate_argnums=(6, 7, 8))
def prefill_row(params, src: tf.KVCache, slot_H, head_valid_1H, tokens_1T, valid_1T, cache: tf.KVCache, logits_UV,
                pos_U, u, *, spec: ModelSpec, dtype, max_new: int):
  """`prefill_tail` after the head at slots slot_H of src (one row) into row u of a call's prefill (cache,
  logits, positions; in place), one program per reused head: the call's outputs and the row's prompt slots (a
  head for later prompts)."""
  one, logits_1V, pos_1 = prefill_tail(params, *take_head(src, slot_H), head_valid_1H, tokens_1T, valid_1T,
                                       spec=spec, dtype=dtype, max_new=max_new)
  return (*put_row(cache, logits_UV, pos_U, one, logits_1V, pos_1, u),
          row(one, 0, one.segment_BS.shape[1] - max_new))


@functools.partial(jax.jit, static_argnames=("spec", "rows", "prompt", "max_new", "dtype"))
def empty(*, spec: ModelSpec, rows: int, prompt: int, max_new: int, dtype):
  """A call's prefill outputs before its rows are written: the cache (prompt + max_new slots, prompts ending at
  `prompt`), next-token logits and next positions."""
  cache = tf.KVCache.create(spec, rows, prompt + max_new, dtype).replace(end=jnp.asarray(prompt, jnp.int32))
  return cache, jnp.zeros((rows, spec.vocab_size), jnp.float32), jnp.zeros((rows,), jnp.int32)


@jax.jit
def take_rows(cache: tf.KVCache, logits_UV, pos_U, src_R):
  """Rows src_R of a prefill's cache, logits and positions."""
  take = lambda a: jnp.take(a, src_R, axis=0)
  return (cache.replace(k=tuple(map(take, cache.k)), v=tuple(map(take, cache.v)), segment_BS=take(cache.segment_BS)),
          take(logits_UV), take(pos_U))
