"""Array checksums that do not depend on the sharding: two 32-bit sums per array over its bytes read as uint32
words, each word weighted by an odd function of its flat index. Integer addition wraps and is associative, so
every mesh (and every process of a pod) gets the same two numbers, with one scalar all-reduce and no gather.
A changed word always changes the first sum (its weight is odd); the second, over mixed words with other
weights, catches the changes that cancel in the first.

`tree_checksums` is what a checkpoint stores beside its arrays and checks on restore (checkpoint.py).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_U32 = jnp.uint32


def _words(x: jax.Array) -> jax.Array:
  """The array's bytes as uint32, one word per element (8- and 16-bit types widened), the shape kept (a key
  array: its key data, one trailing axis more)."""
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if x.dtype == jnp.bool_:
    return x.astype(_U32)
  size = jnp.dtype(x.dtype).itemsize
  if size not in (1, 2, 4):
    raise ValueError(f"checksum: arrays of {x.dtype} are not supported (4-, 2- and 1-byte types are)")
  return lax.bitcast_convert_type(x, {1: jnp.uint8, 2: jnp.uint16, 4: _U32}[size]).astype(_U32)


def _flat_index(shape: tuple[int, ...]) -> jax.Array:
  """Row-major flat index of every element, mod 2**32, built per axis so a sharded array is never reshaped."""
  idx, stride = jnp.zeros(shape, _U32), 1
  for d in reversed(range(len(shape))):
    idx = idx + lax.broadcasted_iota(_U32, shape, d) * _U32(stride % 2**32)
    stride *= shape[d]
  return idx


def _sums(x: jax.Array) -> jax.Array:
  w = _words(x)
  i = _flat_index(w.shape)
  c1 = (i * _U32(0x9E3779B1)) | _U32(1)
  c2 = ((i ^ _U32(0x5BD1E995)) * _U32(0xC2B2AE35)) | _U32(1)
  mixed = (w ^ (w >> 15)) * _U32(0x2C1B3C6D) + _U32(0x27D4EB2F)
  return jnp.stack([jnp.sum(w * c1, dtype=_U32), jnp.sum(mixed * c2, dtype=_U32)])


_sums_tree = jax.jit(lambda tree: jax.tree.map(_sums, tree))


def tree_checksums(tree: Any) -> dict[str, list[int]]:
  """{key path: [sum1, sum2]} for every array leaf of `tree` (collective on a multi-process mesh: every process
  calls it)."""
  sums = _sums_tree(tree)
  leaves = jax.tree_util.tree_flatten_with_path(sums)[0]
  # The sums are replicated: any addressable copy is the global value.
  return {jax.tree_util.keystr(path): [int(v) for v in np.asarray(s.addressable_data(0))] for path, s in leaves}


def differing(saved: dict[str, list[int]], current: dict[str, list[int]]) -> list[str]:
  """Key paths whose checksums differ, or that exist on one side only."""
  return sorted(k for k in set(saved) | set(current) if saved.get(k) != current.get(k))
