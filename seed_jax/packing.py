"""Packing (prompt, response) sequences into rows of one length for the re-score and update forwards.

Padding every step-sample to power-of-two prompt and response buckets forwards 2-3x the real tokens. Here the
sequences go, whole, into rows of length L (first fit, longest first); each is its own segment (positions
restart at 0, no attention across segments: models/transformer.py), so every response token's log-prob is the
one the padded layout gives. The sequences' scored responses are then gathered into *slots* [S, R], the same
per-sample layout the loss reads, so nothing downstream changes.

L is chosen per call from a bounded set (multiples of LENGTH_QUANTUM growing by ~1.5x) to minimize the FLOPs
of the padded rows, attention included (longer rows waste less at the end but attend over more keys); row and
slot counts come from the same kind of set, so a run compiles a bounded number of programs.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from seed_jax.models.logprobs import PackedRows
from seed_jax.models.spec import ModelSpec

LENGTH_QUANTUM = 128


def geometric_sizes(hi: int) -> list[int]:
  """1, 2, 3, 4, 6, 8, 12, 16, 24, ... (each ~1.5x the last) up to the first size >= hi."""
  out = [1]
  while out[-1] < hi:
    s = out[-1]
    out.append(s + 1 if s < 4 else (s // 2 * 3 if s & (s - 1) == 0 else s // 3 * 4))
  return out


def size_at_least(n: int) -> int:
  return next(s for s in geometric_sizes(n) if s >= n)


def flops_per_token(spec: ModelSpec, seq_len: int, with_logits: bool = True) -> float:
  """2 x matmul weights (+ the vocabulary projection) plus causal attention (QK and PV over (T+1)/2 keys on
  average) per token of a forward over rows of `seq_len` tokens."""
  D, H, K, hd, F = spec.dim, spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.ffn_dim
  per_layer = D * H * hd + 2 * D * K * hd + H * hd * D + 3 * D * F
  matmul = spec.n_layers * per_layer + (spec.dim * spec.vocab_size if with_logits else 0)
  return 2 * matmul + spec.n_layers * 4 * H * hd * (seq_len + 1) / 2


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
  """Indices per row: longest first, each into the first row with room."""
  rows: list[list[int]] = []
  fill: list[int] = []
  for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
    r = next((r for r, f in enumerate(fill) if f + lengths[i] <= capacity), None)
    if r is None:
      rows.append([])
      fill.append(0)
      r = len(rows) - 1
    rows[r].append(i)
    fill[r] += lengths[i]
  return rows


@dataclasses.dataclass(frozen=True)
class Layout:
  """Sequences per row, rows per group: a group is one micro-batch of the update (or one re-score pass);
  every group has `rows_per_group` rows of `length` tokens and `slots_per_group` slots (padding included)."""
  length: int
  groups: tuple[tuple[tuple[int, ...], ...], ...]
  rows_per_group: int
  slots_per_group: int

  @property
  def rows(self) -> int:
    return len(self.groups) * self.rows_per_group

  @property
  def slots(self) -> int:
    return len(self.groups) * self.slots_per_group


def plan_layout(lengths: Sequence[int], spec: ModelSpec, *, group_tokens: int, max_len: int,
                group_multiple: int = 1, row_multiple: int = 1) -> Layout:
  """The cheapest layout of sequences of `lengths` into groups of at most `group_tokens` positions (a
  micro-batch's or a pass's memory budget), rows of a length L >= the longest sequence. The group count is a
  multiple of `group_multiple` from geometric_sizes, rows and slots per group multiples of `row_multiple`
  (data-parallel shards), so the shapes a run sees stay few."""
  if not lengths:
    raise ValueError("nothing to pack")
  longest = max(lengths)
  if longest > max_len:
    raise ValueError(f"a sequence of {longest} tokens exceeds the packing limit of {max_len}")
  lo = -(-longest // LENGTH_QUANTUM)
  best = None
  for k in geometric_sizes(-(-max_len // LENGTH_QUANTUM)):
    if k < lo:
      continue
    L = min(k * LENGTH_QUANTUM, max(max_len, longest))
    rows = first_fit_decreasing(lengths, L)
    per_group = max(row_multiple, group_tokens // L // row_multiple * row_multiple)
    n_groups = group_multiple * size_at_least(-(-len(rows) // per_group // group_multiple) or 1)
    per_group = row_multiple * -(-len(rows) // n_groups // row_multiple)  # spread the rows evenly
    cost = n_groups * per_group * L * flops_per_token(spec, L, with_logits=False)
    if best is None or cost < best[0]:
      best = (cost, L, rows, n_groups, per_group)
    if L >= max_len:
      break
  _, L, rows, n_groups, per_group = best
  groups = tuple(tuple(tuple(r) for r in rows[g * per_group:(g + 1) * per_group]) for g in range(n_groups))
  slots = row_multiple * size_at_least(-(-max(sum(len(r) for r in g) for g in groups) // row_multiple))
  return Layout(L, groups, per_group, slots)


def fill_rows(layout: Layout, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
              resp_len: int) -> tuple[PackedRows, np.ndarray, np.ndarray, np.ndarray]:
  """Numpy arrays of the layout: PackedRows (rows [G*W, L]; slots' row indices local to their group),
  responses resp_SR / rmask_SR in slot order, and slot_of_N (sequence n's slot, in [0, G*S))."""
  G, W, S, L, R = len(layout.groups), layout.rows_per_group, layout.slots_per_group, layout.length, resp_len
  tokens, positions, segment = (np.zeros((G * W, L), np.int32) for _ in range(3))
  row_S = np.zeros((G * S,), np.int32)
  col_SR = np.zeros((G * S, R), np.int32)
  resp_SR = np.zeros((G * S, R), np.int32)
  rmask_SR = np.zeros((G * S, R), bool)
  slot_of = np.full((len(prompts),), -1, np.int64)
  for g, group in enumerate(layout.groups):
    slot = g * S
    for w, members in enumerate(group):
      r, a = g * W + w, 0
      for seg, n in enumerate(members, 1):
        p, q = prompts[n], responses[n]
        m = len(p) + len(q)
        tokens[r, a:a + m], positions[r, a:a + m], segment[r, a:a + m] = list(p) + list(q), np.arange(m), seg
        row_S[slot] = w
        col_SR[slot, :len(q)] = a + len(p) - 1 + np.arange(len(q))  # hidden at t predicts token t + 1
        resp_SR[slot, :len(q)], rmask_SR[slot, :len(q)] = q, True
        slot_of[n] = slot
        slot, a = slot + 1, a + m
  return PackedRows(tokens, positions, segment, row_S, col_SR), resp_SR, rmask_SR, slot_of


def in_slots(values_N: Sequence, slot_of_N: np.ndarray, slots: int, fill, dtype, width: int | None = None):
  """Per-sequence values (scalars, or ragged rows right-padded to `width`) placed at their slots."""
  shape = (slots,) if width is None else (slots, width)
  out = np.full(shape, fill, dtype)
  for v, s in zip(values_N, slot_of_N):
    if width is None:
      out[s] = v
    else:
      out[s, :len(v)] = v
  return out
