"""Stage 1 training (docs/algorithm.md §2): supervised fine-tuning of the policy to write hindsight skills.

Each record is (analysis prompt, JSON reply). The prompt is the chat template of the analysis prompt with the
generation prompt; the response is the JSON text plus the end-of-turn token, and only response tokens carry
loss. Records are packed into rows: each record is its own segment (no attention across records) with
positions restarting at 0, and the vocabulary projection runs only at the positions that predict response
tokens. An optimizer step takes `batch_size` records and averages the loss over their response tokens.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import time
from typing import Any, Sequence

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from seed_jax import packing, records, stage1
from seed_jax import update as update_lib
from seed_jax.buckets import CompileCounter, bucket, pow2_sizes
from seed_jax.infra import checkpoint as ckpt_lib
from seed_jax.infra import distributed
from seed_jax.infra.metrics import MetricsWriter
from seed_jax.models import load
from seed_jax.models import tokenizer as tokenizer_lib
from seed_jax.models import transformer as tf
from seed_jax.models import weights
from seed_jax.models.logprobs import token_logprobs
from seed_jax.models.spec import ModelSpec

log = logging.getLogger(__name__)
CHECKPOINT_DIR = "sft_checkpoints"  # under the workdir


# ----------------------------------------------------------------------------------------------------------
# Records and packing


@dataclasses.dataclass
class Example:
  prompt: list[int]  # chat-templated analysis prompt with the generation prompt
  response: list[int]  # JSON reply + end-of-turn token

  def __len__(self) -> int:
    return len(self.prompt) + len(self.response)


def end_of_turn_id(tok: tokenizer_lib.Tokenizer) -> int:
  """The token that closes an assistant turn (the tokenizer's eos, e.g. <|im_end|> for ChatML models)."""
  eos = tok.hf.eos_token_id
  if eos is None:
    raise ValueError("the tokenizer has no eos token: SFT responses need one to end the turn")
  return int(eos)


def encode_record(tok: tokenizer_lib.Tokenizer, record: dict) -> Example:
  for field in ("prompt", "response"):
    if not isinstance(record.get(field), str) or not record[field]:
      raise ValueError(f"SFT record field {field!r} must be a non-empty string, got {record.get(field)!r}")
  return Example(tok.encode_chat(record["prompt"]), tok.encode(record["response"]) + [end_of_turn_id(tok)])


def split_train_val(n: int, val_frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Indices (train, val): a seeded permutation, the first ceil(val_frac * n) held out (none if n < 2)."""
  if not 0 <= val_frac < 1:
    raise ValueError(f"sft.val_frac={val_frac} must be in [0, 1)")
  order = np.random.default_rng([seed, 7]).permutation(n)
  n_val = math.ceil(val_frac * n) if n >= 2 else 0
  return np.sort(order[n_val:]), np.sort(order[:n_val])


@flax.struct.dataclass
class Packed:
  """Packed rows of one step [R rows, L tokens]. loss_mask_RL marks the response tokens (the targets);
  idx_RK are the K positions that predict them (t for target t+1), gathered so the vocabulary projection runs
  only there; targets_RK/kmask_RK are those targets and which of the K slots are used."""
  tokens_RL: Any
  positions_RL: Any
  segment_RL: Any
  loss_mask_RL: Any
  idx_RK: Any
  targets_RK: Any
  kmask_RK: Any


def pack(examples: Sequence[Example], max_len: int, min_len_bucket: int = 64, micro_rows: int = 1) -> Packed:
  """Packs one step's records into rows whose length is a power-of-two bucket (min_len_bucket .. max_len) of
  the longest record; the row count is micro_rows times a power of two and the loss slots a power of two, so
  a run compiles few programs. Segment ids are 1, 2, ... within a row (0 = padding); positions restart at 0
  in every record."""
  if not examples:
    raise ValueError("pack needs at least one record")
  too_long = [len(e) for e in examples if len(e) > max_len]
  if too_long:
    raise ValueError(f"records of {too_long} tokens exceed sft.max_len={max_len}")
  L = bucket(max(map(len, examples)), pow2_sizes(min(min_len_bucket, max_len), max_len), "record length")
  layout = packing.first_fit_decreasing([len(e) for e in examples], L)
  R = micro_rows * (1 << (-(-len(layout) // micro_rows) - 1).bit_length())
  tokens, positions, segment = (np.zeros((R, L), np.int32) for _ in range(3))
  loss = np.zeros((R, L), bool)
  for r, members in enumerate(layout):
    a = 0
    for seg, i in enumerate(members, 1):
      e = examples[i]
      n = len(e)
      tokens[r, a:a + n], positions[r, a:a + n], segment[r, a:a + n] = e.prompt + e.response, np.arange(n), seg
      loss[r, a + len(e.prompt):a + n] = True
      a += n
  counts = loss.sum(axis=1)
  K = bucket(int(counts.max()), pow2_sizes(min(16, L), L), "loss tokens")
  idx = np.zeros((R, K), np.int32)
  kmask = np.zeros((R, K), bool)
  for r in range(R):
    where = np.flatnonzero(loss[r]) - 1  # a response token never starts its record: t is in the same segment
    idx[r, :len(where)], kmask[r, :len(where)] = where, True
  targets = np.where(kmask, np.take_along_axis(tokens, idx + 1, axis=1), 0).astype(np.int32)
  return Packed(tokens, positions, segment, loss, idx, targets, kmask)


# ----------------------------------------------------------------------------------------------------------
# Jitted loss and step


def nll_sums(params, batch: Packed, *, spec: ModelSpec, dtype, chunk: int, remat: bool):
  """(sum of -log p over the response tokens, their count) of packed rows."""
  hidden_RLD, _ = tf.forward(params, spec.for_packed_rows(), batch.tokens_RL, batch.positions_RL, batch.segment_RL,
                             None, dtype, remat)
  hidden_RKD = jnp.take_along_axis(hidden_RLD, batch.idx_RK[..., None], axis=1)
  logp_RK, _ = token_logprobs(params, spec, hidden_RKD, batch.targets_RK, batch.kmask_RK, 1.0, dtype=dtype,
                              chunk=min(chunk, batch.idx_RK.shape[1]), remat=remat, with_entropy=False)
  return -jnp.sum(logp_RK), jnp.sum(batch.kmask_RK).astype(jnp.float32)


def place(batch: Packed, micro_rows: int, mesh) -> Packed:
  """A packed step as device arrays [micro-batches, micro_rows, ...]: each micro-batch's rows split over
  data x fsdp where they divide (every process supplying its own block of them), else whole on every device."""
  M = batch.tokens_RL.shape[0] // micro_rows
  grouped = jax.tree.map(lambda x: np.asarray(x).reshape((M, micro_rows) + x.shape[1:]), batch)
  if micro_rows % (mesh.shape["data"] * mesh.shape["fsdp"]):
    whole = NamedSharding(mesh, P())
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(whole, x, x.shape), grouped)
  lo, n = distributed.row_block(mesh, micro_rows)
  return distributed.global_batch(jax.tree.map(lambda x: x[:, lo:lo + n], grouped), mesh, axis=1)


def make_step_fns(spec: ModelSpec, optimizer: optax.GradientTransformation, cfg: ml_collections.ConfigDict):
  """Jitted (train_step(state, batch) -> (state, metrics), eval_sums(params, batch) -> (nll sum, tokens)) over
  batches laid out by `place` (micro-batches first)."""
  kw = dict(spec=spec, dtype=jnp.dtype(cfg.dtype), chunk=cfg.vocab_chunk, remat=cfg.remat)
  grad_fn = jax.value_and_grad(lambda p, mb: nll_sums(p, mb, **kw)[0])

  def train_step(state: update_lib.TrainState, mbs: Packed):
    n_tok = jnp.maximum(jnp.sum(mbs.kmask_RK), 1).astype(jnp.float32)

    def body(carry, mb):
      grads, total = carry
      nll, g = grad_fn(state.params, mb)
      return (jax.tree.map(jnp.add, grads, g), total + nll), None

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    (grads, total), _ = jax.lax.scan(body, (zeros, jnp.float32(0)), mbs)
    grads = jax.tree.map(lambda g: g / n_tok, grads)
    loss, grad_norm = total / n_tok, optax.tree.norm(grads)
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

    def apply(s):
      updates, opt_state = optimizer.update(grads, s.opt_state, s.params)
      return s.replace(step=s.step + 1, params=optax.apply_updates(s.params, updates), opt_state=opt_state)

    state = jax.lax.cond(ok, apply, lambda s: s.replace(skipped=s.skipped + 1), state)
    return state, dict(loss=loss, grad_norm=grad_norm, tokens=n_tok)

  def eval_sums(params, mbs: Packed):
    def body(carry, mb):
      return jax.tree.map(jnp.add, carry, nll_sums(params, mb, **kw)), None
    return jax.lax.scan(body, (jnp.float32(0), jnp.float32(0)), mbs)[0]

  return jax.jit(train_step, donate_argnums=0), jax.jit(eval_sums)


# ----------------------------------------------------------------------------------------------------------
# Training loop


@dataclasses.dataclass
class Dataset:
  train: list[Example]
  val: list[Example]
  dropped: int  # records longer than sft.max_len


def load_dataset(path: str, tok: tokenizer_lib.Tokenizer, cfg: ml_collections.ConfigDict, seed: int) -> Dataset:
  if not os.path.exists(path):
    raise FileNotFoundError(f"no SFT records at {path!r}: run the annotate stage first (or set sft.data)")
  examples = [encode_record(tok, r) for r in records.read_records(path)]
  kept = [e for e in examples if len(e) <= cfg.max_len]
  if not kept:
    raise ValueError(f"{path}: no SFT record fits sft.max_len={cfg.max_len} ({len(examples)} records)")
  tr, va = split_train_val(len(kept), cfg.val_frac, seed)
  return Dataset([kept[i] for i in tr], [kept[i] for i in va], len(examples) - len(kept))


def step_records(n_train: int, batch_size: int, step: int, seed: int) -> np.ndarray:
  """Train-record indices of optimizer step `step`: epoch e visits the records in permutation(seed, e); the
  last batch of an epoch may be smaller. A pure function of the step, so a resumed run continues exactly."""
  per_epoch = -(-n_train // batch_size)
  epoch, b = divmod(step, per_epoch)
  return np.random.default_rng([seed, epoch]).permutation(n_train)[b * batch_size:(b + 1) * batch_size]


def validation_loss(eval_fn, params, val: Sequence[Example], cfg: ml_collections.ConfigDict, mesh) -> float:
  """Mean negative log-likelihood per response token over the held-out records."""
  total = count = 0.0
  for start in range(0, len(val), cfg.batch_size):
    batch = pack(val[start:start + cfg.batch_size], cfg.max_len, cfg.min_len_bucket, cfg.micro_rows)
    with jax.set_mesh(mesh):
      s, c = jax.device_get(eval_fn(params, place(batch, cfg.micro_rows, mesh)))
    total, count = total + float(s), count + float(c)
  return total / max(count, 1.0)


def export(params, spec: ModelSpec, tok: tokenizer_lib.Tokenizer, out_dir: str) -> None:
  """An HF checkpoint folder (config, safetensors, tokenizer files) that load.load_model and
  load.load_tokenizer read back, and that RL starts from (--config.model.path=out_dir). With several processes
  every process takes part in gathering the weights, process 0 writes them, and all return once they are on
  disk."""
  if jax.process_count() > 1:
    params = jax.tree.map(lambda x: multihost_utils.process_allgather(x, tiled=True), params)
  if distributed.is_writer():
    weights.export_hf(params, spec, out_dir)
    tok.hf.save_pretrained(out_dir)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"sft export {out_dir}")


def _on_mesh(tree, mesh):
  """Leaves not yet placed on `mesh` (step counters, optimizer counts) replicated on it, so the first step's
  outputs have the same shardings as its inputs and the step compiles once."""
  replicated = NamedSharding(mesh, P())
  return jax.tree.map(lambda x: x if isinstance(getattr(x, "sharding", None), NamedSharding)
                      else jax.device_put(x, replicated), tree)


def train(cfg: ml_collections.ConfigDict, workdir: str, mesh=None) -> dict[str, Any]:
  """SFT with Orbax checkpoints (a restart resumes at the last saved step); exports the result as an HF folder.
  `mesh` defaults to config.mesh.shape over all devices. Returns {"metrics": final stats, "state": train state,
  "export_dir": folder}."""
  sc = cfg.sft  # its values are config.validate's
  data_path = sc.data or os.path.join(workdir, stage1.RECORDS_FILE)
  export_dir = sc.export_dir or os.path.join(workdir, "export")
  mesh = stage1.stage_mesh(cfg, mesh)
  spec, params = load.load_model(cfg.model.path, mesh)
  spec = spec.with_attention(cfg.model)
  tok = load.load_tokenizer(cfg.model.tokenizer or cfg.model.path)
  data = load_dataset(data_path, tok, sc, cfg.seed)
  per_epoch = -(-len(data.train) // sc.batch_size)
  total = sc.epochs * per_epoch
  opt_cfg = sc.copy_and_resolve_references()
  opt_cfg.total_steps = sc.total_steps or total
  optimizer = update_lib.make_optimizer(opt_cfg)
  train_step, eval_fn = make_step_fns(spec, optimizer, sc)
  log.info("sft: %d train / %d val records (%d longer than max_len dropped), %d steps", len(data.train),
           len(data.val), data.dropped, total)
  fingerprint = ckpt_lib.config_fingerprint(cfg, ["model.path", "seed", "sft.data", "sft.batch_size", "sft.epochs",
                                                  "sft.max_len", "sft.val_frac"])
  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, CHECKPOINT_DIR), sc.checkpoint, fingerprint)
  writer = MetricsWriter(os.path.join(workdir, "sft"), jax.process_index() == 0, cfg.log)
  compiles = CompileCounter()
  timed = [0.0, 0.0]  # tokens and seconds of steps that did not compile
  try:
    state = _on_mesh(update_lib.init_state(params, optimizer), mesh)
    start = 0
    if (found := ckpt.restore_latest(ckpt_lib.abstract_state(state))) is not None:
      state, meta = found
      start = int(meta["next_step"])
      log.info("sft: resumed at step %d", start)
    last: dict[str, Any] = {}
    for step in tqdm.trange(start, total, initial=start, total=total, desc="sft", unit="step", leave=False):
      batch = pack([data.train[i] for i in step_records(len(data.train), sc.batch_size, step, cfg.seed)],
                   sc.max_len, sc.min_len_bucket, sc.micro_rows)
      fresh = compiles.see(batch.tokens_RL.shape + batch.idx_RK.shape)
      t0 = time.perf_counter()
      with jax.set_mesh(mesh):
        state, m = train_step(state, place(batch, sc.micro_rows, mesh))
      m = jax.device_get(m)
      seconds = time.perf_counter() - t0
      tokens = float((batch.segment_RL > 0).sum())
      if not fresh:
        timed[0], timed[1] = timed[0] + tokens, timed[1] + seconds
      metrics = {"sft/loss": m["loss"], "sft/grad_norm": m["grad_norm"], "sft/response_tokens": m["tokens"],
                 "sft/tokens": tokens, "sft/tokens_per_s": tokens / seconds, "sft/epoch": (step + 1) / per_epoch,
                 "sft/skipped_total": int(state.skipped), "sft/compiles": compiles.count}
      due = (step + 1) % sc.val_every == 0 if sc.val_every else (step + 1) % per_epoch == 0
      if data.val and (due or step + 1 == total):
        metrics["sft/val_loss"] = validation_loss(eval_fn, state.params, data.val, sc, mesh)
      last = writer.write(step + 1, metrics)
      ckpt.save(step + 1, state, metadata=dict(next_step=step + 1), force=step + 1 == total)
    ckpt.wait()
    export(state.params, spec, tok, export_dir)
    stats = {k: v for k, v in last.items() if k.startswith("sft/")}
    stats.update({"sft/train_records": len(data.train), "sft/val_records": len(data.val),
                  "sft/dropped_records": data.dropped, "sft/steps": total,
                  "sft/tokens_per_s_steady": timed[0] / timed[1] if timed[1] else None})
    if distributed.is_writer():
      with open(os.path.join(workdir, "sft_stats.json"), "w") as f:
        json.dump(stats, f, indent=2)
    log.info("sft: done; exported to %s", export_dir)
    return {"metrics": stats, "state": state, "export_dir": export_dir}
  finally:
    ckpt.close()
    writer.close()
