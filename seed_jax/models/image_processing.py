"""Qwen2-VL / Qwen2.5-VL image preprocessing in numpy: the vision tower's flat patches and grid of an RGB frame.

Steps (as transformers' Qwen2VLImageProcessorPil), after an optional `bound_frame` (verl's process_image, which
the reference runs before the processor: a 96x96 Sokoban frame becomes 256x256): `smart_resize` picks a size
with both sides multiples of patch_size * merge_size (28) and the pixel count within [min_pixels, max_pixels], keeping the aspect ratio;
the frame is resized there with Pillow's bicubic filter (`resize_bicubic` reproduces its fixed-point uint8
arithmetic exactly), rescaled to [0, 1], normalized with the CLIP mean/std and cut into patches
[h/14 * w/14, C * temporal * 14 * 14] in 2x2 merge-block order, each patch repeated over the temporal axis
(a still image is two identical frames).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_PRECISION_BITS = 22  # Pillow's 8-bit resampling: 32 - 8 - 2 bits of fixed-point coefficients


@dataclasses.dataclass(frozen=True)
class ImageProcessorConfig:
  min_pixels: int = 56 * 56
  max_pixels: int = 28 * 28 * 1280
  frame_min_pixels: int = 0  # bound_frame's bounds before the processor (0 = no such step)
  frame_max_pixels: int = 0
  patch_size: int = 14
  temporal_patch_size: int = 2
  merge_size: int = 2
  mean: tuple[float, ...] = CLIP_MEAN
  std: tuple[float, ...] = CLIP_STD

  @classmethod
  def from_hf_config(cls, cfg: dict[str, Any]) -> "ImageProcessorConfig":
    """From a checkpoint's preprocessor_config.json (`size` {shortest_edge, longest_edge} or min/max_pixels)."""
    size = cfg.get("size") or {}
    return cls(min_pixels=int(cfg.get("min_pixels") or size.get("shortest_edge") or cls.min_pixels),
               max_pixels=int(cfg.get("max_pixels") or size.get("longest_edge") or cls.max_pixels),
               patch_size=int(cfg.get("patch_size", 14)), temporal_patch_size=int(cfg.get("temporal_patch_size", 2)),
               merge_size=int(cfg.get("merge_size", 2)), mean=tuple(cfg.get("image_mean", CLIP_MEAN)),
               std=tuple(cfg.get("image_std", CLIP_STD)))


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 28 * 28 * 1280) -> tuple[int, int]:
  """The resized (height, width): multiples of `factor`, pixel count within [min_pixels, max_pixels] (a larger
  image is scaled down, a smaller one up), aspect ratio as close as those allow."""
  if max(height, width) / min(height, width) > 200:
    raise ValueError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
  h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
  if h_bar * w_bar > max_pixels:
    beta = math.sqrt(height * width / max_pixels)
    h_bar = max(factor, math.floor(height / beta / factor) * factor)
    w_bar = max(factor, math.floor(width / beta / factor) * factor)
  elif h_bar * w_bar < min_pixels:
    beta = math.sqrt(min_pixels / (height * width))
    h_bar = math.ceil(height * beta / factor) * factor
    w_bar = math.ceil(width * beta / factor) * factor
  return h_bar, w_bar


def _bicubic(x: np.ndarray) -> np.ndarray:
  """Pillow's bicubic kernel (a = -0.5)."""
  a, x = -0.5, np.abs(x)
  near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
  far = (((x - 5) * x + 8) * x - 4) * a
  return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _coefficients(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
  """Pillow's precompute_coeffs + normalize_coeffs_8bpc for one axis: the first source pixel of each output
  [out] and the fixed-point weights [out, ksize] (zero past each output's support). Downscaling widens the
  kernel by the scale (antialiasing)."""
  scale = in_size / out_size
  filterscale = max(scale, 1.0)
  support = 2.0 * filterscale
  ksize = int(math.ceil(support)) * 2 + 1
  center = (np.arange(out_size) + 0.5) * scale
  xmin = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
  xmax = np.minimum(np.trunc(center + support + 0.5), in_size).astype(np.int64) - xmin
  taps = np.arange(ksize)
  w = np.where(taps < xmax[:, None], _bicubic(((taps + xmin[:, None]) - center[:, None] + 0.5) * (1.0 / filterscale)),
               0.0)
  total = np.zeros(out_size)
  for j in range(ksize):  # in order, as Pillow sums: float sums depend on order
    total = total + w[:, j]
  w = np.where(total[:, None] != 0.0, w / np.where(total == 0.0, 1.0, total)[:, None], w)
  scaled = w * (1 << _PRECISION_BITS)
  return xmin, np.trunc(np.where(w < 0, scaled - 0.5, scaled + 0.5)).astype(np.int64)


def _resample_axis(image: np.ndarray, out_size: int, axis: int) -> np.ndarray:
  """One separable pass of Pillow's 8-bit resampling along `axis` of a uint8 [H, W, C] image."""
  in_size = image.shape[axis]
  xmin, k = _coefficients(in_size, out_size)
  index = np.minimum(xmin[:, None] + np.arange(k.shape[1]), in_size - 1)  # clipped taps have weight 0
  src = np.moveaxis(image, axis, 0).astype(np.int64)  # [in, other, C]
  acc = np.full((out_size,) + src.shape[1:], 1 << (_PRECISION_BITS - 1), np.int64)
  for j in range(k.shape[1]):  # one tap at a time: integer sums, exact in any order
    acc += src[index[:, j]] * k[:, j, None, None]
  out = np.clip(acc >> _PRECISION_BITS, 0, 255).astype(np.uint8)
  return np.moveaxis(out, 0, axis)


def resize_bicubic(image_HWC: np.ndarray, height: int, width: int) -> np.ndarray:
  """uint8 [height, width, C]: Pillow's Image.resize(..., BICUBIC) of a uint8 image, bit for bit (horizontal
  pass first, each pass rounded to uint8, like Pillow)."""
  if image_HWC.dtype != np.uint8 or image_HWC.ndim != 3:
    raise ValueError(f"expected a uint8 [H, W, C] image, got {image_HWC.dtype} {image_HWC.shape}")
  out = image_HWC
  if width != out.shape[1]:
    out = _resample_axis(out, width, axis=1)
  if height != out.shape[0]:
    out = _resample_axis(out, height, axis=0)
  return out


def bound_frame(image_HWC: np.ndarray, min_pixels: int, max_pixels: int) -> np.ndarray:
  """verl's process_image: a frame of more than `max_pixels` is scaled down, then one of fewer than `min_pixels`
  up, by sqrt of the area ratio, each side truncated to an integer, with Pillow's bicubic filter (0 = no bound)."""
  def scaled(image_HWC, bound):
    h, w = image_HWC.shape[:2]
    f = math.sqrt(bound / (h * w))
    return resize_bicubic(image_HWC, int(h * f), int(w * f))
  if max_pixels and image_HWC.shape[0] * image_HWC.shape[1] > max_pixels:
    image_HWC = scaled(image_HWC, max_pixels)
  if min_pixels and image_HWC.shape[0] * image_HWC.shape[1] < min_pixels:
    image_HWC = scaled(image_HWC, min_pixels)
  return image_HWC


def patchify(image_CHW: np.ndarray, cfg: ImageProcessorConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
  """float32 [gh * gw, C * temporal * p * p] patches in merge-block order, and the grid (1, gh, gw)."""
  C, H, W = image_CHW.shape
  p, m, t = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
  gh, gw = H // p, W // p
  x = image_CHW.reshape(C, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)  # (gh', gw', m, m, C, p, p)
  x = np.broadcast_to(x[:, :, :, :, :, None], x.shape[:5] + (t, p, p))
  return np.ascontiguousarray(x.reshape(gh * gw, C * t * p * p), dtype=np.float32), (1, gh, gw)


def preprocess(image_HWC: np.ndarray, cfg: ImageProcessorConfig = ImageProcessorConfig()
               ) -> tuple[np.ndarray, tuple[int, int, int]]:
  """One uint8 RGB frame [H, W, 3] -> (patches [N, 3 * temporal * p * p] float32, grid (1, gh, gw))."""
  if image_HWC.dtype != np.uint8 or image_HWC.ndim != 3 or image_HWC.shape[2] != 3:
    raise ValueError(f"expected a uint8 [H, W, 3] RGB frame, got {image_HWC.dtype} {image_HWC.shape}")
  image_HWC = bound_frame(image_HWC, cfg.frame_min_pixels, cfg.frame_max_pixels)
  factor = cfg.patch_size * cfg.merge_size
  h, w = smart_resize(image_HWC.shape[0], image_HWC.shape[1], factor, cfg.min_pixels, cfg.max_pixels)
  resized = resize_bicubic(image_HWC, h, w)
  x = (resized.astype(np.float64) * (1 / 255)).astype(np.float32)  # the reference's rescale, in float64
  x = (x - np.asarray(cfg.mean, np.float32)) / np.asarray(cfg.std, np.float32)
  return patchify(np.ascontiguousarray(x.transpose(2, 0, 1)), cfg)


def preprocess_images(images: Sequence[np.ndarray], cfg: ImageProcessorConfig = ImageProcessorConfig()
                      ) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
  """Several frames: their patches concatenated (the vision tower's input) and their grids, in order."""
  out = [preprocess(im, cfg) for im in images]
  return np.concatenate([p for p, _ in out]), [g for _, g in out]
