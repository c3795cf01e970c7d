"""Preflight: an unusable workdir and too little disk for the checkpoints are one clear error each."""
import pytest

from configs import textworld_express
from seed_jax.infra import preflight
from seed_jax.models import transformer as tf
from seed_jax.models.spec import ModelSpec


def test_workdir_under_a_file(tmp_path):
  (tmp_path / "f").write_text("x")
  with pytest.raises(preflight.WorkdirError, match=r"workdir '.*/f/run' is not usable: Not a directory"):
    preflight.check_workdir(str(tmp_path / "f" / "run"))
  preflight.check_workdir(str(tmp_path / "ok" / "run"))
  assert (tmp_path / "ok" / "run").is_dir() and not list((tmp_path / "ok" / "run").iterdir())


def test_checkpoint_bytes_counts_params_and_adam_moments():
  spec = ModelSpec("LlamaForCausalLM", vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                   ffn_dim=48, tie_embeddings=True)
  n = sum(x.size for x in __import__("jax").tree.leaves(tf.init_params(spec, 0)))
  assert preflight.checkpoint_bytes(spec) == 12 * n


def test_disk_too_small_names_the_numbers(tmp_path, tiny_model_dir):
  c = textworld_express.get_config("")
  c.model.path = tiny_model_dir
  c.train.checkpoint.max_to_keep = 2
  preflight.check_disk(str(tmp_path), c)  # this disk has room
  with pytest.raises(preflight.WorkdirError, match=r"has 0\.00 GiB free, but 2 \+ 1 checkpoints of .* GiB .* "
                                                   r"need .* GiB; free space or lower train.checkpoint.max_to_keep"):
    preflight.check_disk(str(tmp_path), c, free_bytes=1000)
