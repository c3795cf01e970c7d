"""models/image_processing.py against Pillow's bicubic resize and transformers' Qwen2VLImageProcessorPil (the
PIL backend: the torchvision one is not installed) on Sokoban and EZPoints frames: equal bit for bit."""
import numpy as np
import pytest

from seed_jax.envs import ezpoints_image, sokoban, sokoban_levels
from seed_jax.models import image_processing as ip


def _frames():
  soko = [sokoban.render_image(*sokoban_levels.generate_level(seed), tile_px=px) for seed, px in ((3, 16), (5, 20))]
  soko.append(sokoban.render_image(*sokoban_levels.generate_level(1, (8, 8), 2, search_depth=12, walk_steps=27)))
  ez = [ezpoints_image.render_image(["hA", "s7"], ["A", "+", "7", "="]),
        ezpoints_image.render_image(["dK", "cT"], ["10", "*", "K"], size=200)]
  return soko + ez


SIZES = [((100, 130), (140, 168)), ((300, 300), (308, 308)), ((300, 300), (112, 140)), ((37, 501), (56, 476)),
         ((500, 400), (84, 56)), ((96, 96), (96, 140)), ((1000, 28), (28, 28))]


@pytest.mark.parametrize("src,dst", SIZES)
def test_resize_is_pillows_bicubic_bit_for_bit(src, dst):
  from PIL import Image
  image = np.random.default_rng(sum(src)).integers(0, 256, src + (3,)).astype(np.uint8)
  ref = np.asarray(Image.fromarray(image).resize(dst[::-1], Image.BICUBIC))
  np.testing.assert_array_equal(ip.resize_bicubic(image, *dst), ref)


def test_image_above_max_pixels_is_resized_down():
  cfg = ip.ImageProcessorConfig(max_pixels=28 * 28 * 64)
  image = np.random.default_rng(0).integers(0, 256, (1000, 800, 3)).astype(np.uint8)
  patches, (t, gh, gw) = ip.preprocess(image, cfg)
  assert (t, gh, gw) == (1, 16, 14) and gh * gw * 14 * 14 <= cfg.max_pixels
  assert patches.shape == (gh * gw, 3 * 2 * 14 * 14) and patches.dtype == np.float32
  small = ip.preprocess(np.zeros((20, 30, 3), np.uint8))[1]
  assert small[1] * small[2] * 14 * 14 >= 56 * 56  # scaled up to min_pixels


def test_bad_frames_are_clear_errors():
  with pytest.raises(ValueError, match=r"uint8 \[H, W, 3\] RGB frame, got float32"):
    ip.preprocess(np.zeros((56, 56, 3), np.float32))
  with pytest.raises(ValueError, match="aspect ratio must be smaller than 200"):
    ip.preprocess(np.zeros((10, 2100, 3), np.uint8))


@pytest.mark.slow  # transformers' image processor imports PyTorch
@pytest.mark.parametrize("max_pixels", [28 * 28 * 1280, 28 * 28 * 24])
def test_matches_transformers_qwen2vl_processor_on_env_frames(max_pixels):
  from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
  proc = Qwen2VLImageProcessorPil(max_pixels=max_pixels)
  cfg = ip.ImageProcessorConfig.from_hf_config(proc.to_dict())
  assert cfg == ip.ImageProcessorConfig(max_pixels=max_pixels)
  frames = _frames()
  ref = proc(images=frames, return_tensors="np")
  patches, grids = ip.preprocess_images(frames, cfg)
  np.testing.assert_array_equal(np.asarray(grids), ref["image_grid_thw"])
  np.testing.assert_array_equal(patches, ref["pixel_values"])  # exact: same uint8 resize, same float32 ops
  assert len(set(grids)) >= 2  # frames of several sizes


def _process_image(image, max_pixels=2048 * 2048, min_pixels=256 * 256):
  """verl's process_image, written out with Pillow: what the reference does to a frame before its processor."""
  import math
  if image.width * image.height > max_pixels:
    f = math.sqrt(max_pixels / (image.width * image.height))
    image = image.resize((int(image.width * f), int(image.height * f)))
  if image.width * image.height < min_pixels:
    f = math.sqrt(min_pixels / (image.width * image.height))
    image = image.resize((int(image.width * f), int(image.height * f)))
  return image


@pytest.mark.parametrize("shape", [(96, 96), (70, 130), (2500, 2000)])
def test_frames_bounded_as_the_reference_bounds_them(shape):
  from PIL import Image
  image = np.random.default_rng(shape[0]).integers(0, 256, shape + (3,)).astype(np.uint8)
  ref = np.asarray(_process_image(Image.fromarray(image)))
  np.testing.assert_array_equal(ip.bound_frame(image, 256 * 256, 2048 * 2048), ref)
  assert ip.bound_frame(image, 0, 0) is image


def test_a_96_pixel_sokoban_frame_is_81_vision_tokens_with_the_reference_bounds():
  frame = sokoban.render_image(*sokoban_levels.generate_level(3), tile_px=16)
  assert frame.shape == (96, 96, 3)
  merged = lambda cfg: (lambda g: g[1] * g[2] // cfg.merge_size ** 2)(ip.preprocess(frame, cfg)[1])
  assert merged(ip.ImageProcessorConfig()) == 9  # 84 x 84: 3 x 3 merged units
  bounded = ip.ImageProcessorConfig(frame_min_pixels=256 * 256, frame_max_pixels=2048 * 2048)
  assert merged(bounded) == 81  # 256 x 256 -> 252 x 252: 9 x 9
