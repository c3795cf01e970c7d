"""Packing (prompt, response) sequences into rows of one length for the re-score and update forwards.

Padding every step-sample to power-of-two prompt and response buckets forwards 2-3x the real tokens. Here the
sequences go, whole, into rows of length L (first fit, longest first); each is its own segment (positions
restart at 0, no attention across segments: models/transformer.py), so every response token's log-prob is the
one the padded layout gives. The sequences' scored responses are then gathered into *slots* [S, R], the same
per-sample layout the loss reads, so nothing downstream changes.

Prefix trees (`share_prefix`): a multi-turn rollout's step-samples share heads (the chat header, the
instructions, the task; a group's first prompts are identical). Sequences sorted by their tokens sit next to
those they share the most with; runs of neighbours that share a head go into one row as a tree: each stores
only what its predecessor did not, positions continue from the shared depth, and attention sees exactly the
sequence's own path (models/attention.visible). Each response's log-probs are then those of the sequence packed
alone, its shared head computed once (and its gradient summed over the sequences that share it).

The row length is a setting (learner.pack_length, rescore.pack_length), varied per batch from half of it to 4/3
(row_lengths) to leave the least padding: long enough for several step-samples per row; attention skips the
tiles between segments (models/attention.py), so a longer row costs no more attention. Row, group and slot counts
come from a geometric set, so a run compiles few programs. With several processes `agreed_layout` raises every
process's layout to the shapes of the largest, the one protocol the re-score and the update's mini-batches share.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from seed_jax.buckets import TokenCount
from seed_jax.infra import distributed
from seed_jax.models.logprobs import PackedRows


def geometric_sizes(hi: int) -> list[int]:
  """1, 2, 3, 4, 6, 8, 12, 16, 24, ... (each ~1.5x the last) up to the first size >= hi."""
  out = [1]
  while out[-1] < hi:
    s = out[-1]
    out.append(s + 1 if s < 4 else (s // 2 * 3 if s & (s - 1) == 0 else s // 3 * 4))
  return out


def size_at_least(n: int) -> int:
  return next(s for s in geometric_sizes(n) if s >= n)


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


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
  n = min(len(a), len(b))
  differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
  return int(differ[0]) if len(differ) else n


@dataclasses.dataclass(frozen=True)
class PrefixOrder:
  """Sequence indices sorted by their tokens (those sharing a head are neighbours) and, per position in that
  order, the head it shares with the one before it (0 for the first)."""
  order: tuple[int, ...]
  shared: tuple[int, ...]


def prefix_order(seqs: Sequence[Sequence[int]]) -> PrefixOrder:
  order = sorted(range(len(seqs)), key=lambda i: list(seqs[i]))
  shared = [0] + [common_prefix(seqs[a], seqs[b]) for a, b in zip(order, order[1:])]
  return PrefixOrder(tuple(order), tuple(shared))


def _units(lengths: Sequence[int], prefix: PrefixOrder | None, L: int) -> tuple[list[list], tuple[int, ...] | None]:
  """([members, positions], ...) to place whole, and per sequence the head it takes from the member before it
  (None without `prefix`): each sequence alone, or runs of neighbours that share a head as one tree of at most
  L positions."""
  if prefix is None:
    return [[[i], n] for i, n in enumerate(lengths)], None
  units, shared = [], [0] * len(lengths)
  for i, sh in zip(prefix.order, prefix.shared):
    if units and sh > 0 and units[-1][1] + lengths[i] - sh <= L:
      units[-1][0].append(i)
      units[-1][1] += lengths[i] - sh
      shared[i] = sh
    else:
      units.append([[i], lengths[i]])
  return units, tuple(shared)


@dataclasses.dataclass(frozen=True)
class Layout:
  """Sequences per row, rows per group: a group is one micro-batch of the update (or one re-score pass);
  every group has `rows_per_group` rows of `length` tokens and `slots_per_group` slots (padding included).
  `shared[n]`: the head sequence n takes from the sequence before it in its row (prefix trees; None: none)."""
  length: int
  groups: tuple[tuple[tuple[int, ...], ...], ...]
  rows_per_group: int
  slots_per_group: int
  shared: tuple[int, ...] | None = None

  @property
  def slots(self) -> int:
    return len(self.groups) * self.slots_per_group

  @property
  def computed_rows(self) -> int:
    """Rows of the groups that hold sequences: trailing empty groups (group-count padding) are skipped."""
    return sum(1 for g in self.groups if g) * self.rows_per_group

  def tokens(self, prompt_real: int, response_real: int, resp_len: int) -> TokenCount:
    """What a forward over this layout costs against the real tokens: the computed rows' positions (prompt
    part = all of them but the responses) and the computed groups' slots x resp_len scored positions."""
    computed_slots = sum(1 for g in self.groups if g) * self.slots_per_group
    return TokenCount(prompt_forwarded=self.computed_rows * self.length - response_real, prompt_real=prompt_real,
                      response_forwarded=computed_slots * resp_len, response_real=response_real,
                      rows_forwarded=computed_slots, rows_real=sum(len(r) for g in self.groups for r in g))


def row_lengths(length: int) -> list[int]:
  """The row lengths plan_layout chooses from: multiples of 128 (the attention tile) from 1/2 to 4/3 of the
  setting (1536: 768, 896, ..., 2048), so step-samples of any typical length fill their rows well: 16 of
  ~446 tokens fill rows of 896 two by two (97 %) where multiples of 256 left 1024 (87 %)."""
  lo, hi = max(1, -(-length // 256)), max(1, length * 4 // 3 // 128)
  return [128 * k for k in range(lo, hi + 1)]


def plan_layout(lengths: Sequence[int], *, length: int, group_tokens: int, row_multiple: int = 1,
                prefix: PrefixOrder | None = None) -> Layout:
  """Sequences of `lengths` into rows of one length, first fit, longest first; rows fill groups of at most
  `group_tokens` positions (a micro-batch's or a re-score pass's memory) in order, so padding groups are empty
  and skipped. The row length is `length` unless another of row_lengths(length) computes at least 10 % fewer
  positions (then the one computing fewest, the shortest on a tie; fewer distinct shapes to compile), the next
  power of two when a sequence is longer than all of them. Row, group and slot
  counts come from geometric_sizes (rows and slots in multiples of `row_multiple`, the data-parallel shards),
  and slots are at least one per 512 row tokens, so successive updates, whose lengths differ a little, reuse
  the same compiled shapes. With `prefix` (prefix_order of the sequences) neighbours that share a head are
  placed as trees (their positions: the tokens they do not share)."""
  if not lengths:  # a process with no sequences still takes part in every process's passes (trees as theirs)
    return Layout(length, ((),), row_multiple, row_multiple, None if prefix is None else ())
  fits = [L for L in row_lengths(length) if L >= max(lengths)] or [1 << (max(lengths) - 1).bit_length()]
  layouts = [_layout(lengths, L, group_tokens, row_multiple, prefix) for L in fits]
  cost = lambda lay: lay.computed_rows * lay.length
  best = min(layouts, key=lambda lay: (cost(lay), lay.length))
  nominal = next((lay for lay in layouts if lay.length == length), best)
  return best if cost(best) < 0.9 * cost(nominal) else nominal  # the setting's shape unless 10 % fewer


def _layout(lengths: Sequence[int], L: int, group_tokens: int, row_multiple: int, prefix: PrefixOrder | None
            ) -> Layout:
  units, shared = _units(lengths, prefix, L)
  rows = [[i for u in row for i in units[u][0]] for row in first_fit_decreasing([n for _, n in units], L)]
  cap = max(row_multiple, group_tokens // L // row_multiple * row_multiple)
  per_group = min(cap, row_multiple * size_at_least(-(-len(rows) // row_multiple)))
  n_groups = size_at_least(-(-len(rows) // per_group))
  groups = tuple(tuple(tuple(r) for r in rows[g * per_group:(g + 1) * per_group]) for g in range(n_groups))
  need = max(max(sum(len(r) for r in g) for g in groups), per_group * L // 512)
  return Layout(L, groups, per_group, row_multiple * size_at_least(-(-need // row_multiple)), shared)


def resized(layout: Layout, length: int, groups: int, rows_per_group: int, slots_per_group: int) -> Layout:
  """The same placement in shapes at least as large (the largest over processes, so every process's passes
  have one shape): longer rows, trailing empty groups, more rows and slots per group."""
  if (length < layout.length or groups < len(layout.groups) or rows_per_group < layout.rows_per_group
      or slots_per_group < layout.slots_per_group):
    raise ValueError(f"resized: {length, groups, rows_per_group, slots_per_group} is smaller than {layout}")
  return Layout(length, layout.groups + ((),) * (groups - len(layout.groups)), rows_per_group, slots_per_group,
                layout.shared)


@dataclasses.dataclass(frozen=True)
class Agreed:
  """A layout in the shapes every process uses: `live` groups hold a sequence on some process (the rest are
  group-count padding everywhere), `resp_len` is the largest response bucket, and `first_row` is this
  process's first row of each group's global rows."""
  layout: Layout
  resp_len: int
  live: int
  first_row: int


def agreed_layout(lengths: Sequence[int], *, length: int, group_tokens: int, resp_len: int, mesh=None,
                  seqs: Sequence[Sequence[int]] | None = None) -> Agreed:
  """plan_layout of this process's sequences, its shapes then raised to the largest over processes (resized),
  so every process's passes over the groups are one collective program. `group_tokens` is the global budget
  of one group, shared by the processes; rows and slots come in multiples of this process's data-parallel
  shards. `seqs` (the sequences' tokens): packed as prefix trees. Every process calls it at the same point
  (with no sequences too)."""
  data, procs = (1, 1) if mesh is None else (distributed.local_dp(mesh), jax.process_count())
  layout = plan_layout(lengths, length=length, group_tokens=group_tokens // procs, row_multiple=data,
                       prefix=None if seqs is None else prefix_order(seqs))
  G, W, S, L, R, live = distributed.agree_max(len(layout.groups), layout.rows_per_group, layout.slots_per_group,
                                              layout.length, resp_len, sum(1 for g in layout.groups if g))
  first_row = 0 if mesh is None else distributed.row_block(mesh, W * procs)[0]
  return Agreed(resized(layout, L, G, W, S), R, live, first_row)


def fill_rows(layout: Layout, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
              resp_len: int, first_row: int = 0) -> tuple[PackedRows, np.ndarray, np.ndarray, np.ndarray]:
  """Numpy arrays of the layout: PackedRows (rows [G*W, L]; slots' row indices local to their group, from
  `first_row`: this process's first of the group's global rows), responses resp_SR / rmask_SR in slot order,
  and slot_of_N (sequence n's slot, in [0, G*S)). With layout.shared, each sequence stores only the tokens past
  the head it shares with the one before it, and PackedRows.segment_end_WL says which segments see each slot."""
  G, W, S, L, R = len(layout.groups), layout.rows_per_group, layout.slots_per_group, layout.length, resp_len
  tokens, positions, segment, end = (np.zeros((G * W, L), np.int32) for _ in range(4))
  shared = layout.shared or (0,) * len(prompts)
  row_S = np.zeros((G * S,), np.int32)
  col_SR = np.zeros((G * S, R), np.int32)
  resp_SR = np.zeros((G * S, R), np.int32)
  rmask_SR = np.zeros((G * S, R), bool)
  slot_of = np.full((len(prompts),), -1, np.int64)
  for g, group in enumerate(layout.groups):
    slot = g * S
    for w, members in enumerate(group):
      r, a, path = g * W + w, 0, np.zeros((0,), np.int64)  # path: the slot of each depth of the last sequence
      heads = [shared[n] for n in members]
      for k, n in enumerate(members):
        seg, p, q, h = k + 1, prompts[n], responses[n], heads[k]
        m = len(p) + len(q)
        path = np.concatenate([path[:h], a + np.arange(m - h)])
        tokens[r, a:a + m - h] = (list(p) + list(q))[h:]
        positions[r, a:a + m - h], segment[r, a:a + m - h] = np.arange(h, m), seg
        # a token at depth d is also on the paths of the following members while they share more than d
        reach = np.minimum.accumulate(np.asarray(heads[k + 1:], np.int64))
        end[r, a:a + m - h] = seg + (reach[None, :] > np.arange(h, m)[:, None]).sum(1)
        row_S[slot] = first_row + w
        col_SR[slot, :len(q)] = path[len(p) - 1 + np.arange(len(q))]  # hidden at t predicts token t + 1
        resp_SR[slot, :len(q)], rmask_SR[slot, :len(q)] = q, True
        slot_of[n] = slot
        slot, a = slot + 1, a + m - h
  rows = PackedRows(tokens, positions, segment, row_S, col_SR, end if layout.shared is not None else None)
  return rows, resp_SR, rmask_SR, slot_of


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


def segments(layout: Layout, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
             images: Sequence) -> list[list[tuple]]:
  """Per group, where each sequence sits (as fill_rows places it): (row within the group, first column, prompt,
  response, image) for images.layout_images."""
  out = []
  for group in layout.groups:
    segs = []
    for w, members in enumerate(group):
      a = 0
      for n in members:
        segs.append((w, a, prompts[n], responses[n], images[n]))
        a += len(prompts[n]) + len(responses[n]) - (layout.shared[n] if layout.shared else 0)
    out.append(segs)
  return out
