"""Qwen2.5-VL (models/vision.py, models/vlm.py, models/vlm_weights.py) against transformers'
Qwen2_5_VLForConditionalGeneration (PyTorch CPU, fp32, eager attention) on a tiny random checkpoint, and the
host-side checks that need no reference."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from seed_jax.models import transformer as tf
from seed_jax.models import vision, vlm, vlm_weights
from seed_jax.models.spec import ModelSpec
from seed_jax.models.vision import VisionSpec

IMAGE, VSTART, VEND = 250, 252, 253
# Vision: 4 blocks, full attention at 1 and 3; window_size 56 = 2x2 merged units (4x4 patches) per window.
VISION_CFG = dict(depth=4, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, window_size=56,
                  fullatt_block_indexes=[1, 3])
TEXT_CFG = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, bos_token_id=1,
                eos_token_id=2, rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[2, 3, 3]))
GRIDS = [(1, 8, 8), (1, 6, 10)]  # 4 windows; 3x5 units -> 6 windows, 4 of them partial


def tiny_vls() -> vlm.VLSpec:
  text = ModelSpec("Qwen2ForCausalLM", vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                   ffn_dim=96, mrope_section=(2, 3, 3))
  vs = VisionSpec(depth=4, dim=32, n_heads=2, ffn_dim=48, out_dim=64, full_attention_blocks=(1, 3), window_size=56)
  return vlm.VLSpec(text, vs, IMAGE, 251, VSTART, VEND)


def prompt(vls, grids, text=(5, 6)) -> list[int]:
  """Text, then each image wrapped in vision start/end, then text."""
  ids = list(text)
  for i, g in enumerate(grids):
    ids += [VSTART] + [IMAGE] * vision.num_merged(vls.vision, g) + [VEND, 7 + i]
  return ids + [9, 10, 11]


def pixels(grids, seed=0):
  return np.random.default_rng(seed).standard_normal((vision.num_patches(grids), 1176)).astype(np.float32)


@pytest.fixture(scope="module")
def hf_vl(tmp_path_factory):
  import torch
  import transformers as T
  cfg = T.Qwen2_5_VLConfig(vision_config=VISION_CFG, text_config=TEXT_CFG, image_token_id=IMAGE, video_token_id=251,
                           vision_start_token_id=VSTART, vision_end_token_id=VEND)
  cfg._attn_implementation = "eager"
  torch.manual_seed(0)
  model = T.Qwen2_5_VLForConditionalGeneration(cfg).eval()
  with torch.no_grad():  # untouched norms are ones and biases zeros: perturb them so they are really tested
    for name, p in model.named_parameters():
      if "norm" in name or "ln_q" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  path = str(tmp_path_factory.mktemp("qwen2_5_vl"))
  model.save_pretrained(path)
  return model, path


def _hf_forward(model, tokens_BT, valid_BT, pix, grids):
  import torch
  with torch.no_grad():
    return model(input_ids=torch.tensor(tokens_BT, dtype=torch.long), attention_mask=torch.tensor(valid_BT),
                 pixel_values=torch.tensor(pix), image_grid_thw=torch.tensor(grids),
                 mm_token_type_ids=torch.tensor((tokens_BT == IMAGE).astype(np.int64))).logits.numpy()


@pytest.mark.slow
def test_vision_tower_matches_transformers(hf_vl):
  import torch
  model, path = hf_vl
  vls, params = vlm_weights.load_hf(path)
  assert vls.vision.full_attention_blocks == (1, 3)
  inputs = vision.vision_inputs(vls.vision, GRIDS)
  assert len(np.unique(inputs.window_segment_N)) == 10 and len(np.unique(inputs.full_segment_N)) == 2
  pix = pixels(GRIDS)
  with torch.no_grad():
    ref = model.model.visual(torch.tensor(pix), grid_thw=torch.tensor(GRIDS)).pooler_output.numpy()
  ours = np.asarray(jax.jit(vision.encode, static_argnums=1)(params["vision"], vls.vision, pix, inputs))
  assert ours.shape == (31, 64)
  assert np.abs(ours - ref).max() <= 1e-5  # measured 8.2e-8 (values up to 0.3)


@pytest.mark.slow
def test_merged_input_embeddings_match_transformers(hf_vl):
  import torch
  model, path = hf_vl
  vls, params = vlm_weights.load_hf(path)
  tokens = np.array([prompt(vls, GRIDS)], np.int32)
  pix = pixels(GRIDS, 1)
  with torch.no_grad():
    ids = torch.tensor(tokens, dtype=torch.long)
    embeds = model.model.get_input_embeddings()(ids)
    rows = torch.cat(model.model.get_image_features(torch.tensor(pix), torch.tensor(GRIDS)).pooler_output)
    mask, _ = model.model.get_placeholder_mask(ids, inputs_embeds=embeds, image_features=rows)
    ref = embeds.masked_scatter(mask, rows).numpy()
  inputs, _ = vlm.prepare(vls, tokens, GRIDS)
  ours = np.asarray(jax.jit(vlm.input_embeddings, static_argnums=1)(params, vls, tokens, pix, inputs))
  assert np.abs(ours - ref).max() <= 1e-5  # measured 1.0e-7


def _check_logits_and_positions(hf_vl, rows, grids, pix):
  """Left-pads `rows`, compares 3-D positions and offsets (exactly) and logits with transformers'."""
  import torch
  model, path = hf_vl
  vls, params = vlm_weights.load_hf(path)
  T = max(map(len, rows))
  tokens = np.zeros((len(rows), T), np.int32)
  valid = np.zeros((len(rows), T), np.int64)
  for b, r in enumerate(rows):
    tokens[b, T - len(r):], valid[b, T - len(r):] = r, 1
  ref = _hf_forward(model, tokens, valid, pix, grids)
  inputs, deltas = vlm.prepare(vls, tokens, grids, valid)
  with torch.no_grad():
    ref_pos, ref_deltas = model.model.get_rope_index(torch.tensor(tokens, dtype=torch.long),
                                                     torch.tensor((tokens == IMAGE).astype(np.int64)),
                                                     torch.tensor(grids), attention_mask=torch.tensor(valid))
  m = valid.astype(bool)
  np.testing.assert_array_equal(inputs.positions_3BT[:, m], ref_pos.numpy()[:, m])
  np.testing.assert_array_equal(deltas, ref_deltas.numpy()[:, 0])
  ours = np.asarray(jax.jit(vlm.logits, static_argnums=1)(params, vls, tokens, valid.astype(np.int32), pix, inputs))
  assert np.abs(ours[m] - ref[m]).max() <= 1e-4  # measured <= 2.6e-7 (logits up to ~0.6)


CASES = {"one_image": [[0]], "two_images": [[0, 1]], "two_rows_left_padded": [[1], [0]]}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_positions_match_transformers(hf_vl, case):
  vls = tiny_vls()
  rows = [prompt(vls, [GRIDS[i] for i in images]) for images in CASES[case]]
  grids = [GRIDS[i] for images in CASES[case] for i in images]
  _check_logits_and_positions(hf_vl, rows, grids, pixels(grids, 2))


@pytest.mark.slow
def test_logits_on_env_frames_match_transformers(hf_vl):
  from seed_jax.envs import ezpoints_image, sokoban, sokoban_levels
  from seed_jax.models import image_processing
  frames = [sokoban.render_image(*sokoban_levels.generate_level(3)),  # 96 px -> grid 6 x 6
            ezpoints_image.render_image(["hA", "s7"], ["A", "+", "7"], size=200)]  # 200 px -> grid 14 x 14
  pix, grids = image_processing.preprocess_images(frames)
  _check_logits_and_positions(hf_vl, [prompt(tiny_vls(), grids)], grids, pix)


def _rename_to_transformers4(src, dst):
  """The checkpoint in transformers 4.5x's key layout, split into two shards with an index."""
  from safetensors.numpy import load_file, save_file
  tensors = load_file(os.path.join(src, "model.safetensors"))
  renamed = {("model." + k if k.startswith("visual.") else k.replace("model.", "model.language_model.", 1)): v
             for k, v in tensors.items()}
  names = sorted(renamed)
  shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
  os.makedirs(dst)
  for fname, keys in shards.items():
    save_file({k: renamed[k] for k in keys}, os.path.join(dst, fname), metadata={"format": "pt"})
  with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
    json.dump({"weight_map": {k: fname for fname, keys in shards.items() for k in keys}}, f)
  with open(os.path.join(src, "config.json")) as f, open(os.path.join(dst, "config.json"), "w") as g:
    g.write(f.read())


@pytest.mark.slow
def test_export_round_trip_and_both_key_layouts(hf_vl, tmp_path):
  import transformers
  model, path = hf_vl
  vls, params = vlm_weights.load_hf(path)
  vlm_weights.export_hf(params, vls, str(tmp_path / "export"))
  vls2, params2 = vlm_weights.load_hf(str(tmp_path / "export"))
  assert vls2 == vls
  same = lambda a, b: jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)
  same(params, params2)
  _rename_to_transformers4(path, str(tmp_path / "t4"))
  same(params, vlm_weights.load_hf(str(tmp_path / "t4"))[1])
  reloaded = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
      str(tmp_path / "export"), attn_implementation="eager").eval()
  tokens = np.array([prompt(vls, GRIDS)], np.int32)
  valid = np.ones_like(tokens, np.int64)
  pix = pixels(GRIDS, 3)
  np.testing.assert_array_equal(_hf_forward(reloaded, tokens, valid, pix, GRIDS),
                                _hf_forward(model, tokens, valid, pix, GRIDS))


# ------------------------------------------------------------------ no reference needed


def test_placeholder_count_mismatch_is_one_clear_error():
  vls = tiny_vls()
  tokens = np.array([prompt(vls, GRIDS)], np.int32)  # 16 + 15 placeholders
  more = r"31 image placeholder tokens \(id 250\) but its 1 image\(s\) give 16 feature rows"
  with pytest.raises(ValueError, match=more):
    vlm.prepare(vls, tokens, GRIDS[:1])
  fewer = np.delete(tokens, np.flatnonzero(tokens[0] == IMAGE)[:3], axis=1)
  with pytest.raises(ValueError, match=r"28 image placeholder tokens .* 2 image\(s\) give 31 feature rows"):
    vlm.prepare(vls, fewer, GRIDS)
  swapped = r"row 0: 16 consecutive image placeholder tokens at 3, but the image there \(grid \(1, 6, 10\)\) gives 15"
  with pytest.raises(ValueError, match=swapped):
    vlm.prepare(vls, tokens, GRIDS[::-1])  # the right total, in the wrong order
  with pytest.raises(ValueError, match=r"image grid \(1, 7, 8\) must be"):
    vision.vision_inputs(vls.vision, [(1, 7, 8)])


def test_text_positions_as_three_equal_axes_are_bit_identical():
  vls = tiny_vls()
  params = tf.init_params(vls.text, 0)
  tokens = np.random.default_rng(0).integers(0, 250, (2, 12)).astype(np.int32)
  pos = np.tile(np.arange(12, dtype=np.int32), (2, 1))
  seg = np.ones_like(tokens)
  run = jax.jit(lambda p, pos: tf.forward(params, vls.text, tokens, pos, seg)[0])
  np.testing.assert_array_equal(np.asarray(run(params, pos)), np.asarray(run(params, np.stack([pos] * 3))))
  with pytest.raises(ValueError, match="need a spec with mrope_section"):
    tf.forward(params, ModelSpec("Qwen2ForCausalLM", 256, 64, 2, 4, 2, 16, 96), tokens, np.stack([pos] * 3), seg)


def test_chunked_prefill_with_images_equals_one_forward():
  vls = tiny_vls()
  params = vlm.init_params(vls, 0)
  tokens = np.array([prompt(vls, GRIDS)], np.int32)
  seg = np.ones_like(tokens)
  pix = pixels(GRIDS, 4)
  inputs, _ = vlm.prepare(vls, tokens, GRIDS)
  full, _ = jax.jit(vlm.forward, static_argnums=1)(params, vls, tokens, seg, pix, inputs)

  @jax.jit
  def chunked(params, pix, inputs):
    rows = vision.encode(params["vision"], vls.vision, pix, inputs.vision)
    return tf.prefill(params["lm"], vls.text, tokens, inputs.positions_3BT, seg, 64, chunk=8,
                      embeds=(inputs.index_BT, rows))[0]

  np.testing.assert_allclose(np.asarray(chunked(params, pix, inputs)), np.asarray(full), atol=2e-5)


# The values and layout of Qwen2.5-VL-3B-Instruct's config.json (transformers 4.4x: text keys at the top level).
HUB_3B = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl", "bos_token_id": 151643,
    "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
    "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656, "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 11008, "max_position_embeddings": 128000, "max_window_layers": 70,
    "num_attention_heads": 16, "num_hidden_layers": 36, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "use_sliding_window": False, "vocab_size": 151936,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                      "num_heads": 16, "in_chans": 3, "out_hidden_size": 2048, "patch_size": 14,
                      "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
                      "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2},
}


def test_spec_from_the_hub_config_layout_and_back():
  vls = vlm.VLSpec.from_hf_config(HUB_3B)
  t, v = vls.text, vls.vision
  assert (t.dim, t.n_layers, t.n_heads, t.n_kv_heads, t.head_dim, t.ffn_dim) == (2048, 36, 16, 2, 128, 11008)
  assert t.qkv_bias and t.tie_embeddings and t.rope_theta == 1e6 and t.mrope_section == (16, 24, 24)
  assert (v.depth, v.dim, v.n_heads, v.out_dim, v.window_size) == (32, 1280, 16, 2048, 112)
  assert v.full_attention_blocks == (7, 15, 23, 31) and vls.image_token_id == 151655
  assert vlm.VLSpec.from_hf_config(vls.to_hf_config()) == vls
  with pytest.raises(ValueError, match="unsupported vision-language architecture 'Qwen2ForCausalLM'"):
    vlm.VLSpec.from_hf_config({**HUB_3B, "architectures": ["Qwen2ForCausalLM"]})


def test_bf16_tower_tracks_fp32():
  vls = tiny_vls()
  params = vision.init_params(vls.vision, 1)
  inputs = vision.vision_inputs(vls.vision, GRIDS)
  run = jax.jit(vision.encode, static_argnums=(1, 4))
  f32 = np.asarray(run(params, vls.vision, pixels(GRIDS), inputs, jnp.float32))
  bf16 = np.asarray(run(params, vls.vision, pixels(GRIDS), inputs, jnp.bfloat16))
  assert bf16.dtype == np.float32 and np.abs(bf16 - f32).max() <= 0.02 * np.abs(f32).max()


def test_decoding_after_an_image_prompt_uses_text_positions_plus_the_offset():
  vls = tiny_vls()
  params = vlm.init_params(vls, 2)
  prompt_ids = prompt(vls, GRIDS)
  tokens = np.array([prompt_ids + [42]], np.int32)
  pix = pixels(GRIDS, 5)
  inputs, _ = vlm.prepare(vls, tokens, GRIDS)
  full, _ = jax.jit(vlm.forward, static_argnums=1)(params, vls, tokens, np.ones_like(tokens), pix, inputs)

  T = len(prompt_ids)
  p_inputs, deltas = vlm.prepare(vls, tokens[:, :T], GRIDS)

  @jax.jit
  def prefill_then_step(params, pix, p_inputs, next_positions):
    rows = vision.encode(params["vision"], vls.vision, pix, p_inputs.vision)
    _, cache = tf.prefill(params["lm"], vls.text, tokens[:, :T], p_inputs.positions_3BT, np.ones((1, T), np.int32),
                          T + 4, embeds=(p_inputs.index_BT, rows))
    return tf.forward(params["lm"], vls.text, tokens[:, T:], next_positions, np.ones((1, 1), np.int32), cache)[0]

  step = prefill_then_step(params, pix, p_inputs, np.array([[T]]) + deltas[:, None])  # 2-D: all axes equal
  np.testing.assert_allclose(np.asarray(step[:, 0]), np.asarray(full[:, T]), atol=2e-5)
