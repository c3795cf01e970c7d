"""Jitted generation for rollouts and skill writing: prefill, then KV-cache decode inside one `lax.while_loop`
(seed_jax/decode.py holds the loop; seed_jax/slots.py runs it on rows that refill).

`prefill_prompts` and `decode_tokens` are the pure device functions (`generate_tokens` chains them); two
programs, so the host can time prefill and decode apart and prefill a group's identical prompts once. `Sampler`
is the host side that validates prompts, buckets shapes (so a run compiles a bounded number of programs),
splits oversized batches and unpads the results.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from seed_jax import images as images_lib
from seed_jax import prefix
from seed_jax.buckets import CompileCounter, TokenCount, bucket, pow2_sizes, prompt_sizes
from seed_jax.config import check_choice
from seed_jax.decode import STOP_NAMES, decode, start_rows
from seed_jax.infra import distributed
from seed_jax.models import transformer as tf
from seed_jax.models import vlm
from seed_jax.models.spec import ModelSpec
from seed_jax.models.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """temperature 0 = greedy. top_k 0, top_p 1.0 and no_repeat_ngram 0 disable those filters (no_repeat_ngram
  n: a reply never writes the same n tokens twice, decode.repeat_bans)."""
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  max_new_tokens: int = 512
  no_repeat_ngram: int = 0

  def __post_init__(self):
    if (self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0 or self.max_new_tokens < 1
        or self.no_repeat_ngram < 0):
      raise ValueError(f"invalid sampling parameters {self}: need temperature >= 0, 0 < top_p <= 1, top_k >= 0, "
                       "max_new_tokens >= 1, no_repeat_ngram >= 0")


@dataclasses.dataclass
class Generation:
  tokens: list[int]  # generated ids, including the EOS / stop-sequence tokens that ended the row
  logps: list[float]  # log-prob of each generated token under the full distribution at the temperature
  stop_reason: str


def row_keys(key, ids_B):
  """One PRNG key per row: a row with id r draws from fold_in(key, r), whatever batch or process it runs in, so
  the samples do not depend on how a request is split into calls (sampler.max_batch) or over hosts."""
  return jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.asarray(ids_B, jnp.uint32))


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


@functools.partial(jax.jit, static_argnames=("spec", "dtype", "max_new", "greedy", "top_k", "use_top_p",
                                             "no_repeat_ngram"))
def decode_tokens(params, cache, logits_UV, pos_U, src_B, is_pad_B, keys_B, temperature, top_p, eos_E, stop_NL, *,
                  spec: ModelSpec, dtype, max_new: int, greedy: bool, top_k: int, use_top_p: bool,
                  no_repeat_ngram: int = 0):
  """Samples up to `max_new` tokens for rows B from prefilled rows U (start_rows), every row to its end.
  keys_B (row_keys) are the rows' PRNG keys, folded with the step.
  Returns tokens_BN (0 after a row ends), logps_BN (0 after), lengths_B and reason_B (STOP_* codes)."""
  rows = start_rows(cache, logits_UV, pos_U, src_B, is_pad_B, keys_B, stop_NL.shape[1], max_new)
  r = decode(params, rows, temperature, top_p, eos_E, stop_NL, False, spec=spec, dtype=dtype, max_new=max_new,
             greedy=greedy, top_k=top_k, use_top_p=use_top_p, no_repeat_ngram=no_repeat_ngram)
  return r.tokens_BN, r.logps_BN, r.lengths_B, r.reason_B


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
  refill: bool = False  # rollouts on rows that refill (seed_jax/slots.py) where one process runs the job
  prefix_reuse_mb: int = 0  # > 0: prompts reuse heads prefilled in the same call or rollout (seed_jax/prefix.py)


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
    self.heads: prefix.Heads | None = None  # the open reuse scope's prefilled prompts (reuse_scope)

  @contextlib.contextmanager
  def reuse_scope(self):
    """Prompts prefilled inside share their heads (seed_jax/prefix.py); the weights do not change inside. Text
    prompts of one process (several would have to agree on every reuse)."""
    opened = (self.heads is None and self.cfg.prefix_reuse_mb > 0 and self.spec.vision is None
              and jax.process_count() == 1)
    if opened:
      self.heads = prefix.Heads(self.prompt_sizes[0], self.cfg.prefix_reuse_mb << 20)
    try:
      yield
    finally:
      if opened:
        self.heads = None

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
      self.check_prompt(i, p)
    stop_NL = _stop_array(stop_sequences)
    row_ids = list(range(len(prompts))) if row_ids is None else list(row_ids)
    out: list[Generation] = []
    step = self.batch_sizes[-1]
    (calls,) = distributed.agree_max(-(-len(prompts) // step))  # every process makes the same calls
    with self.reuse_scope():
      for start in range(0, calls * step, step):
        out += self._generate_batch(params, prompts[start:start + step], key, row_ids[start:start + step], sp,
                                    stop_NL, images[start:start + step])
    return out

  def check_prompt(self, i: int, prompt: Sequence[int]) -> None:
    """Prompt i must hold 1 to max_prompt_len tokens."""
    if len(prompt) == 0:
      raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
    if len(prompt) > self.cfg.max_prompt_len:
      raise ValueError(f"prompt {i} has {len(prompt)} tokens, more than sampler max_prompt_len="
                       f"{self.cfg.max_prompt_len}; truncate it before sampling")

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
    unique, frames_U, src_N = _distinct(prompts, frames)
    B, Pn, U, dedup = distributed.agree_max(
        bucket(max(len(prompts), 1), self.batch_sizes, "batch"),
        bucket(max(map(len, prompts), default=1), self.prompt_sizes, "prompt length"),
        bucket(max(len(unique), 1), self.batch_sizes, "batch"), len(unique) != len(prompts))
    # This process's prefilled rows start at u0 of the global U: its rows' sources index from there.
    u0 = 0 if self.mesh is None else distributed.row_block(self.mesh, U * jax.process_count())[0]
    src_B = None if not dedup else u0 + np.pad(src_N, (0, B - len(prompts)), constant_values=U - 1)
    is_pad_B = np.arange(B) >= len(prompts)
    decode_static = self._decode_static(sp)
    if self.compiles.see(("decode", U, B, src_B is None, Pn, stop_NL.shape,
                          tuple(sorted(decode_static.items(), key=str)))):
      log.info("compiling decode: batch %d, prompt %d, max_new %d (%d programs)", B, Pn, sp.max_new_tokens,
               self.compiles.count)
    rows = (lambda a: a) if self.mesh is None else (lambda a: distributed.global_batch(a, self.mesh))
    ids_B = np.zeros((B,), np.uint32)
    ids_B[:len(prompts)] = row_ids
    with self._on_mesh():
      cache, logits, pos = self._prefill(params, unique, frames_U, U, Pn, sp.max_new_tokens, rows)
      t1 = time.perf_counter()
      out = decode_tokens(
          params, cache, logits, pos, None if src_B is None else rows(src_B), rows(is_pad_B),
          row_keys(key, rows(ids_B)),
          jnp.float32(max(sp.temperature, 1e-6)), jnp.float32(sp.top_p), jnp.asarray(self.eos_E),
          jnp.asarray(stop_NL), **decode_static)
      toks, logps, lens, reason = (distributed.local_rows(x) for x in out)  # this process's rows
    self.times["decode_s"] += time.perf_counter() - t1
    lens_N = lens[:len(prompts)]
    # The decode loop runs until its longest row ends: every row, padding included, pays for those steps.
    steps = int(distributed.agree_max(int(lens_N.max(initial=0)))[0])  # the loop ran for the longest row anywhere
    self.tokens.add(TokenCount(response_forwarded=B * steps, response_real=int(lens_N.sum()),
                               rows_forwarded=B, rows_real=len(prompts), decode_steps=steps))
    return [Generation(tokens=toks[b, :lens[b]].tolist(), logps=logps[b, :lens[b]].tolist(),
                       stop_reason=STOP_NAMES[reason[b]]) for b in range(len(prompts))]

  def _decode_static(self, sp: SamplingParams) -> dict:
    greedy = sp.temperature == 0
    return dict(spec=self.spec, dtype=jnp.dtype(self.cfg.dtype), max_new=sp.max_new_tokens, greedy=greedy,
                top_k=0 if greedy else sp.top_k, use_top_p=not greedy and sp.top_p < 1.0,
                no_repeat_ngram=sp.no_repeat_ngram)

  def _on_mesh(self):
    return jax.set_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()

  def _prefill(self, params, unique, frames_U, U: int, Pn: int, max_new: int, rows=lambda a: a):
    """The KV cache (Pn + max_new slots), next-token logits and next positions of prompts `unique` (with their
    frames), left-padded into U rows of Pn; counts the prompt positions and the wall time. Inside a reuse
    scope, text prompts reuse the heads prefilled before them."""
    if self.heads is not None and all(f is None for f in frames_U):
      return self._prefill_reusing(params, unique, U, Pn, max_new)
    return self._prefill_full(params, unique, frames_U, U, Pn, max_new, rows)

  def _prefill_full(self, params, unique, frames_U, U: int, Pn: int, max_new: int, rows=lambda a: a):
    tokens_UP = np.zeros((U, Pn), np.int32)
    valid_UP = np.zeros((U, Pn), bool)
    for u, p in enumerate(unique):
      tokens_UP[u, Pn - len(p):] = p
      valid_UP[u, Pn - len(p):] = True
    image_batch = images_lib.call_images(U, Pn, [(u, Pn - len(p), p, (), f)
                                                 for u, (p, f) in enumerate(zip(unique, frames_U))],
                                         self.spec.vision, self.mesh)
    n_patches = 0 if image_batch is None else image_batch.pixels_NP.shape[0]
    static = dict(spec=self.spec, dtype=jnp.dtype(self.cfg.dtype), max_new=max_new,
                  prefill_chunk=self.cfg.prefill_chunk)
    if self.compiles.see(("prefill", U, Pn, n_patches, tuple(sorted(static.items(), key=str)))):
      log.info("compiling prefill: batch %d, prompt %d, image patches %d (%d programs)", U, Pn, n_patches,
               self.compiles.count)
    t0 = time.perf_counter()
    out = jax.block_until_ready(prefill_prompts(params, rows(tokens_UP), rows(valid_UP), image_batch, **static))
    self.times["prefill_s"] += time.perf_counter() - t0
    self.tokens.add(TokenCount(prompt_forwarded=U * Pn, prompt_real=sum(map(len, unique))))
    return out

  def _prefill_reusing(self, params, unique, U: int, Pn: int, max_new: int):
    """`_prefill` where prompts share heads (prefix.Heads): the prompts with no head to reuse are prefilled
    together, then each other one prefills its tail after the head it shares with a prompt prefilled before it
    (in this call or earlier in the scope), into its row of the U rows of Pn + max_new slots: the head
    left-padded in the Pn - Tn slots before the tail's bucket Tn."""
    heads, chunk, dtype = self.heads, self.cfg.prefill_chunk, jnp.dtype(self.cfg.dtype)
    tail = lambda p, s: bucket(len(p) - s, self.prompt_sizes, "prompt length")
    # The tail attends its [Tn, Pn] scores at once (prefill_after_head): calls long enough to attend tile by
    # tile, and tails prefilled in chunks, are prefilled whole, as are tails whose bucket is the call's.
    fits = lambda p: lambda s: (tail(p, s) < Pn and not 0 < chunk < tail(p, s) and not self.spec.blockwise(Pn))
    plan: list[tuple[prefix.Entry | None, tuple[prefix.Entry, int] | None]] = []  # kept entry, (source, head)
    for p in unique:
      entry = prefix.Entry(np.asarray(p, np.int32), Pn * prefix.slot_bytes(self.spec, dtype))
      match = heads.match(entry.ids, fits(p))
      sources = [m[0] for _, m in plan + [(None, match)] if m is not None]  # kept while this call runs
      plan.append((entry if heads.keep(entry, sources) else None, match))
    full = [u for u, (_, m) in enumerate(plan) if m is None]
    if full:
      cache, logits, pos = self._prefill_full(params, [unique[u] for u in full], [None] * len(full),
                                              bucket(len(full), self.batch_sizes, "batch"), Pn, max_new)
      for i, u in enumerate(full):
        if (entry := plan[u][0]) is not None:
          entry.cache, entry.slot_N = prefix.row(cache, i, Pn), Pn - len(entry.ids) + np.arange(len(entry.ids))
      if len(full) == len(unique):
        return cache, logits, pos
      at = {u: i for i, u in enumerate(full)}
      cache, logits, pos = prefix.take_rows(cache, logits, pos, jnp.asarray([at.get(u, 0) for u in range(U)]))
    else:
      cache, logits, pos = prefix.empty(spec=self.spec, rows=U, prompt=Pn, max_new=max_new, dtype=dtype)
    t0 = time.perf_counter()
    for u, (entry, match) in enumerate(plan):
      if match is None:
        continue
      (src, shared), p = match, unique[u]
      Tn = tail(p, shared)
      H = Pn - Tn
      s = min(shared, H)  # a tail bucket rounded past the shared tokens takes the head's last ones
      t = len(p) - s
      tokens_1T, valid_1T = np.zeros((1, Tn), np.int32), np.zeros((1, Tn), bool)
      tokens_1T[0, Tn - t:], valid_1T[0, Tn - t:] = p[s:], True
      slot_H = np.zeros((H,), np.int32)  # the padding slots read slot 0, masked out
      slot_H[H - s:] = src.slot_N[:s]
      src_slots = src.cache.segment_BS.shape[1]
      if self.compiles.see(("prefill_row", src_slots, U, Pn, Tn, max_new, self.cfg.dtype)):
        log.info("compiling prefill after a shared head: head from %d slots, batch %d, prompt %d, tail %d "
                 "(%d programs)", src_slots, U, Pn, Tn, self.compiles.count)
      cache, logits, pos, kept = prefix.prefill_row(params, src.cache, slot_H, (np.arange(H) >= H - s)[None],
                                                    tokens_1T, valid_1T, cache, logits, pos, u,
                                                    spec=self.spec, dtype=dtype, max_new=max_new)
      if entry is not None:
        entry.cache, entry.slot_N = kept, np.concatenate([H - s + np.arange(s), Pn - t + np.arange(t)])
      self.tokens.add(TokenCount(prompt_forwarded=Tn, prompt_real=len(p), prompt_reused=s))
    jax.block_until_ready(cache)
    self.times["prefill_s"] += time.perf_counter() - t0
    return cache, logits, pos


def _distinct(prompts, frames):
  """The distinct prompts (a prompt with a frame is identical only with the same frame), their frames and each
  prompt's index among them: a group's G rollouts share their first prompt, prefilled once and its cache
  copied to its rows (rows are independent, so each row's numbers are the ones its own prefill gives)."""
  keys = [(tuple(p), None if f is None else f.key) for p, f in zip(prompts, frames)]
  first: dict[tuple, int] = {}  # distinct prompt (with its frame) -> its first row
  for n, k in enumerate(keys):
    first.setdefault(k, n)
  index = {k: u for u, k in enumerate(first)}
  return ([prompts[n] for n in first.values()], [frames[n] for n in first.values()],
          np.asarray([index[k] for k in keys], np.int32))


def _stop_array(stop_sequences: Sequence[Sequence[int]]) -> np.ndarray:
  seqs = [list(s) for s in stop_sequences if len(s)]
  L = max([len(s) for s in seqs], default=1)
  arr = np.full((max(len(seqs), 1), L), -1, np.int32)
  for n, s in enumerate(seqs):
    arr[n, L - len(s):] = s
  return arr

