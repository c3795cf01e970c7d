"""The vision-language policy end to end: image observations through the rollout, the sampler, the re-scorer
and the update with the tiny random Qwen2.5-VL ("embedded-vl"), and the bad inputs around them."""
import dataclasses
import math

import jax
import numpy as np
import pytest

from configs import ezpoints, sokoban
from seed_jax import batch as batch_lib
from seed_jax import images, loop, packing, pipeline, runtime
from seed_jax.envs import ezpoints_image
from seed_jax.models import image_processing, load, logprobs, tiny_vl

SKILL = "Push the box toward the target; never push it into a corner."


def small_vl_config(updates: int = 2):
  cfg = sokoban.get_config("vl")
  cfg.rollout.tasks_per_update, cfg.rollout.group_size = 1, 2
  cfg.env.max_steps, cfg.rollout.max_new_tokens = 2, 12
  cfg.analyzer.max_new_tokens = 12
  cfg.train.num_updates = updates
  cfg.eval.at_start = cfg.eval.at_end = False
  return cfg


@pytest.fixture(scope="module")
def codec():
  return images.ImageCodec.from_folder(tiny_vl.ensure_tiny_vl())


def test_vision_tokens_take_the_placeholder(codec):
  tok = images.VLTokenizer(load.load_tokenizer("embedded-vl"), codec)
  frame = np.full((96, 96, 3), 200, np.uint8)  # Sokoban's 6 x 6 cells of 16 px
  ids = tok.encode_chat("Your task: look.\n<image>\nNow it is your turn.", image=frame)
  vls = codec.vls
  start = ids.index(vls.vision_start_token_id)
  n = codec.num_tokens(frame)
  assert codec.patches(frame)[1] == (1, 6, 6) and n == 9  # 84 x 84 after resizing: 3 x 3 merged units
  assert ids[start + 1:start + 1 + n] == [vls.image_token_id] * n and ids[start + 1 + n] == vls.vision_end_token_id
  assert ids.count(vls.image_token_id) == n
  # Qwen2.5-VL-3B's processor bounds (the tiny checkpoint caps a frame at 16 units) and :paper,vl's frame bounds
  lo, hi = sokoban.get_config("paper,vl").model.frame_pixels
  paper = images.ImageCodec(vls, image_processing.ImageProcessorConfig(frame_min_pixels=lo, frame_max_pixels=hi))
  assert paper.num_tokens(frame) == 81  # 96 x 96 -> 256 x 256 -> 252 x 252: 9 x 9 merged units, as the reference
  with pytest.raises(ValueError, match="exactly one <image>"):
    tok.encode_chat("no placeholder here", image=frame)
  with pytest.raises(ValueError, match="env.observation"):
    load.load_tokenizer("embedded-vl").encode_chat("<image>", image=frame)


def test_image_above_max_pixels_is_resized(codec):
  frame = ezpoints_image.render_image(["H5", "D7"], [])  # 300 x 300, above the tiny processor's 112 x 112
  patches, grid = codec.patches(frame)
  h, w = grid[1] * 14, grid[2] * 14
  assert h * w <= codec.processor.max_pixels and (h, w) == (84, 84)
  assert patches.shape == (36, codec.vls.vision.patch_dim)


def test_text_only_checkpoint_with_image_observations_is_one_clear_error():
  cfg = sokoban.get_config("")  # the embedded SmolLM2 (text-only)
  cfg.env.observation, cfg.env.render_image = "image", True
  with pytest.raises(ValueError) as e:
    runtime.build(cfg)
  msg = str(e.value)
  assert "\n" not in msg and "config.env.observation" in msg and "config.model.path" in msg


def test_the_tower_is_sharded_like_the_decoder():
  """On an 8-device mesh (2 data x 4 fsdp) every policy weight, the tower's too, sits on a NamedSharding by its
  logical axes (the MLP's input width over fsdp), so the train state keeps the weights' layout."""
  import optax
  from jax.sharding import NamedSharding
  from seed_jax import update
  from seed_jax.infra.mesh import make_mesh
  mesh = make_mesh((2, 4, 1))
  _, params = load.load_model("embedded-vl", mesh)
  assert all(isinstance(x.sharding, NamedSharding) for x in jax.tree.leaves(params))
  w_gate = params["vision"]["blocks"]["w_gate"]
  assert w_gate.sharding.spec[1] == "fsdp" and w_gate.addressable_shards[0].data.shape[1] == w_gate.shape[1] // 4
  assert update.state_shardings(params, optax.adamw(1e-5)) is not None


def test_image_blocks_of_several_processes_read_what_one_layout_reads(codec):
  """Each process lays out its own rows' frames as a block padded to one patch count (images.renumbered): the
  blocks concatenated, as a global batch concatenates them, give every placeholder the same features and every
  token the same M-RoPE position as one layout of all the rows, and no frame attends to another block's."""
  from seed_jax.models import vlm
  tok = images.VLTokenizer(load.load_tokenizer("embedded-vl"), codec)
  spec, params = load.load_model("embedded-vl")
  rng = np.random.default_rng(0)
  frames = [rng.integers(0, 256, shape, np.uint8) for shape in ((96, 96, 3), (56, 84, 3), (84, 56, 3))]
  prompts = [tok.encode_chat(f"Frame {n}:\n<image>\nYour move.", image=f) for n, f in enumerate(frames)]
  T = max(map(len, prompts)) + 4
  segs = [(r, T - len(p), p, (), codec.image(f)) for r, (p, f) in enumerate(zip(prompts, frames))]
  features = lambda b: np.asarray(vlm.forward_inputs(params, spec, b, None)[1][1])[np.maximum(b.index_BT, 0)]
  one = images.layout_images(3, T, segs)
  # Process 0 holds rows 0-1, process 1 row 2 (its first row 0); both padded to the larger bucket.
  local = [segs[:2], [(0,) + s[1:] for s in segs[2:]]]
  n = max(images.patch_bucket(s) for s in local)
  blocks = [images.renumbered(images.layout_images(len(s), T, s, n, spec.vision), k) for k, s in enumerate(local)]
  two = jax.tree.map(lambda *xs: np.concatenate(xs), *blocks)
  assert two.pixels_NP.shape[0] == 2 * n and int(two.index_BT.max()) >= n // 4  # block 1 reads past block 0
  np.testing.assert_array_equal(two.positions_B3T, one.positions_B3T)
  np.testing.assert_array_equal(two.index_BT >= 0, one.index_BT >= 0)
  is_image = one.index_BT >= 0
  np.testing.assert_allclose(features(two)[is_image], features(one)[is_image], atol=1e-5, rtol=0)
  # Unrenumbered, block 1's placeholders would read block 0's frames.
  wrong = jax.tree.map(lambda *xs: np.concatenate(xs), *[images.layout_images(len(s), T, s, n, spec.vision)
                                                         for s in local])
  assert not np.allclose(features(wrong)[is_image], features(one)[is_image], atol=1e-3)


def test_cpu_vl_configs():  # :paper,vl is pinned in tests/test_paper_configs.py
  for mod in (sokoban, ezpoints):
    c = mod.get_config("vl")
    assert (c.env.observation, c.env.render_image, c.model.path) == ("image", True, "embedded-vl")
    assert mod.get_config("vl").env.max_steps == mod.get_config("").env.max_steps  # the CPU default otherwise


@pytest.mark.slow
def test_sampler_rescorer_and_update_agree_on_image_rows():
  """Sampled log-probs = the re-scorer's on the same rows with their frames (packed and padded layouts) = the
  update's packed forward; the skill-augmented context carries the very same frame arrays."""
  cfg = small_vl_config()
  rt = runtime.build(cfg)
  try:
    params = rt.init_params
    trajs = pipeline._rollout(rt, params, 0, jax.random.key(0))
    steps = [s for t in trajs for s in t.steps]
    assert steps and all(s.image is not None and s.image.dtype == np.uint8 for s in steps)
    codec = rt.tokenizer.codec  # the image side lives in the tokenizer; samples carry prepared images
    assert all(s.prompt_tokens.count(codec.vls.image_token_id) == codec.num_tokens(s.image) for s in steps)
    samples = batch_lib.collect_samples(trajs, [SKILL] * len(trajs), rt.tokenizer, cfg.model.max_prompt_tokens)
    assert samples.opd_mask_N.all()
    assert all(a.key == images.frame_key(s.image) for a, s in zip(samples.images, steps))  # the rollout's frames
    for plain, aug, step in zip(samples.prompts, samples.skill_prompts, steps):
      n = codec.num_tokens(step.image)
      assert aug != plain and aug.count(codec.vls.image_token_id) == plain.count(codec.vls.image_token_id) == n
    sampled = [np.asarray(x, np.float32) for x in samples.sampled_logps]
    lp, _ = rt.rescorer.score(params, [samples.prompts, samples.skill_prompts], samples.responses,
                              cfg.rollout.temperature, images=samples.images)
    for a, b in zip(lp[0], sampled):
      np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    assert all(np.isfinite(x).all() for x in lp[1]) and any(not np.allclose(a, b) for a, b in zip(lp[1], lp[0]))
    other = images.prepare(rt.tokenizer, [255 - s.image for s in steps])  # other pixels reach the log-probs
    lp_other, _ = rt.rescorer.score(params, [samples.prompts], samples.responses, cfg.rollout.temperature,
                                    images=other)
    assert all(not np.allclose(a, b, atol=1e-6) for a, b in zip(lp_other[0], sampled))
    rt.rescorer.cfg = dataclasses.replace(rt.rescorer.cfg, pack_length=0)
    lp_padded, _ = rt.rescorer.score(params, [samples.prompts], samples.responses, cfg.rollout.temperature,
                                     images=samples.images)
    for a, b in zip(lp_padded[0], sampled):
      np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    # The update's packed mini-batch (images per micro-batch): its first group's forward.
    idx = list(range(len(samples)))
    layout = packing.plan_layout([len(samples.prompts[i]) + len(samples.responses[i]) for i in idx],
                                 length=cfg.learner.pack_length, group_tokens=1 << 20)
    zeros = [np.zeros(len(r), np.float32) for r in samples.responses]
    mb, _ = batch_lib.packed_minibatch(samples, idx, layout, 16, adv_N=np.zeros(len(idx), np.float32),
                                       old_logp=zeros, ref_logp=None, skill_logp=None)
    assert len(layout.groups) == 1 and mb.images is not None
    fwd = jax.jit(lambda p, m: logprobs.packed_logprobs(p, rt.spec, m.packed, m.resp_BR, m.rmask_BR, 1.0, m.images,
                                                        dtype=jax.numpy.float32, chunk=16)[0])
    lp_update = np.asarray(fwd(params, mb))
    slot_of = {n: s for s, n in enumerate(n for row in layout.groups[0] for n in row)}  # fill_rows' slot order
    for i in idx:
      np.testing.assert_allclose(lp_update[slot_of[i], :len(sampled[i])], sampled[i], atol=1e-5, rtol=0)
  finally:
    rt.close()


@pytest.mark.slow
@pytest.mark.parametrize("pack", [True, False], ids=["packed", "padded"])
def test_two_update_seed_run_with_image_observations(tmp_path, pack):
  cfg = small_vl_config(updates=2)
  if not pack:  # one padded row per step-sample in the re-score and the update, π_old re-scored too
    cfg.learner.pack_length = cfg.rescore.pack_length = 0
    cfg.rescore.old_logps = "rescore"
  out = loop.train(cfg, str(tmp_path))
  m = out["metrics"]
  assert out["stopped"] is None and int(out["state"].step) >= 2
  assert all(math.isfinite(m[k]) for k in ("update/loss", "update/grad_norm")) and m["update/skipped_total"] == 0
  for phase in ("rollout", "analysis", "rescore", "update"):
    assert m[f"time/{phase}_s"] > 0
