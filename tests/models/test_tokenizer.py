"""The embedded GGUF tokenizer against Hugging Face `transformers`' conversion of the same file."""
import json
import os
import subprocess
import sys

import pytest
from helpers import REPO

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


def test_an_export_folder_loads_as_autotokenizer_loads_it_without_pytorch(tiny_model_dir):
  """seed_jax's exports name transformers' generic tokenizers-backed class: from_hf_folder builds that class
  directly, the object AutoTokenizer builds (same class, ids, template, special tokens), and a fresh process
  loading it and opening a TensorBoard writer imports no PyTorch (seconds of every seed_jax.main start)."""
  from transformers import AutoTokenizer
  from seed_jax.models import tokenizer as tokenizer_lib
  with open(os.path.join(tiny_model_dir, "tokenizer_config.json")) as f:
    assert json.load(f)["tokenizer_class"] in tokenizer_lib.GENERIC_CLASSES
  tok = tokenizer_lib.from_hf_folder(tiny_model_dir).hf
  ref = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
  assert type(tok) is type(ref) and tok.init_kwargs == ref.init_kwargs and tok.get_vocab() == ref.get_vocab()
  for text in ("Hello world", "<|im_start|>user\nhi<|im_end|>", "naïve café 日本語 12345", ""):
    assert tok.encode(text) == ref.encode(text)
  chat = [{"role": "user", "content": "Open the door."}]
  assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == ref.apply_chat_template(
      chat, tokenize=False, add_generation_prompt=True)
  assert tok.all_special_ids == ref.all_special_ids and tok.pad_token_id == ref.pad_token_id
  probe = ("import glob, os, sys, tempfile\n"
           "from configs import base\n"
           "from seed_jax.models import load\n"
           "from seed_jax.infra.metrics import MetricsWriter\n"
           f"load.load_tokenizer({tiny_model_dir!r})\n"
           "cfg, workdir = base.get_base().log, tempfile.mkdtemp()\n"
           "cfg.tensorboard = True\n"
           "writer = MetricsWriter(workdir, True, cfg)\n"
           "writer.write(1, {'a': 1.0})\n"
           "writer.close()\n"
           "print([os.path.getsize(f) > 0 for f in glob.glob(os.path.join(workdir, cfg.tb_subdir, '*'))],\n"
           "      sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n")
  out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0 and out.stdout.strip() == "[True] []", (out.stdout, out.stderr[-2000:])
