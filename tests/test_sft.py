"""Stage 1 SFT: packing and its masks, the packed loss against per-record references, overfitting 16 records
(loss and exact greedy reproduction through the exported HF folder), and checkpoint resume."""
import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import textworld_express as twx_config
from seed_jax import sft, skills
from seed_jax.infra.mesh import make_mesh
from seed_jax.models import load
from seed_jax.models import transformer as tf
from seed_jax.models.spec import ModelSpec
from seed_jax.sample import Sampler, SamplerConfig, SamplingParams
from stage1_helpers import random_params, small_tokenizer_folder, tiny_model_folder

A = sft.Example(prompt=[11, 12, 13], response=[14, 15, 2])
B = sft.Example(prompt=[21, 22], response=[23, 2])
C = sft.Example(prompt=[31, 31, 31, 31, 31], response=[32, 33, 34, 2])


def test_pack_layout_and_loss_mask_token_by_token():
  p = sft.pack([A, B, C], max_len=16, min_len_bucket=8)
  # Longest first: C (9) and A (6) share row 0 (15 <= 16), B (4) no longer fits there and opens row 1.
  assert p.tokens_RL.tolist() == [[31, 31, 31, 31, 31, 32, 33, 34, 2, 11, 12, 13, 14, 15, 2, 0],
                                  [21, 22, 23, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]]
  assert p.segment_RL.tolist() == [[1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 0],
                                   [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]]
  assert p.positions_RL.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3, 4, 5, 0],
                                     [0, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]]
  # Loss on the response tokens and the EOS only: never on a prompt token or padding.
  assert p.loss_mask_RL.astype(int).tolist() == [[0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 0],
                                                 [0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]]
  # Predicting positions (t for target t+1), 16 loss slots (the smallest bucket).
  assert p.idx_RK.shape == (2, 16)
  assert p.idx_RK[0, :7].tolist() == [4, 5, 6, 7, 11, 12, 13] and p.kmask_RK[0].sum() == 7
  assert p.targets_RK[0, :7].tolist() == [32, 33, 34, 2, 14, 15, 2]
  assert p.idx_RK[1, :2].tolist() == [1, 2] and p.targets_RK[1, :2].tolist() == [23, 2] and p.kmask_RK[1].sum() == 2
  # micro_rows=4: the row count is a multiple of the micro-batch (padding rows are all segment 0).
  p4 = sft.pack([A, B, C], max_len=16, min_len_bucket=8, micro_rows=4)
  assert p4.tokens_RL.shape == (4, 16) and not p4.segment_RL[2:].any() and not p4.kmask_RK[2:].any()
  with pytest.raises(ValueError, match=r"records of \[9\] tokens exceed sft.max_len=8"):
    sft.pack([A, C], max_len=8)


@pytest.fixture(scope="module")
def tok(embedded_tokenizer):
  return embedded_tokenizer


def test_encode_record_and_bad_records(tok):
  e = sft.encode_record(tok, {"prompt": "Analyse this.", "response": '{"a": 1}'})
  assert e.prompt == tok.encode_chat("Analyse this.")
  assert e.response == tok.encode('{"a": 1}') + [2] and tok.decode([2], skip_special_tokens=False) == "<|im_end|>"
  with pytest.raises(ValueError, match="field 'response' must be a non-empty string"):
    sft.encode_record(tok, {"prompt": "x", "response": ""})


SPEC = ModelSpec("LlamaForCausalLM", vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, ffn_dim=64)


def test_packed_loss_equals_each_record_alone():
  """No attention across records and positions restarting per record: a packed row gives every record the
  same log-likelihood as a forward over that record alone."""
  params = random_params(SPEC, 3)
  params["embed"] = params["embed"] * 30
  rng = np.random.default_rng(0)
  examples = [sft.Example(rng.integers(3, 64, n).tolist(), rng.integers(3, 64, m).tolist()) for n, m in
              [(7, 3), (2, 5), (11, 1), (4, 4), (9, 6)]]
  # Reference: all records in one ordinary left-padded batch (one segment per row), log-softmax in numpy.
  T = max(map(len, examples))
  tokens, valid = np.zeros((len(examples), T), np.int32), np.zeros((len(examples), T), bool)
  for b, e in enumerate(examples):
    tokens[b, T - len(e):], valid[b, T - len(e):] = e.prompt + e.response, True
  logits = np.asarray(jax.jit(lambda p, t, v: tf.full_logits(p, SPEC, t, v))(params, tokens, valid), np.float64)
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
  expect = [-sum(logp[b, T - len(e.response) - 1 + r, tok] for r, tok in enumerate(e.response))
            for b, e in enumerate(examples)]
  batch = sft.pack(examples, max_len=32, min_len_bucket=8)
  assert batch.tokens_RL.shape[0] < len(examples)  # several records share rows
  nll, count = jax.jit(functools.partial(sft.nll_sums, spec=SPEC, dtype=jnp.float32, chunk=4, remat=False))(
      params, batch)
  assert int(count) == 19
  assert np.isclose(float(nll), sum(expect), rtol=1e-5)


NOUNS = ["coin", "apple", "key", "lamp", "book", "cup", "sock", "ring", "pen", "hat", "map", "egg", "fan", "box",
         "jar", "bell"]
RECORDS = [dict(prompt=f"Episode {i}: the agent looked for the {n}.\nReply with JSON.",
                response=skills.format_skill_json(f"Found the {n}.", f"Take the {n} first.")) for i, n in enumerate(NOUNS)]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
  """A tiny model with a small trained BPE vocabulary (fast to train), and the 16 records as JSONL."""
  root = tmp_path_factory.mktemp("small")
  folder = small_tokenizer_folder(str(root / "model"), [r["prompt"] for r in RECORDS] + [r["response"] for r in RECORDS])
  tiny_model_folder(folder, load.load_tokenizer(folder), dim=64, n_layers=2)
  data = root / "records.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
  return folder, str(data)


def _sft_cfg(tmp_path, model: str, data: str):
  cfg = twx_config.get_config("sft")
  cfg.model.path = model
  cfg.log.tensorboard = False
  s = cfg.sft
  s.data, s.export_dir = data, str(tmp_path / "export")
  s.max_len, s.min_len_bucket, s.val_frac, s.vocab_chunk = 128, 32, 0.0, 32
  return cfg


def one_device_mesh():
  return make_mesh((1, 1, 1), jax.devices()[:1])


@pytest.mark.slow
def test_overfits_16_records_and_greedy_decoding_reproduces_them(small, tmp_path):
  cfg = _sft_cfg(tmp_path, *small)
  s = cfg.sft
  s.epochs, s.batch_size, s.lr, s.schedule, s.weight_decay = 260, 16, 3e-3, "constant", 0.0
  s.checkpoint.save_interval_steps = 1000
  out = sft.train(cfg, str(tmp_path / "run"), mesh=one_device_mesh())
  assert out["metrics"]["sft/loss"] < 0.01
  assert (out["metrics"]["sft/train_records"], out["metrics"]["sft/steps"], out["metrics"]["sft/compiles"]) == (16, 260, 1)
  # The exported folder loads back (weights + tokenizer) and greedy decoding gives each target exactly.
  spec, params = load.load_model(out["export_dir"])
  tok = load.load_tokenizer(out["export_dir"])
  sampler = Sampler(spec, tok.eos_ids, SamplerConfig(max_prompt_len=64, max_batch=16, dtype="float32"))
  gens = sampler.generate(params, [tok.encode_chat(r["prompt"]) for r in RECORDS], jax.random.key(0),
                          SamplingParams(temperature=0.0, max_new_tokens=40))
  assert [tok.decode(g.tokens) for g in gens] == [r["response"] for r in RECORDS]
  assert {g.stop_reason for g in gens} == {"eos"}


@pytest.mark.slow
def test_resume_from_a_checkpoint_ends_where_an_uninterrupted_run_ends(small, tmp_path):
  cfg = _sft_cfg(tmp_path, *small)
  s = cfg.sft
  s.epochs, s.batch_size, s.lr, s.val_frac = 2, 4, 1e-3, 0.25  # 12 train / 4 val records: 3 steps per epoch
  s.checkpoint.save_interval_steps, s.checkpoint.async_save = 2, False
  full = sft.train(cfg, str(tmp_path / "full"), mesh=one_device_mesh())
  m = full["metrics"]
  assert (m["sft/train_records"], m["sft/val_records"], m["sft/steps"]) == (12, 4, 6)
  assert m["sft/val_loss"] > 0 and np.isfinite(m["sft/loss"])
  ckpts = tmp_path / "full" / "sft_checkpoints"
  assert sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) == [2, 4, 6]
  # "Crash" after step 2: its checkpoint survives; the run restarts in a fresh folder from it.
  shutil.copytree(ckpts / "2", tmp_path / "cut" / "sft_checkpoints" / "2")
  s.export_dir = str(tmp_path / "export_cut")
  cut = sft.train(cfg, str(tmp_path / "cut"), mesh=one_device_mesh())
  lines = [json.loads(l) for l in open(tmp_path / "cut" / "sft" / "metrics.jsonl")]
  assert [l["step"] for l in lines] == [3, 4, 5, 6]  # resumed after step 2
  a = jax.tree.leaves(load.load_model(full["export_dir"])[1])
  b = jax.tree.leaves(load.load_model(cut["export_dir"])[1])
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
