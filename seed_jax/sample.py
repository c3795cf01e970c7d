"""Jitted generation for rollouts and skill writing: prefill + KV-cache decode inside one `lax.while_loop`.

`prefill_prompts` and `decode_tokens` are the pure device functions (`generate_tokens` chains them); two
programs, so the host can time prefill and decode apart and prefill a group's identical prompts once. `Sampler`
is the host side that validates prompts, buckets
shapes (so a run compiles a bounded number of programs), splits oversized batches and unpads the results.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from seed_jax import images as images_lib
from seed_jax.buckets import CompileCounter, TokenCount, bucket, pow2_sizes, prompt_sizes
from seed_jax.config import check_choice
from seed_jax.infra import distributed
from seed_jax.infra.mesh import constrain
from seed_jax.models import transformer as tf
from seed_jax.models import vlm
from seed_jax.models.spec import ModelSpec
from seed_jax.models.tokenizer import Tokenizer

log = logging.getLogger(__name__)

STOP_EOS, STOP_SEQUENCE, STOP_LENGTH, STOP_PADDING = 0, 1, 2, 3
STOP_NAMES = ("eos", "stop_sequence", "max_new_tokens", "padding")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """temperature 0 = greedy. top_k 0 and top_p 1.0 disable those filters."""
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  max_new_tokens: int = 512

  def __post_init__(self):
    if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0 or self.max_new_tokens < 1:
      raise ValueError(f"invalid sampling parameters {self}: need temperature >= 0, 0 < top_p <= 1, top_k >= 0, "
                       "max_new_tokens >= 1")


@dataclasses.dataclass
class Generation:
  tokens: list[int]  # generated ids, including the EOS / stop-sequence tokens that ended the row
  logps: list[float]  # log-prob of each generated token under the full distribution at the temperature
  stop_reason: str


def row_keys(key, ids_B):
  """One PRNG key per row: a row with id r draws from fold_in(key, r), whatever batch or process it runs in, so
  the samples do not depend on how a request is split into calls (sampler.max_batch) or over hosts."""
  return jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.asarray(ids_B, jnp.uint32))


def _pick(logits_BV, keys_B, temperature, top_p, greedy: bool, top_k: int, use_top_p: bool):
  """Next token and its log-prob, each row drawn with its own key. Filters restrict what can be drawn; the
  returned log-prob is under the full temperature-scaled distribution, which is what re-scoring computes
  (greedy: temperature 1)."""
  if greedy:
    tok_B = jnp.argmax(logits_BV, axis=-1)
    logp_BV = jax.nn.log_softmax(logits_BV, axis=-1)
  else:
    scaled_BV = logits_BV / temperature
    logp_BV = jax.nn.log_softmax(scaled_BV, axis=-1)
    masked_BV = scaled_BV
    if top_k:
      kth_B1 = jax.lax.top_k(scaled_BV, top_k)[0][:, -1:]
      masked_BV = jnp.where(scaled_BV < kth_B1, -jnp.inf, masked_BV)
    if use_top_p:
      sorted_BV = -jnp.sort(-masked_BV, axis=-1)
      probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
      keep_BV = (jnp.cumsum(probs_BV, axis=-1) - probs_BV) < top_p  # mass before this token < p
      n_keep_B1 = jnp.sum(keep_BV, axis=-1, keepdims=True)
      thresh_B1 = jnp.take_along_axis(sorted_BV, n_keep_B1 - 1, axis=-1)
      masked_BV = jnp.where(masked_BV < thresh_B1, -jnp.inf, masked_BV)
    tok_B = jax.vmap(jax.random.categorical)(keys_B, masked_BV)
  return tok_B.astype(jnp.int32), jnp.take_along_axis(logp_BV, tok_B[:, None], axis=-1)[:, 0]


@functools.partial(jax.jit, static_argnames=("spec", "dtype", "max_new", "prefill_chunk"))
def prefill_prompts(params, tokens_UP, valid_UP, images: vlm.ImageBatch | None = None, *, spec: ModelSpec, dtype,
                    max_new: int, prefill_chunk: int = 0):
  """The prompts' KV cache (room for `max_new` more tokens), the next-token logits and the next position of
  each left-padded row (valid_UP: bool validity; rows with no valid token are batch padding). `images`: the
  rows' frames (vlm.ImageBatch); their prompts take 3-D positions, and decoding goes on at the next text
  position + the rope offset, which is the prompt's largest position + 1 either way."""
  U, P = tokens_UP.shape
  params = tf.cast_params(params, dtype)
  positions, embeds = vlm.forward_inputs(params, spec, images, tf.left_pad_positions(valid_UP), dtype)
  hidden_UPD, cache = tf.prefill(params, spec, tokens_UP, positions, valid_UP.astype(jnp.int32), P + max_new,
                                 dtype, chunk=prefill_chunk, embeds=embeds)
  logits_UV = tf.logits_from_hidden(params, spec, hidden_UPD[:, -1:], dtype)[:, 0]
  return cache, logits_UV, jnp.max(positions.reshape(-1, U, P), axis=(0, 2)) + 1


@functools.partial(jax.jit, static_argnames=("spec", "dtype", "max_new", "greedy", "top_k", "use_top_p"))
def decode_tokens(params, cache, logits_UV, pos_U, src_B, is_pad_B, keys_B, temperature, top_p, eos_E, stop_NL, *,
                  spec: ModelSpec, dtype, max_new: int, greedy: bool, top_k: int, use_top_p: bool):
  """Samples up to `max_new` tokens for rows B from prefilled rows U: row b continues prefilled row src_B[b]
  (identical prompts are prefilled once; src_B None: row b is row b). is_pad_B marks batch padding; keys_B
  (row_keys) are the rows' PRNG keys, folded with the step.
  eos_E: int32 ids that end a row. stop_NL: int32 stop sequences, right-aligned, padded on the left with -1.
  Returns tokens_BN (0 after a row ends), logps_BN (0 after), lengths_B and reason_B (STOP_* codes)."""
  if src_B is not None:  # one prefilled row per distinct prompt, copied to each of its sampled rows
    take = lambda x: jnp.take(x, src_B, axis=0)
    cache = cache.replace(k=tuple(map(take, cache.k)), v=tuple(map(take, cache.v)), segment_BS=take(cache.segment_BS))
    logits_UV, pos_U = take(logits_UV), take(pos_U)
  cache = cache.replace(k=tuple(constrain(k, ("batch", "kv_heads", "head_dim", "cache_length")) for k in cache.k),
                        v=tuple(constrain(v, ("batch", "kv_heads", "cache_length", "head_dim")) for v in cache.v))
  B = is_pad_B.shape[0]
  L = stop_NL.shape[1]
  params = tf.decode_params(tf.cast_params(params, dtype), dtype)  # split per layer once, outside the loop
  stop_len_N = jnp.sum(stop_NL >= 0, axis=1)

  def cond(s):
    return (s["i"] < max_new) & ~jnp.all(s["done"])

  def body(s):
    i = s["i"]
    step_keys_B = jax.vmap(jax.random.fold_in, (0, None))(keys_B, i)
    tok_B, logp_B = _pick(s["logits"], step_keys_B, temperature, top_p, greedy, top_k, use_top_p)
    live_B = ~s["done"]
    recent_BL = jnp.concatenate([s["recent"][:, 1:], tok_B[:, None]], axis=1)
    stop_hit_B = jnp.any(jnp.all((recent_BL[:, None, :] == stop_NL[None]) | (stop_NL[None] < 0), axis=-1)
                         & (stop_len_N > 0)[None], axis=1)
    eos_hit_B = jnp.any(tok_B[:, None] == eos_E[None], axis=1)
    reason_B = jnp.where(eos_hit_B, STOP_EOS, jnp.where(stop_hit_B, STOP_SEQUENCE, STOP_LENGTH))
    ends_B = live_B & (eos_hit_B | stop_hit_B | (i + 1 == max_new))
    hidden_B1D, cache = tf.forward(params, spec, tok_B[:, None], s["pos"][:, None], jnp.ones((B, 1), jnp.int32),
                                   s["cache"], dtype)
    return dict(
        i=i + 1, cache=cache, pos=s["pos"] + 1, recent=recent_BL, done=s["done"] | ends_B,
        logits=tf.logits_from_hidden(params, spec, hidden_B1D, dtype)[:, 0],
        tokens=s["tokens"].at[:, i].set(jnp.where(live_B, tok_B, 0)),
        logps=s["logps"].at[:, i].set(jnp.where(live_B, logp_B, 0.0)),
        lengths=s["lengths"] + live_B.astype(jnp.int32), reason=jnp.where(ends_B, reason_B, s["reason"]))

  init = dict(i=jnp.int32(0), cache=cache, pos=pos_U, logits=logits_UV, done=is_pad_B,
              recent=jnp.full((B, L), -2, jnp.int32), tokens=jnp.zeros((B, max_new), jnp.int32),
              logps=jnp.zeros((B, max_new), jnp.float32), lengths=jnp.zeros((B,), jnp.int32),
              reason=jnp.where(is_pad_B, STOP_PADDING, STOP_LENGTH).astype(jnp.int32))
  s = jax.lax.while_loop(cond, body, init)
  return s["tokens"], s["logps"], s["lengths"], s["reason"]


def generate_tokens(params, tokens_BP, valid_BP, key, temperature, top_p, eos_E, stop_NL, *, spec: ModelSpec,
                    dtype, max_new: int, greedy: bool, top_k: int, use_top_p: bool, prefill_chunk: int = 0):
  """Samples up to `max_new` tokens after left-padded prompts: prefill_prompts, then decode_tokens, one row
  per prompt, row b drawing with fold_in(key, b). Returns tokens_BN, logps_BN, lengths_B and reason_B as decode_tokens."""
  cache, logits_BV, pos_B = prefill_prompts(params, tokens_BP, valid_BP, spec=spec, dtype=dtype, max_new=max_new,
                                            prefill_chunk=prefill_chunk)
  B = tokens_BP.shape[0]
  return decode_tokens(params, cache, logits_BV, pos_B, None, ~jnp.any(jnp.asarray(valid_BP), axis=1),
                       row_keys(key, jnp.arange(B)),
                       temperature, top_p, eos_E, stop_NL, spec=spec, dtype=dtype, max_new=max_new, greedy=greedy,
                       top_k=top_k, use_top_p=use_top_p)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplerConfig:
  """max_batch and dtype have their defaults in config.sampler (configs/base.py) only."""
  max_prompt_len: int = 2048  # prompts longer than this are an error (callers truncate their history)
  min_batch: int = 1
  max_batch: int  # larger requests run as several batches
  min_prompt_bucket: int = 64
  dtype: str  # compute dtype of weights and KV cache: "float32" or "bfloat16"
  prefill_chunk: int = 0  # > 0: prompts longer than this are prefilled in chunks of it (transformer.prefill)


class Sampler:
  """Host wrapper: validates, buckets, batches and unpads. One instance per model spec and mesh.

  `tokens` sums what the calls cost: prompt positions are the prefill (rows bucket x prompt bucket against the
  real prompt lengths), response positions the decode steps (rows bucket x steps the loop ran against the
  tokens generated)."""

  def __init__(self, spec: ModelSpec, eos_ids: Sequence[int], cfg: SamplerConfig, mesh=None):
    check_choice("sampler.dtype", cfg.dtype)
    self.spec, self.cfg, self.mesh = spec, cfg, mesh
    self.eos_E = np.asarray(sorted(set(eos_ids)) or [-1], np.int32)
    # Rows per call of this process: with several processes each supplies its share of a global batch.
    data, procs = (1, 1) if mesh is None else (distributed.local_dp(mesh), jax.process_count())
    self.batch_sizes = pow2_sizes(max(cfg.min_batch // procs, data), max(cfg.max_batch // procs, data))
    self.prompt_sizes = prompt_sizes(min(cfg.min_prompt_bucket, cfg.max_prompt_len), cfg.max_prompt_len)
    self.compiles = CompileCounter()
    self.tokens = TokenCount()
    self.times = {"prefill_s": 0.0, "decode_s": 0.0}  # wall time of the calls, summed

  def generate(self, params, prompts: Sequence[Sequence[int]], key, sp: SamplingParams,
               stop_sequences: Sequence[Sequence[int]] = (), images: Sequence | None = None,
               row_ids: Sequence[int] | None = None) -> list[Generation]:
    """`images`: one images.Image (or None) per prompt, for the prompt's vision tokens (images.prepare).
    `row_ids`: each prompt's draw (fold_in(key, id), row_keys; default: its position), e.g. its episode.
    With several processes every process calls this at the same point with its own prompts (none is fine):
    the calls are collective, each process supplies and reads back only its rows."""
    multi = jax.process_count() > 1
    if not prompts and not multi:
      return []
    if images is not None and any(f is not None for f in images) and self.spec.vision is None:
      raise ValueError("prompts with images need a vision-language policy (config.model.path); "
                       "or set config.env.observation='text'")
    images = list(images) if images is not None else [None] * len(prompts)
    if len(images) != len(prompts):
      raise ValueError(f"{len(images)} images for {len(prompts)} prompts: give one (or None) per prompt")
    for i, p in enumerate(prompts):
      if len(p) == 0:
        raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
      if len(p) > self.cfg.max_prompt_len:
        raise ValueError(f"prompt {i} has {len(p)} tokens, more than sampler max_prompt_len="
                         f"{self.cfg.max_prompt_len}; truncate it before sampling")
    stop_NL = _stop_array(stop_sequences)
    row_ids = list(range(len(prompts))) if row_ids is None else list(row_ids)
    out: list[Generation] = []
    step = self.batch_sizes[-1]
    (calls,) = distributed.agree_max(-(-len(prompts) // step))  # every process makes the same calls
    for start in range(0, calls * step, step):
      out += self._generate_batch(params, prompts[start:start + step], key, row_ids[start:start + step], sp,
                                  stop_NL, images[start:start + step])
    return out

  def generate_text(self, params, texts: Sequence[str], key, sp: SamplingParams, tokenizer: Tokenizer,
                    stop_sequences: Sequence[Sequence[int]] = ()) -> list[str]:
    """Replies to user messages: each text chat-templated by `tokenizer`, generated, decoded back to text."""
    gens = self.generate(params, [tokenizer.encode_chat(t) for t in texts], key, sp, stop_sequences)  # collective
    return [tokenizer.decode(g.tokens) for g in gens]

  def rollout_fn(self, params, sp: SamplingParams, stop_sequences: Sequence[Sequence[int]] = ()
                 ) -> Callable[..., list[Generation]]:
    """`generate` with fixed weights and sampling: the (prompt ids, key[, images, row ids]) -> generations of
    rollout.run_episodes."""
    return lambda prompts, key, images=None, row_ids=None: self.generate(params, prompts, key, sp, stop_sequences,
                                                                          images, row_ids)

  def _generate_batch(self, params, prompts, key, row_ids, sp: SamplingParams, stop_NL,
                      frames) -> list[Generation]:
    """One call; B, Pn, U (and whether prompts repeat) are agreed over processes, B and U per process."""
    # A group's G rollouts share their first prompt: each distinct prompt is prefilled once (rows independent,
    # so every row's numbers are the ones its own prefill gives) and its cache copied to its rows. A prompt with
    # a frame is identical only with the same frame.
    keys = [(tuple(p), None if f is None else f.key) for p, f in zip(prompts, frames)]
    first: dict[tuple, int] = {}  # distinct prompt (with its frame) -> its first row
    for n, k in enumerate(keys):
      first.setdefault(k, n)
    slot = {k: u for u, k in enumerate(first)}
    src_N = np.asarray([slot[k] for k in keys], np.int32)
    unique, frames = [prompts[n] for n in first.values()], [frames[n] for n in first.values()]
    B, Pn, U, dedup = distributed.agree_max(
        bucket(max(len(prompts), 1), self.batch_sizes, "batch"),
        bucket(max(map(len, prompts), default=1), self.prompt_sizes, "prompt length"),
        bucket(max(len(unique), 1), self.batch_sizes, "batch"), len(unique) != len(prompts))
    # This process's prefilled rows start at u0 of the global U: its rows' sources index from there.
    u0 = 0 if self.mesh is None else distributed.row_block(self.mesh, U * jax.process_count())[0]
    tokens_UP = np.zeros((U, Pn), np.int32)
    valid_UP = np.zeros((U, Pn), bool)
    for u, p in enumerate(unique):
      tokens_UP[u, Pn - len(p):] = p
      valid_UP[u, Pn - len(p):] = True
    src_B = None if not dedup else u0 + np.pad(src_N, (0, B - len(prompts)), constant_values=U - 1)
    image_batch = images_lib.layout_images(U, Pn, [(u, Pn - len(p), p, (), f)
                                                   for u, (p, f) in enumerate(zip(unique, frames))])
    n_patches = 0 if image_batch is None else image_batch.pixels_NP.shape[0]
    is_pad_B = np.arange(B) >= len(prompts)
    greedy = sp.temperature == 0
    decode_static = dict(spec=self.spec, dtype=jnp.dtype(self.cfg.dtype), max_new=sp.max_new_tokens, greedy=greedy,
                         top_k=0 if greedy else sp.top_k, use_top_p=not greedy and sp.top_p < 1.0)
    prefill_static = dict(spec=self.spec, dtype=jnp.dtype(self.cfg.dtype), max_new=sp.max_new_tokens,
                          prefill_chunk=self.cfg.prefill_chunk)
    if self.compiles.see(("prefill", U, Pn, n_patches, tuple(sorted(prefill_static.items(), key=str)))):
      log.info("compiling prefill: batch %d, prompt %d, image patches %d (%d programs)", U, Pn, n_patches,
               self.compiles.count)
    if self.compiles.see(("decode", U, B, src_B is None, Pn, stop_NL.shape,
                          tuple(sorted(decode_static.items(), key=str)))):
      log.info("compiling decode: batch %d, prompt %d, max_new %d (%d programs)", B, Pn, sp.max_new_tokens,
               self.compiles.count)
    rows = (lambda a: a) if self.mesh is None else (lambda a: distributed.global_batch(a, self.mesh))
    ids_B = np.zeros((B,), np.uint32)
    ids_B[:len(prompts)] = row_ids
    with jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext():
      t0 = time.perf_counter()
      cache, logits, pos = jax.block_until_ready(prefill_prompts(params, rows(tokens_UP), rows(valid_UP),
                                                                 image_batch, **prefill_static))
      t1 = time.perf_counter()
      out = decode_tokens(
          params, cache, logits, pos, None if src_B is None else rows(src_B), rows(is_pad_B),
          row_keys(key, rows(ids_B)),
          jnp.float32(max(sp.temperature, 1e-6)), jnp.float32(sp.top_p), jnp.asarray(self.eos_E),
          jnp.asarray(stop_NL), **decode_static)
      toks, logps, lens, reason = (distributed.local_rows(x) for x in out)  # this process's rows
    self.times["prefill_s"] += t1 - t0
    self.times["decode_s"] += time.perf_counter() - t1
    lens_N = lens[:len(prompts)]
    # The decode loop runs until its longest row ends: every row, padding included, pays for those steps.
    steps = int(distributed.agree_max(int(lens_N.max(initial=0)))[0])  # the loop ran for the longest row anywhere
    self.tokens.add(TokenCount(prompt_forwarded=U * Pn, prompt_real=sum(map(len, unique)),
                               response_forwarded=B * steps, response_real=int(lens_N.sum()),
                               rows_forwarded=B, rows_real=len(prompts)))
    return [Generation(tokens=toks[b, :lens[b]].tolist(), logps=logps[b, :lens[b]].tolist(),
                       stop_reason=STOP_NAMES[reason[b]]) for b in range(len(prompts))]


def _stop_array(stop_sequences: Sequence[Sequence[int]]) -> np.ndarray:
  seqs = [list(s) for s in stop_sequences if len(s)]
  L = max([len(s) for s in seqs], default=1)
  arr = np.full((max(len(seqs), 1), L), -1, np.int32)
  for n, s in enumerate(seqs):
    arr[n, L - len(s):] = s
  return arr

