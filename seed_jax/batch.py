"""From trajectories to device batches: step-sample rows with ordinary and skill-augmented contexts, padded
to bucketed shapes, and split into mini-batches whose padding rows are masked (never duplicated)."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from seed_jax import images as images_lib
from seed_jax import packing
from seed_jax.buckets import TokenCount, bucket, pow2_sizes
from seed_jax.envs.base import Trajectory
from seed_jax.models.tokenizer import Tokenizer, encode_chat
from seed_jax.skills import augment_prompt
from seed_jax.update import MiniBatch


@dataclasses.dataclass
class Samples:
  """One row per step-sample of the trajectories that enter the update (env errors excluded)."""
  prompts: list[list[int]]  # ordinary context ids (chat-templated)
  skill_prompts: list[list[int]]  # H(h, s) ids; equal to `prompts` where there is no skill
  responses: list[list[int]]
  sampled_logps: list[list[float]]
  opd_mask_N: np.ndarray  # bool: the row's trajectory was analyzed and its augmented prompt fits
  traj_index_N: np.ndarray  # index into the trajectory list
  # The step's uint8 frame (the very array the rollout stored), shared by both contexts; None for text prompts.
  images: list | None = None

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
                 frames if any(f is not None for f in frames) else None)


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
              skill_logp: Sequence[np.ndarray] | None, with_skill_prompts: bool, codec=None,
              micro_batch_size: int = 0) -> MiniBatch:
  """Rows `idx` padded to `rows` x (Pn, R); padding rows have no response tokens, zero advantage, no OPD.
  With frames (samples.images) and `codec`, their images per micro-batch of `micro_batch_size` rows."""
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
  if samples.images is not None and codec is not None:
    if with_skill_prompts:
      raise ValueError("image observations serve learner.teacher='old' only")
    m = micro_batch_size or rows
    segs = [[(j - start, Pn - len(samples.prompts[i]), samples.prompts[i], samples.responses[i], samples.images[i])
             for j, i in enumerate(idx) if start <= j < start + m] for start in range(0, rows, m)]
    extra["images"] = images_lib.micro_batched(codec, m, Pn + R, segs)
  return MiniBatch(prompt_BP=prompt, pvalid_BP=pvalid, resp_BR=resp, rmask_BR=rmask, old_logp_BR=col(old_logp),
                   adv_B=adv, ref_logp_BR=col(ref_logp), skill_logp_BR=col(skill_logp), opd_mask_B=opd, **extra)


def packed_minibatch(samples: Samples, idx: Sequence[int], layout: packing.Layout, R: int, *, adv_N: np.ndarray,
                     old_logp: Sequence[np.ndarray], ref_logp: Sequence[np.ndarray] | None,
                     skill_logp: Sequence[np.ndarray] | None, codec=None) -> tuple[MiniBatch, TokenCount]:
  """Rows `idx` packed by `layout` (packing.plan_layout over their prompt + response lengths, in idx order):
  the per-sample arrays in slot order; empty slots have no response tokens, zero advantage, no OPD. Also the
  token positions it costs (the rows of non-empty micro-batches x L; slots x R scored) against the real ones.
  With frames (samples.images) and `codec`, each group's images (images.micro_batched)."""
  idx = list(idx)
  pick = lambda xs: [xs[i] for i in idx]
  rows, resp, rmask, slot_of = packing.fill_rows(layout, pick(samples.prompts), pick(samples.responses), R)
  S = layout.slots
  col = lambda xs: packing.in_slots(pick(xs), slot_of, S, 0.0, np.float32, R) if xs is not None else None
  mb = MiniBatch(resp_BR=resp, rmask_BR=rmask, old_logp_BR=col(old_logp),
                 adv_B=packing.in_slots(adv_N[idx], slot_of, S, 0.0, np.float32), packed=rows,
                 ref_logp_BR=col(ref_logp), skill_logp_BR=col(skill_logp),
                 opd_mask_B=packing.in_slots(samples.opd_mask_N[idx], slot_of, S, False, bool),
                 micro_batches=len(layout.groups),
                 images=None if samples.images is None or codec is None else images_lib.micro_batched(
                     codec, layout.rows_per_group, layout.length,
                     packing.segments(layout, pick(samples.prompts), pick(samples.responses), pick(samples.images))))
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
