"""Shared by the Stage 1 tests: a tiny random model with the embedded tokenizer's vocabulary, as an HF folder."""
from __future__ import annotations

from seed_jax.envs.base import Step, Task, Trajectory


def random_params(spec, seed: int = 0, scale: float = 0.02) -> dict:
  """Random weights in numpy (norms 1, biases 0, matrices N(0, scale)): the layout of transformer.init_params
  without building the NNX module, which costs seconds of eager dispatch per call."""
  import numpy as np
  from seed_jax.models import transformer as tf
  rng = np.random.default_rng(seed)
  make = lambda name, shape: (np.ones(shape, np.float32) if name.endswith("norm") else
                              np.zeros(shape, np.float32) if name in ("bq", "bk", "bv") else
                              (scale * rng.standard_normal(shape)).astype(np.float32))
  shapes = tf.param_shapes(spec)
  params = {k: make(k, v) for k, v in shapes.items() if k != "layers"}
  params["layers"] = {k: make(k, v) for k, v in shapes["layers"].items()}
  return params


def tiny_model_folder(path: str, tok, dim: int = 32, n_layers: int = 1, seed: int = 0) -> str:
  """Writes a random Llama-family model (tied embeddings) with `tok`'s vocabulary and the tokenizer files."""
  from seed_jax import sft
  from seed_jax.models.spec import ModelSpec
  spec = ModelSpec("LlamaForCausalLM", vocab_size=tok.vocab_size, dim=dim, n_layers=n_layers, n_heads=2,
                   n_kv_heads=1, head_dim=dim // 2, ffn_dim=2 * dim, tie_embeddings=True, max_seq_len=4096,
                   bos_token_id=tok.hf.bos_token_id, eos_token_id=tok.hf.eos_token_id)
  sft.export(random_params(spec, seed), spec, tok, path)
  return path


def step(observation: str, action: str, valid: bool = True, reason: str = "") -> Step:
  response = f"<think>t</think><action>{action}</action>" if valid else action
  return Step(prompt_text="", prompt_tokens=[], response_text=response, response_tokens=[], logps=[],
              observation=observation, action=action, action_valid=valid,
              info={"invalid_reason": reason} if reason else {})


def trajectory(task: Task, steps: list[Step], ret: float, termination: str, description: str = "find the coin",
               traj_id: int = 0) -> Trajectory:
  return Trajectory(task=task, group_id=0, traj_id=traj_id, steps=steps, episode_return=ret, success=ret >= 1,
                    termination=termination, task_description=description)


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def small_tokenizer_folder(path: str, texts: list[str], vocab_size: int = 400) -> str:
  """A byte-level BPE trained on `texts` with ChatML special tokens, saved as an HF tokenizer folder: a real
  tokenizer whose small vocabulary keeps tiny-model training fast."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast
  raw = Tokenizer(models.BPE())
  raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  raw.decoder = decoders.ByteLevel()
  raw.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  hf = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                               bos_token="<|im_start|>", clean_up_tokenization_spaces=False)
  hf.chat_template = CHATML
  hf.save_pretrained(path)
  return path
