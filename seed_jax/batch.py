"""From trajectories to device batches: step-sample rows with ordinary and skill-augmented contexts, laid out
(padded to bucketed shapes, or packed several to a row) as the mini-batches of the update, whose padding rows
are masked (never duplicated). `minibatches` yields them ready for the update step."""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Iterator, Sequence

import flax
import jax
import numpy as np

from seed_jax import images as images_lib
from seed_jax import packing
from seed_jax.buckets import TokenCount, bucket, pow2_sizes
from seed_jax.envs.base import Trajectory
from seed_jax.infra import distributed
from seed_jax.models.logprobs import PackedRows
from seed_jax.models.tokenizer import Tokenizer, encode_chat
from seed_jax.skills import augment_prompt


@flax.struct.dataclass
class MiniBatch:
  """Device arrays of one mini-batch of step-samples [M, ...]; padding rows have rmask all False.

  Two layouts of the same step-samples: padded (prompt_BP/pvalid_BP, one sample per row, M = micro-batches x
  micro_batch_size) or packed (`packed`: several samples per row, seed_jax/packing.py; the per-sample arrays
  are then in slot order, `micro_batches` groups of rows and of slots)."""
  resp_BR: jax.Array
  rmask_BR: jax.Array
  old_logp_BR: jax.Array
  adv_B: jax.Array
  prompt_BP: jax.Array | None = None
  pvalid_BP: jax.Array | None = None
  packed: PackedRows | None = None
  ref_logp_BR: jax.Array | None = None
  skill_logp_BR: jax.Array | None = None  # teacher="old"
  opd_mask_B: jax.Array | None = None
  skill_prompt_BP: jax.Array | None = None  # teacher="current": the skill-augmented prompts
  skill_pvalid_BP: jax.Array | None = None
  # The rows' images (vlm.ImageBatch; images.micro_batched lays them out per micro-batch), None for text.
  images: Any = None
  micro_batches: int = flax.struct.field(pytree_node=False, default=0)  # packed: groups (0 = padded layout)
  # Arrays already [micro-batches, rows of one, ...] (distributed.grouped_global_batch): each micro-batch's rows
  # spread over the data-parallel devices of every process.
  grouped: bool = flax.struct.field(pytree_node=False, default=False)


@dataclasses.dataclass
class Samples:
  """One row per step-sample of the trajectories that enter the update (env errors excluded)."""
  prompts: list[list[int]]  # ordinary context ids (chat-templated)
  skill_prompts: list[list[int]]  # H(h, s) ids; equal to `prompts` where there is no skill
  responses: list[list[int]]
  sampled_logps: list[list[float]]
  opd_mask_N: np.ndarray  # bool: the row's trajectory was analyzed and its augmented prompt fits
  traj_index_N: np.ndarray  # index into the trajectory list
  # The step's frame as images.Image (from the rollout's stored array), shared by both contexts; None for text.
  images: list[images_lib.Image | None] | None = None

  def __len__(self) -> int:
    return len(self.prompts)


def collect_samples(trajs: Sequence[Trajectory], skills: Sequence[str | None] | None, tokenizer: Tokenizer,
                    max_prompt_tokens: int) -> Samples:
  """Rows for every step of `trajs`; `skills[k]` is trajectory k's skill (None: no distillation signal)."""
  prompts, skill_prompts, responses, logps, opd, tix, frames = [], [], [], [], [], [], []
  for k, traj in enumerate(trajs):
    skill = skills[k] if skills is not None else None
    for step in traj.steps:
      prompts.append(step.prompt_tokens)
      responses.append(step.response_tokens)
      logps.append(step.logps)
      tix.append(k)
      frames.append(step.image)
      aug = step.prompt_tokens
      if skill:  # H(h, s) keeps the step's frame: the same image in the same place
        aug = encode_chat(tokenizer, augment_prompt(step.prompt_text, skill, step.info.get("skill_at")), step.image)
      fits = len(aug) <= max_prompt_tokens
      skill_prompts.append(aug if fits else step.prompt_tokens)
      opd.append(bool(skill) and fits)
  return Samples(prompts, skill_prompts, responses, logps, np.asarray(opd, bool), np.asarray(tix, np.int64),
                 images_lib.prepare(tokenizer, frames))


def pad_left(seqs: Sequence[Sequence[int]], rows: int, length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  ids = np.full((rows, length), pad_id, np.int32)
  mask = np.zeros((rows, length), bool)
  for b, s in enumerate(seqs):
    if len(s):
      ids[b, length - len(s):], mask[b, length - len(s):] = s, True
  return ids, mask


def pad_right(seqs: Sequence[Sequence[float]], rows: int, length: int, fill, dtype) -> tuple[np.ndarray, np.ndarray]:
  out = np.full((rows, length), fill, dtype)
  mask = np.zeros((rows, length), bool)
  for b, s in enumerate(seqs):
    out[b, :len(s)], mask[b, :len(s)] = s, True
  return out, mask


def shapes_for(samples: Samples, min_bucket: int = 64, with_skill: bool = True) -> tuple[int, int]:
  """Bucketed (prompt, response) lengths shared by every mini-batch of one update: one compiled program."""
  longest_p = max((len(p) for p in (samples.prompts + (samples.skill_prompts if with_skill else []))), default=1)
  longest_r = max((len(r) for r in samples.responses), default=1)
  sizes = lambda n: pow2_sizes(min_bucket, max(min_bucket, 1 << (n - 1).bit_length()))
  return bucket(longest_p, sizes(longest_p), "prompt"), bucket(longest_r, sizes(longest_r), "response")


def minibatch(samples: Samples, idx: Sequence[int], rows: int, Pn: int, R: int, pad_id: int, *,
              adv_N: np.ndarray, old_logp: Sequence[np.ndarray], ref_logp: Sequence[np.ndarray] | None,
              skill_logp: Sequence[np.ndarray] | None, with_skill_prompts: bool,
              micro_batch_size: int = 0, vs=None, mesh=None) -> MiniBatch:
  """Rows `idx` padded to `rows` x (Pn, R); padding rows have no response tokens, zero advantage, no OPD.
  With images (samples.images), theirs per micro-batch of `micro_batch_size` rows (images.micro_batched: `vs`
  the policy's tower spec, `mesh` for several processes)."""
  if len(idx) > rows:
    raise ValueError(f"{len(idx)} samples do not fit a mini-batch of {rows} rows")
  pick = lambda xs: [xs[i] for i in idx]
  prompt, pvalid = pad_left(pick(samples.prompts), rows, Pn, pad_id)
  resp, rmask = pad_right(pick(samples.responses), rows, R, pad_id, np.int32)
  col = lambda xs: pad_right(pick(xs), rows, R, 0.0, np.float32)[0] if xs is not None else None
  adv = np.zeros((rows,), np.float32)
  adv[:len(idx)] = adv_N[list(idx)]
  opd = np.zeros((rows,), bool)
  opd[:len(idx)] = samples.opd_mask_N[list(idx)]
  extra = {}
  if with_skill_prompts:
    extra["skill_prompt_BP"], extra["skill_pvalid_BP"] = pad_left(pick(samples.skill_prompts), rows, Pn, pad_id)
  if samples.images is not None or vs is not None:
    m = micro_batch_size or rows
    frame = lambda i: None if samples.images is None else samples.images[i]
    segs = [[(j - start, Pn - len(samples.prompts[i]), samples.prompts[i], samples.responses[i], frame(i))
             for j, i in enumerate(idx) if start <= j < start + m] for start in range(0, rows, m)]
    extra["images"] = images_lib.micro_batched(m, Pn + R, segs, vs, mesh)
  return MiniBatch(prompt_BP=prompt, pvalid_BP=pvalid, resp_BR=resp, rmask_BR=rmask, old_logp_BR=col(old_logp),
                   adv_B=adv, ref_logp_BR=col(ref_logp), skill_logp_BR=col(skill_logp), opd_mask_B=opd, **extra)


def packed_minibatch(samples: Samples, idx: Sequence[int], layout: packing.Layout, R: int, *, adv_N: np.ndarray,
                     old_logp: Sequence[np.ndarray], ref_logp: Sequence[np.ndarray] | None,
                     skill_logp: Sequence[np.ndarray] | None, first_row: int = 0, vs=None,
                     mesh=None) -> tuple[MiniBatch, TokenCount]:
  """Rows `idx` packed by `layout` (packing.plan_layout over their prompt + response lengths, in idx order):
  the per-sample arrays in slot order; empty slots have no response tokens, zero advantage, no OPD. Also the
  token positions it costs (the rows of non-empty micro-batches x L; slots x R scored) against the real ones.
  With images (samples.images), each group's (images.micro_batched, with `vs` and `mesh` as in `minibatch`).
  `first_row`: packing.fill_rows'."""
  idx = list(idx)
  pick = lambda xs: [xs[i] for i in idx]
  rows, resp, rmask, slot_of = packing.fill_rows(layout, pick(samples.prompts), pick(samples.responses), R,
                                                 first_row)
  S = layout.slots
  col = lambda xs: packing.in_slots(pick(xs), slot_of, S, 0.0, np.float32, R) if xs is not None else None
  mb = MiniBatch(resp_BR=resp, rmask_BR=rmask, old_logp_BR=col(old_logp),
                 adv_B=packing.in_slots(adv_N[idx], slot_of, S, 0.0, np.float32), packed=rows,
                 ref_logp_BR=col(ref_logp), skill_logp_BR=col(skill_logp),
                 opd_mask_B=packing.in_slots(samples.opd_mask_N[idx], slot_of, S, False, bool),
                 micro_batches=len(layout.groups),
                 images=None if samples.images is None and vs is None else images_lib.micro_batched(
                     layout.rows_per_group, layout.length,
                     packing.segments(layout, pick(samples.prompts), pick(samples.responses),
                                      [None] * len(idx) if samples.images is None else pick(samples.images)),
                     vs, mesh))
  tokens = layout.tokens(sum(len(samples.prompts[i]) for i in idx), sum(len(samples.responses[i]) for i in idx), R)
  return mb, tokens


def minibatch_tokens(samples: Samples, idx: Sequence[int], rows: int, Pn: int, R: int, *,
                     with_skill_prompts: bool) -> TokenCount:
  """The token positions one `minibatch(samples, idx, rows, Pn, R, ...)` costs a training forward: rows x
  (Pn + R) per context (the skill context too when the update scores it) against the real rows' lengths."""
  contexts = [samples.prompts] + ([samples.skill_prompts] if with_skill_prompts else [])
  C = len(contexts)
  return TokenCount(prompt_forwarded=C * rows * Pn, prompt_real=sum(len(ctx[i]) for ctx in contexts for i in idx),
                    response_forwarded=C * rows * R, response_real=C * sum(len(samples.responses[i]) for i in idx),
                    rows_forwarded=C * rows, rows_real=C * len(idx))


def minibatches(samples: Samples, draws: Iterable[Sequence[int]], per: int, *, mesh, micro_batch_size: int,
                pack_length: int, max_response_len: int, with_skill_prompts: bool, pad_id: int, adv_N: np.ndarray,
                share_prefix: bool = False,
                old_logp: Sequence[np.ndarray], ref_logp: Sequence[np.ndarray] | None,
                skill_logp: Sequence[np.ndarray] | None, vs=None) -> Iterator[tuple[tuple, MiniBatch, TokenCount]]:
  """The update's mini-batches, ready for the step: each of `draws` (this process's members of a mini-batch
  of `per` samples over every process) packed into rows of about `pack_length` (> 0; text rows that share a
  head as prefix trees with `share_prefix`, packing.prefix_order) or padded to the
  update's one bucketed shape, shapes agreed over processes, each process's members laid out as its share of
  every micro-batch (distributed.grouped_global_batch). Yields (shape key, mini-batch, token positions it
  costs: padded rows x (Pn + R) per context, both with `with_skill_prompts`; packed, the packed rows).
  `vs`: the policy's vision tower spec (None: text-only), for the rows' images. Every process iterates it at the
  same pace."""
  procs = jax.process_count()
  micro_l = max(1, micro_batch_size // procs)  # this process's rows of a padded micro-batch
  Pn, R, R_pack = distributed.agree_max(*shapes_for(samples, with_skill=with_skill_prompts), bucket(
      max(map(len, samples.responses), default=1), pow2_sizes(16, max(16, max_response_len)), "response length"))
  cols = dict(adv_N=adv_N, old_logp=old_logp, ref_logp=ref_logp, skill_logp=skill_logp)
  for idx in draws:
    if pack_length > 0:
      seqs = [list(samples.prompts[i]) + list(samples.responses[i]) for i in idx]
      agreed = packing.agreed_layout([len(x) for x in seqs], length=pack_length,
                                     group_tokens=micro_batch_size * (Pn + R), resp_len=R_pack, mesh=mesh,
                                     seqs=seqs if share_prefix and vs is None else None)  # vs: as every process
      lay = agreed.layout
      mb, tokens = packed_minibatch(samples, idx, lay, agreed.resp_len, first_row=agreed.first_row, vs=vs, mesh=mesh,
                                    **cols)
      G = len(lay.groups)
      shape = ("packed", G, lay.rows_per_group, lay.length, lay.slots_per_group, agreed.resp_len)
    else:
      # Padded to a power-of-two count of micro-batches, at least the count one process would use.
      (n,) = distributed.agree_max(max(len(idx), -(-per // procs)))
      rows = micro_l * (1 << (-(-n // micro_l) - 1).bit_length())
      G = rows // micro_l
      mb = minibatch(samples, idx, rows, Pn, R, pad_id, with_skill_prompts=with_skill_prompts,
                     micro_batch_size=micro_l, vs=vs, mesh=mesh, **cols)
      tokens = minibatch_tokens(samples, idx, rows, Pn, R, with_skill_prompts=with_skill_prompts)
      shape = ("padded", rows, Pn, R, with_skill_prompts)
    shape += (0 if mb.images is None else mb.images.pixels_NP.shape[0],)  # image patches
    with jax.set_mesh(mesh):  # [scale] every micro-batch's rows over the data-parallel axes, as global arrays
      ready = distributed.grouped_global_batch(mb.replace(grouped=True), mesh, G)
    yield shape, ready, tokens
