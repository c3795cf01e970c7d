"""Shared test helpers: the repo's paths and tiny Hugging Face reference models."""
from __future__ import annotations

import functools
import pathlib

import numpy as np

TESTS = pathlib.Path(__file__).resolve().parent
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-5,
            rope_theta=10000.0)


def hf_tiny_model(arch: str, tie: bool = False, rope_scaling: dict | None = None, seed: int = 0):
  """A randomly initialized fp32 `transformers` model of the given architecture (eager attention)."""
  import torch
  import transformers as T
  cls = {"llama": (T.LlamaConfig, T.LlamaForCausalLM), "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM),
         "qwen3": (T.Qwen3Config, T.Qwen3ForCausalLM)}[arch]
  kw = dict(TINY, tie_word_embeddings=tie, attn_implementation="eager")
  if rope_scaling is not None:
    kw["rope_scaling"] = rope_scaling
  if arch == "qwen2":
    kw.pop("head_dim")
  torch.manual_seed(seed)
  model = cls[1](cls[0](**kw)).eval()
  with torch.no_grad():  # untouched norms are all ones: perturb them so norm weights are really tested
    for name, p in model.named_parameters():
      if "norm" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  return model


def hf_logits(model, tokens_BT: np.ndarray, valid_BT: np.ndarray) -> np.ndarray:
  """Reference logits with left padding expressed as an attention mask and explicit positions."""
  import torch
  pos = np.maximum(np.cumsum(valid_BT, axis=1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens_BT, dtype=torch.long),
                attention_mask=torch.tensor(valid_BT.astype(np.int64)),
                position_ids=torch.tensor(pos, dtype=torch.long))
  return out.logits.float().numpy()


def left_padded(rng: np.random.Generator, lengths: list[int], vocab: int, T: int):
  tokens = np.zeros((len(lengths), T), np.int32)
  valid = np.zeros((len(lengths), T), np.int32)
  for b, n in enumerate(lengths):
    tokens[b, T - n:] = rng.integers(3, vocab, n)
    valid[b, T - n:] = 1
  return tokens, valid



def sequence_logits(params, spec, seq, length: int = 64) -> np.ndarray:
  """`transformer.full_logits` of one unpadded sequence, [len(seq), V]. The row is left-padded to `length`
  (full_logits' own layout: padding changes no real position's logits) and run by one jitted program, so a
  reference over many sequence lengths compiles the forward once instead of once per length."""
  import jax.numpy as jnp
  if len(seq) > length:
    raise ValueError(f"a sequence of {len(seq)} tokens does not fit length {length}")
  tokens, valid = np.zeros((1, length), np.int32), np.zeros((1, length), bool)
  tokens[0, length - len(seq):], valid[0, length - len(seq):] = seq, True
  return np.asarray(jitted_full_logits()(params, spec, jnp.asarray(tokens), jnp.asarray(valid)))[0, length - len(seq):]


@functools.cache
def jitted_full_logits():
  """`transformer.full_logits` jitted once per test process (the spec static): the tests' reference forward."""
  import jax
  from seed_jax.models import transformer
  return jax.jit(transformer.full_logits, static_argnums=1)


def save_tiny_llama(path: str, tok, dim: int = 32, n_layers: int = 1, n_heads: int = 2, n_kv_heads: int = 1,
                    ffn_dim: int = 64, seed: int = 0) -> str:
  """A random Llama with `tok`'s vocabulary (tied embeddings, head_dim 16) saved with `tok` as an HF folder."""
  from seed_jax.models import transformer, weights
  from seed_jax.models.spec import ModelSpec
  spec = ModelSpec("LlamaForCausalLM", vocab_size=tok.vocab_size, dim=dim, n_layers=n_layers, n_heads=n_heads,
                   n_kv_heads=n_kv_heads, head_dim=16, ffn_dim=ffn_dim, tie_embeddings=True, bos_token_id=1,
                   eos_token_id=2)
  weights.export_hf(transformer.init_params(spec, seed), spec, path)
  tok.hf.save_pretrained(path)
  return path
