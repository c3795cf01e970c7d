"""Tokenizers from an HF folder or from GGUF metadata, chat-template rendering and batch encoding.

The GGUF path needs neither PyTorch nor a hub: the byte-level BPE is rebuilt from the file's vocabulary,
merges and special tokens, with the pre-tokenizer that the file's `tokenizer.ggml.pre` names.
"""
from __future__ import annotations

import json
import os
from typing import Sequence

import numpy as np

# GGUF pre-tokenizer names -> whether digits are split one by one before the byte-level regex.
_GGUF_PRE_DIGITS = {"smollm": True, "starcoder": True, "default": False, "gpt-2": False, "qwen2": False,
                    "llama-bpe": False}
_CONTROL = 3  # gguf TokenType.CONTROL


class Tokenizer:
  """Thin wrapper over a `transformers` fast tokenizer with the calls seed_jax needs."""

  def __init__(self, hf_tokenizer, eos_ids: Sequence[int] | None = None):
    self.hf = hf_tokenizer
    eos = {hf_tokenizer.eos_token_id} if eos_ids is None else set(eos_ids)
    # Chat models end a turn with their end-of-turn token; stop on both it and the document end.
    vocab = hf_tokenizer.get_vocab()
    eos.update(vocab[t] for t in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>") if t in vocab)
    self.eos_ids = tuple(sorted(i for i in eos if i is not None))
    pad = hf_tokenizer.pad_token_id
    self.pad_id = int(pad if pad is not None else self.eos_ids[0])

  @property
  def vocab_size(self) -> int:
    return len(self.hf)

  def chat_prompt(self, user_message: str) -> str:
    """The single-user-message prompt with the generation prompt appended, as text."""
    return self.hf.apply_chat_template([{"role": "user", "content": user_message}], tokenize=False,
                                       add_generation_prompt=True)

  def encode(self, text: str) -> list[int]:
    """Token ids of `text` as is (special-token strings in it are matched; nothing is added)."""
    return self.hf.encode(text, add_special_tokens=False)

  def encode_chat(self, user_message: str, image=None) -> list[int]:
    """The chat-templated ids of one user message. `image` (a frame for the message's `<image>`) needs a
    vision-language tokenizer (images.VLTokenizer)."""
    if image is not None:
      raise ValueError("this tokenizer takes no images: image observations need a vision-language checkpoint "
                       "(config.model.path), or set config.env.observation='text'")
    return self.encode(self.chat_prompt(user_message))

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

  def encode_batch_left_padded(self, texts: Sequence[str], length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded ids [B, T] and a validity mask [B, T] (T = longest, or `length`)."""
    ids = [self.encode(t) for t in texts]
    T = max(map(len, ids)) if length is None else length
    if any(len(i) > T for i in ids):
      raise ValueError(f"a text of {max(map(len, ids))} tokens does not fit length {T}")
    tokens = np.full((len(ids), T), self.pad_id, np.int32)
    mask = np.zeros((len(ids), T), bool)
    for b, row in enumerate(ids):
      if row:
        tokens[b, T - len(row):] = row
        mask[b, T - len(row):] = True
    return tokens, mask


def encode_chat(tokenizer, user_message: str, image=None) -> list[int]:
  """tokenizer.encode_chat with the prompt's frame where there is one (any tokenizer serves text prompts)."""
  return tokenizer.encode_chat(user_message) if image is None else tokenizer.encode_chat(user_message, image=image)


# tokenizer_config.json classes that AutoTokenizer resolves to transformers' generic tokenizers-backed class (the
# class of seed_jax's own exports): loaded as that class directly, the same object AutoTokenizer builds, without
# importing transformers' model-config machinery, which imports PyTorch where it is installed (seconds of every
# process's start: docs/benchmarks.md).
GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def from_hf_folder(path: str) -> Tokenizer:
  if not os.path.isdir(path):
    raise FileNotFoundError(f"tokenizer folder not found: {path!r}")
  if _config_class(path) in GENERIC_CLASSES:
    from transformers import PreTrainedTokenizerFast  # TokenizersBackend, under its older name
    return Tokenizer(PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True))
  from transformers import AutoTokenizer
  return Tokenizer(AutoTokenizer.from_pretrained(path, local_files_only=True))


def _config_class(path: str) -> str | None:
  try:
    with open(os.path.join(path, "tokenizer_config.json")) as f:
      config = json.load(f)
  except (OSError, ValueError):
    return None  # AutoTokenizer reports what is missing or malformed
  return config.get("tokenizer_class") if isinstance(config, dict) else None


def from_gguf(path: str) -> Tokenizer:
  import gguf
  from tokenizers import Tokenizer as RawTokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  if not os.path.isfile(path):
    raise FileNotFoundError(f"GGUF file not found: {path!r}")
  reader = gguf.GGUFReader(path)
  field = lambda k, d=None: reader.fields[k].contents() if k in reader.fields else d
  kind = field("tokenizer.ggml.model")
  if kind != "gpt2":
    raise ValueError(f"unsupported GGUF tokenizer model {kind!r}; supported: 'gpt2' (byte-level BPE)")
  pre = field("tokenizer.ggml.pre", "default")
  if pre not in _GGUF_PRE_DIGITS:
    raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r}; supported: {', '.join(_GGUF_PRE_DIGITS)}")
  tokens = field("tokenizer.ggml.tokens")
  types = field("tokenizer.ggml.token_type", [1] * len(tokens))
  merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
  raw = RawTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False,
                                byte_fallback=False))
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  raw.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                       if _GGUF_PRE_DIGITS[pre] else byte_level)
  raw.decoder = decoders.ByteLevel()
  special = [t for t, ty in zip(tokens, types) if ty == _CONTROL]
  tok_of = lambda key: tokens[field(key)] if field(key) is not None else None
  hf = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token=tok_of("tokenizer.ggml.bos_token_id"),
                               eos_token=tok_of("tokenizer.ggml.eos_token_id"),
                               unk_token=tok_of("tokenizer.ggml.unknown_token_id"),
                               pad_token=tok_of("tokenizer.ggml.padding_token_id"),
                               additional_special_tokens=special, clean_up_tokenization_spaces=False)
  hf.chat_template = field("tokenizer.chat_template")
  return Tokenizer(hf)
