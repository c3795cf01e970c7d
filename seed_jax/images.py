"""Image observations on the host, for a vision-language policy (models/vlm.py).

A step prompt names its frame with one `<image>` placeholder in the text. `VLTokenizer.encode_chat` puts
Qwen2.5-VL's vision tokens there (<|vision_start|>, one <|image_pad|> per merged 2x2 patch unit of the frame's
processed grid, <|vision_end|>), as the checkpoint's chat template and processor do. Frames stay uint8 in the
trajectory; the tokenizer's `ImageCodec` turns each into an `Image` (models/image_processing.py, cached per
frame), the data the samples and mini-batches carry, and `layout_images` builds the `vlm.ImageBatch` of one
jitted call from where its sequences sit in the call's token rows.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Sequence

import jax
import numpy as np

from seed_jax.infra import distributed
from seed_jax.models import image_processing, vision, vlm
from seed_jax.models.tokenizer import Tokenizer
from seed_jax.models.vision import Grid, VisionSpec

IMAGE_PLACEHOLDER = "<image>"
VISION_START, IMAGE_PAD, VISION_END = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
MIN_PATCH_BUCKET = 64  # patches per call are padded to a power of two from here: few compiled programs
_CACHE_FRAMES = 4096


def frame_key(frame: np.ndarray) -> tuple:
  """Identity of a frame's content (equal pixels, equal key): frames are compared and cached by it."""
  return frame.shape, hashlib.blake2b(np.ascontiguousarray(frame).tobytes(), digest_size=16).digest()


@dataclasses.dataclass(frozen=True, eq=False)
class Image:
  """A frame prepared for the policy: the processor's patches [N, patch_dim] and grid, its content key and the
  checkpoint's VL spec (placeholder id, tower settings) that places it in a call's rows. Samples and
  mini-batches carry these, so nothing after the tokenizer needs the codec."""
  patches_NP: np.ndarray
  grid: Grid
  key: tuple
  vls: vlm.VLSpec


class ImageCodec:
  """A VL checkpoint's image side: its spec's token ids and merge size and its processor's pixel bounds."""

  def __init__(self, vls: vlm.VLSpec, processor: image_processing.ImageProcessorConfig):
    self.vls, self.processor = vls, processor
    self._cache: dict[tuple, Image] = {}

  @classmethod
  def from_folder(cls, path: str, frame_pixels: tuple[int, int] = (0, 0)) -> "ImageCodec":
    """From a Qwen2.5-VL checkpoint folder: config.json and, where present, preprocessor_config.json;
    `frame_pixels` (min, max) bounds each frame before the processor (image_processing.bound_frame; 0 = none)."""
    with open(os.path.join(path, "config.json")) as f:
      vls = vlm.VLSpec.from_hf_config(json.load(f))
    proc = os.path.join(path, "preprocessor_config.json")
    cfg = image_processing.ImageProcessorConfig()
    if os.path.exists(proc):
      with open(proc) as f:
        cfg = image_processing.ImageProcessorConfig.from_hf_config(json.load(f))
    return cls(vls, dataclasses.replace(cfg, frame_min_pixels=frame_pixels[0], frame_max_pixels=frame_pixels[1]))

  def image(self, frame: np.ndarray) -> Image:
    """The Image of a uint8 [H, W, 3] frame (resized into the pixel bounds; deterministic, so a frame
    reattached later gives the same numbers)."""
    key = frame_key(frame)
    if key not in self._cache:
      if len(self._cache) >= _CACHE_FRAMES:
        self._cache.clear()
      self._cache[key] = Image(*image_processing.preprocess(frame, self.processor), key, self.vls)
    return self._cache[key]

  def patches(self, frame: np.ndarray) -> tuple[np.ndarray, Grid]:
    """The processor's patches [N, patch_dim] and grid of a frame."""
    img = self.image(frame)
    return img.patches_NP, img.grid

  def num_tokens(self, frame: np.ndarray) -> int:
    return vision.num_merged(self.vls.vision, self.image(frame).grid)


class VLTokenizer(Tokenizer):
  """A tokenizer whose chat prompts take one frame in place of their `<image>` placeholder."""

  def __init__(self, base: Tokenizer, codec: ImageCodec):
    self.hf, self.eos_ids, self.pad_id, self.codec = base.hf, base.eos_ids, base.pad_id, codec
    vocab = base.hf.get_vocab()
    ids = {s: vocab.get(s) for s in (VISION_START, IMAGE_PAD, VISION_END)}
    want = {VISION_START: codec.vls.vision_start_token_id, IMAGE_PAD: codec.vls.image_token_id,
            VISION_END: codec.vls.vision_end_token_id}
    if ids != want:
      raise ValueError(f"the tokenizer maps the vision tokens to {ids} but the checkpoint expects {want}")

  def encode_chat(self, user_message: str, image: np.ndarray | None = None) -> list[int]:
    text = self.chat_prompt(user_message)
    if image is None:  # a text prompt (the analysis, a text observation): "<image>" in it is plain text
      return self.encode(text)
    n = text.count(IMAGE_PLACEHOLDER)
    if n != 1:
      raise ValueError(f"a step prompt with a frame takes exactly one {IMAGE_PLACEHOLDER} placeholder, got {n}")
    vision_tokens = VISION_START + IMAGE_PAD * self.codec.num_tokens(image) + VISION_END
    return self.encode(text.replace(IMAGE_PLACEHOLDER, vision_tokens))


def prepare(tokenizer: Tokenizer, frames: Sequence | None) -> list[Image | None] | None:
  """One Image (or None) per uint8 frame (or None), from the tokenizer's codec; None without frames."""
  if frames is None or all(f is None for f in frames):
    return None
  if not isinstance(tokenizer, VLTokenizer):
    raise ValueError("samples with images need a vision-language policy (config.model.path); or set "
                     "config.env.observation='text'")
  return [None if f is None else tokenizer.codec.image(f) for f in frames]


# (row, first column, prompt ids, response ids, Image or None): one sequence of a call's token rows.
Segment = tuple[int, int, Sequence[int], Sequence[int], "Image | None"]


def spec_of(images: Sequence["Image | None"]) -> vlm.VLSpec | None:
  """The VL spec of the first of `images` that is an Image (None: no image)."""
  return next((img.vls for img in images if img is not None), None)


def patch_bucket(segments: Sequence[Segment]) -> int:
  """The padded patch count `layout_images` gives these segments (0 without images): a power of two from
  MIN_PATCH_BUCKET holding the distinct images' patches."""
  distinct = {img.key: img for *_, img in segments if img is not None}
  n = sum(len(img.patches_NP) for img in distinct.values())
  return max(MIN_PATCH_BUCKET, 1 << (n - 1).bit_length()) if n else 0


def layout_images(rows: int, length: int, segments: Sequence[Segment], patches: int = 0,
                  vs: VisionSpec | None = None) -> vlm.ImageBatch | None:
  """The ImageBatch of a call whose token rows are [rows, length]; None when no sequence has a frame.

  Each segment is its own position run from 0: its prompt's M-RoPE positions (vlm.rope_index), then its
  response at text positions + the rope offset, as decoding gives them. Only the prompt's placeholders take
  feature rows (an image token the policy sampled is an ordinary token). Equal frames share one set of rows
  (a step's ordinary and skill contexts, a group's first frames): the tower encodes each distinct frame once.
  Patches are padded to a power of two (or to `patches`, so micro-batches stacked by `stack_batches` share one
  count) by one blank image whose rows nothing reads (`vs`: the policy's tower spec, for segments that have no
  image). Tokens outside the segments (padding) get position 0."""
  vls = spec_of([s[-1] for s in segments])
  vs = vls.vision if vls is not None else vs
  index = np.full((rows, length), -1, np.int32)
  positions = np.zeros((rows, 3, length), np.int32)
  pixels, grids, first_row = [], [], {}
  n_rows = 0
  for r, c, prompt, response, img in segments:
    prompt = np.asarray(prompt, np.int32)
    P, R = len(prompt), len(response)
    if img is None:
      positions[r, :, c:c + P + R] = np.arange(P + R)
      continue
    key = img.key
    if key not in first_row:
      first_row[key] = n_rows
      pixels.append(img.patches_NP)
      grids.append(img.grid)
      n_rows += vision.num_merged(vs, img.grid)
    pos_3BT, delta_B = vlm.rope_index(vls, prompt[None], [img.grid])
    positions[r, :, c:c + P] = pos_3BT[:, 0]
    positions[r, :, c + P:c + P + R] = P + int(delta_B[0]) + np.arange(R)
    is_image = prompt == vls.image_token_id
    index[r, c:c + P][is_image] = first_row[key] + np.arange(int(is_image.sum()))
  if not grids and not patches:
    return None
  n = sum(len(p) for p in pixels)
  padded = max(MIN_PATCH_BUCKET, 1 << max(n - 1, 0).bit_length(), patches)
  if padded > n:  # multiples of merge_unit (4) on both sides: a (1, 2, k) blank fills the gap exactly
    pixels.append(np.zeros((padded - n, vs.patch_dim), np.float32))
    grids.append((1, vs.merge_size, (padded - n) // vs.merge_size))
  return vlm.ImageBatch(pixels_NP=np.concatenate(pixels), vision=vision.vision_inputs(vs, grids),
                        index_BT=index, positions_B3T=positions)


# Several processes: each lays out its own rows' images, all padded to one agreed patch count, as its block of
# the call's image batch. The blocks concatenate along the patch axis in the order of the processes' row blocks
# (distributed.global_batch), so a block numbers its feature rows, window units and attention segments after
# the blocks before it: every placeholder then reads its own frame and no frame attends to another's.


def agreed_patches(patches: int, mesh=None) -> int:
  """The patch count of one call over every process (each process's own bucket in; 0: no image anywhere)."""
  return distributed.agree_max(patches)[0] if mesh is not None else patches


def as_block(batch: vlm.ImageBatch, mesh=None) -> vlm.ImageBatch:
  """This process's `batch` renumbered as its block of the call's image batch (unchanged on one process)."""
  if mesh is None or jax.process_count() == 1:
    return batch
  return renumbered(batch, distributed.block_index(mesh))


def renumbered(batch: vlm.ImageBatch, k: int) -> vlm.ImageBatch:
  """`batch` as block k of blocks of its patch count: feature rows and window units from k x its units,
  attention segments from k x its patches (each block has at most that many)."""
  v = batch.vision
  N, U = batch.pixels_NP.shape[0], v.window_index_U.shape[0]
  return batch.replace(
      vision=v.replace(window_index_U=v.window_index_U + k * U, reverse_index_U=v.reverse_index_U + k * U,
                       full_segment_N=v.full_segment_N + k * N, window_segment_N=v.window_segment_N + k * N),
      index_BT=np.where(batch.index_BT >= 0, batch.index_BT + k * U, -1).astype(np.int32))


def call_images(rows: int, length: int, segments: Sequence[Segment], vs: VisionSpec | None, mesh=None,
                patches: int = 0) -> vlm.ImageBatch | None:
  """The ImageBatch of one call whose token rows are [rows, length] on each process, ready for the jitted
  call: on one process `layout_images`; on several (collective) this process's block, placed with its rows
  and patches on its own devices. None when no process has a frame in the call."""
  multi = mesh is not None and jax.process_count() > 1
  n = agreed_patches(max(patch_bucket(segments), patches), mesh if multi else None)
  if not n:
    return None
  batch = layout_images(rows, length, segments, n, vs)
  return distributed.global_batch(as_block(batch, mesh), mesh) if multi else batch


def micro_batched(rows: int, length: int, segments: Sequence[Sequence[Segment]], vs: VisionSpec | None = None,
                  mesh=None) -> vlm.ImageBatch | None:
  """One ImageBatch per group of `rows` rows (a micro-batch of the update), all padded to one patch count and
  concatenated along every leaf's leading axis, so the update's per-micro-batch split gives each group its own
  images with its own feature-row indices. segments[g]: group g's, rows local to the group. None without
  images. On several processes (collective) the count is agreed and each group is this process's block of the
  micro-batch's images (distributed.grouped_global_batch places them)."""
  multi = mesh is not None and jax.process_count() > 1
  patches = agreed_patches(max((patch_bucket(segs) for segs in segments), default=0), mesh if multi else None)
  if not patches:
    return None
  batches = [as_block(layout_images(rows, length, segs, patches, vs), mesh) for segs in segments]
  return jax.tree.map(lambda *xs: np.concatenate(xs), *batches)
