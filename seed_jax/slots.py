"""Rows that refill: a fixed set of decode slots; when a row ends, the next waiting prompt is prefilled into its
slot while the other rows keep decoding, so a call computes about as many slot-steps as it samples tokens
instead of running every row until the longest one ends.

`serve` drives it from the host: fill the free slots (prefilling the waiting prompts into them), decode until a
row ends, hand the finished rows to `on_done`, which may answer with new requests (a multi-turn rollout gives
the episode's next prompt, rollout.run_episodes), and go on until no row is busy and nothing waits. Each row
samples what `Sampler.generate` samples for the same prompt and key: the rows are independent, a row's draws
depend only on its own key and step.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from seed_jax import decode
from seed_jax.buckets import TokenCount, bucket
from seed_jax.sample import Generation, Sampler, SamplingParams, _distinct, _stop_array, row_keys

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Request:
  ids: Sequence[int]  # the prompt's token ids (chat-templated)
  key: jax.Array  # the row's PRNG key: what sample.row_keys gives the prompt in a generate call
  frame: Any = None  # an images.Image, or None
  tag: Any = None  # the caller's, handed back with the generation


OnDone = Callable[[list[tuple[Request, Generation]]], Sequence[Request]]


def serve(sampler: Sampler, params, requests: Sequence[Request], sp: SamplingParams, on_done: OnDone,
          stop_sequences: Sequence[Sequence[int]] = (), follows: bool = True) -> None:
  """Generates every request, and every request `on_done` returns, on at most sampler.cfg.max_batch slots
  (the batch bucket of the first requests). `follows` False: on_done never returns requests, so once none
  waits the rows run to their ends without stopping for the host. One process only: a pod's processes would
  have to agree on every refill (Sampler.generate serves them)."""
  if jax.process_count() > 1:
    raise ValueError("rows that refill run in one process; with several, the rollout uses Sampler.generate")
  waiting = collections.deque(requests)
  if not waiting:
    return
  for n, r in enumerate(waiting):
    sampler.check_prompt(n, r.ids)
  S = bucket(min(len(waiting), sampler.batch_sizes[-1]), sampler.batch_sizes, "batch")
  stop_NL = jnp.asarray(_stop_array(stop_sequences))
  static = sampler._decode_static(sp)
  floats = (jnp.float32(max(sp.temperature, 1e-6)), jnp.float32(sp.top_p), jnp.asarray(sampler.eos_E), stop_NL)
  busy: dict[int, Request] = {}  # slot -> its request
  rows, Pn = None, 0
  with sampler._on_mesh(), sampler.reuse_scope():  # a prompt reuses the heads of those prefilled before it
    ready = decode.prepare_params(params, dtype=static["dtype"])  # for every decode call below
    while waiting or busy:
      if waiting and len(busy) < S:
        take = [waiting.popleft() for _ in range(min(S - len(busy), len(waiting)))]
        need = bucket(max(len(r.ids) for r in take), sampler.prompt_sizes, "prompt length")
        if rows is None:
          Pn = need
          rows = decode.empty_rows(jnp.stack([take[0].key] * S), spec=sampler.spec, dtype=static["dtype"],
                                   length=Pn + sp.max_new_tokens, stop_len=stop_NL.shape[1],
                                   max_new=sp.max_new_tokens)
        elif need > Pn:  # a longer prompt bucket: every row moves right, its cache intact
          log.info("rows that refill: prompt bucket %d -> %d", Pn, need)
          rows, Pn = decode.grow_rows(rows, pad=need - Pn), need
        free = [b for b in range(S) if b not in busy]
        rows = _fill(sampler, params, rows, take, free, need, sp.max_new_tokens)
        busy.update(zip(free, take))
      if sampler.compiles.see(("decode_rows", S, Pn, stop_NL.shape, tuple(sorted(static.items(), key=str)))):
        log.info("compiling decode rows: %d slots, prompt %d, max_new %d (%d programs)", S, Pn, sp.max_new_tokens,
                 sampler.compiles.count)
      steps_before = int(rows.steps)
      t0 = time.perf_counter()
      # Stop at the first row that ends while anything may still refill it; otherwise run every row to its end.
      rows = decode.decode_rows(ready, rows, *floats, jnp.bool_(bool(waiting) or follows), **static)
      done_B, lens_B, reason_B = jax.device_get((rows.done_B, rows.lengths_B, rows.reason_B))
      sampler.times["decode_s"] += time.perf_counter() - t0
      finished = [b for b in busy if done_B[b]]
      toks_BN, logps_BN = jax.device_get((rows.tokens_BN, rows.logps_BN))
      out = [(busy.pop(b), Generation(tokens=toks_BN[b, :lens_B[b]].tolist(), logps=logps_BN[b, :lens_B[b]].tolist(),
                                      stop_reason=decode.STOP_NAMES[reason_B[b]])) for b in finished]
      steps = int(rows.steps) - steps_before
      sampler.tokens.add(TokenCount(response_forwarded=S * steps, decode_steps=steps,
                                    response_real=int(sum(lens_B[b] for b in finished))))
      for r in on_done(out):
        sampler.check_prompt(len(waiting), r.ids)  # its place in the queue
        waiting.append(r)


def _fill(sampler: Sampler, params, rows: decode.Rows, take: list[Request], free: list[int], Pn: int, max_new: int):
  """The requests `take` prefilled at prompt bucket Pn (each distinct prompt once; the rows' bucket may be
  longer) into slots free[:len(take)]."""
  unique, frames_U, src_M = _distinct([r.ids for r in take], [r.frame for r in take])
  U = bucket(len(unique), sampler.batch_sizes, "batch")
  M = bucket(len(take), sampler.batch_sizes, "batch")
  cache, logits_UV, pos_U = sampler._prefill(params, unique, frames_U, U, Pn, max_new)
  S = rows.done_B.shape[0]
  slot_M = np.full((M,), S, np.int32)  # S: padding, dropped by insert_rows
  slot_M[:len(take)] = free[:len(take)]
  keys_M = jnp.stack([r.key for r in take] + [take[0].key] * (M - len(take)))
  sampler.tokens.add(TokenCount(rows_forwarded=M, rows_real=len(take)))
  return decode.insert_rows(rows, cache, logits_UV, pos_U, jnp.asarray(np.pad(src_M, (0, M - len(take)))),
                            jnp.asarray(slot_M), keys_M)


def generate(sampler: Sampler, params, prompts: Sequence[Sequence[int]], key, sp: SamplingParams,
             stop_sequences: Sequence[Sequence[int]] = (), images: Sequence | None = None,
             row_ids: Sequence[int] | None = None) -> list[Generation]:
  """Sampler.generate's results (row r draws with fold_in(key, row_ids[r])), on rows that refill: more prompts
  than slots flow through the slots instead of running as batches one after the other."""
  row_ids = list(range(len(prompts))) if row_ids is None else list(row_ids)
  keys = list(row_keys(key, row_ids))
  images = [None] * len(prompts) if images is None else list(images)
  out: dict[int, Generation] = {}

  def collect(finished):
    out.update((r.tag, g) for r, g in finished)
    return ()

  serve(sampler, params, [Request(p, k, f, n) for n, (p, k, f) in enumerate(zip(prompts, keys, images))], sp,
        collect, stop_sequences, follows=False)
  return [out[n] for n in range(len(prompts))]


def server(sampler: Sampler, params, sp: SamplingParams, stop_sequences: Sequence[Sequence[int]] = ()
           ) -> Callable[[Sequence[Request], OnDone], None] | None:
  """`serve` with fixed weights and sampling for rollout.run_episodes, where sampler.cfg.refill asks for it
  and the job runs in one process; None otherwise (the rollout then plays turn by turn)."""
  if not sampler.cfg.refill or jax.process_count() > 1:
    return None
  return lambda requests, on_done: serve(sampler, params, requests, sp, on_done, stop_sequences)

