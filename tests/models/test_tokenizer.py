"""The embedded GGUF tokenizer against Hugging Face `transformers`' conversion of the same file."""
import os

import pytest

from seed_jax.models import weights

pytestmark = pytest.mark.slow  # the `transformers` (PyTorch) reference


def test_gguf_tokenizer_matches_transformers_conversion(smollm2):
  from transformers import AutoTokenizer
  _, _, tok = smollm2
  path = weights.embedded_model_path()
  ref = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
  texts = ["Hello world", "def f(x):\n    return x**2  # square", "3.14159 + 2,718 = 12345678", " 1 22 333",
           "naïve café — ünïcödé 日本語 😀", "   many   spaces\t\ttabs\n\n\nnewlines", "I'll we've they're",
           "<|im_start|>user\nhi<|im_end|>", "<action>open door to kitchen</action>", ""]
  for text in texts:
    ids = tok.encode(text)
    assert ids == ref.encode(text, add_special_tokens=False), text
    assert tok.decode(ids, skip_special_tokens=False) == text
  prompt = tok.chat_prompt("hi")
  assert prompt == ref.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                           add_generation_prompt=True)
  assert prompt.endswith("<|im_start|>assistant\n") and 2 in tok.eos_ids
  tokens, mask = tok.encode_batch_left_padded(["a b c", "hello"])
  assert mask.sum(1).tolist() == [len(tok.encode("a b c")), len(tok.encode("hello"))]
  assert (tokens[~mask] == tok.pad_id).all() and not mask[1, 0]
