"""EZPoints' RGB observation: the two cards on a green table (gym-cards' layout) and the formula below them,
drawn with 5x7 bitmap glyphs in numpy."""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

# 5x7 bitmap glyphs for the card ranks, the formula tokens and the four suits (h, d, s, c).
_GLYPHS = {
    "0": (" ### ", "#   #", "#  ##", "# # #", "##  #", "#   #", " ### "),
    "1": ("  #  ", " ##  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "),
    "2": (" ### ", "#   #", "    #", "   # ", "  #  ", " #   ", "#####"),
    "3": ("#####", "   # ", "  #  ", "   # ", "    #", "#   #", " ### "),
    "4": ("   # ", "  ## ", " # # ", "#  # ", "#####", "   # ", "   # "),
    "5": ("#####", "#    ", "#### ", "    #", "    #", "#   #", " ### "),
    "6": ("  ## ", " #   ", "#    ", "#### ", "#   #", "#   #", " ### "),
    "7": ("#####", "    #", "   # ", "  #  ", " #   ", " #   ", " #   "),
    "8": (" ### ", "#   #", "#   #", " ### ", "#   #", "#   #", " ### "),
    "9": (" ### ", "#   #", "#   #", " ####", "    #", "   # ", " ##  "),
    "A": (" ### ", "#   #", "#   #", "#####", "#   #", "#   #", "#   #"),
    "J": ("  ###", "   # ", "   # ", "   # ", "   # ", "#  # ", " ##  "),
    "Q": (" ### ", "#   #", "#   #", "#   #", "# # #", "#  # ", " ## #"),
    "K": ("#   #", "#  # ", "# #  ", "##   ", "# #  ", "#  # ", "#   #"),
    "+": ("     ", "  #  ", "  #  ", "#####", "  #  ", "  #  ", "     "),
    "*": ("     ", "# # #", " ### ", "#####", " ### ", "# # #", "     "),
    "=": ("     ", "     ", "#####", "     ", "#####", "     ", "     "),
    "h": ("     ", " # # ", "#####", "#####", " ### ", "  #  ", "     "),
    "d": ("  #  ", " ### ", "#####", "#####", " ### ", "  #  ", "     "),
    "s": ("  #  ", " ### ", "#####", "#####", "# # #", "  #  ", " ### "),
    "c": ("  #  ", " ### ", "  #  ", "## ##", "#####", "  #  ", " ### "),
}
_GREEN, _WHITE, _RED, _BLACK, _GRAY = (53, 101, 77), (255, 255, 255), (200, 30, 30), (20, 20, 20), (150, 150, 150)


@functools.lru_cache(maxsize=None)
def _glyph(ch: str, scale: int) -> np.ndarray:
  return np.kron(np.array([[c == "#" for c in row] for row in _GLYPHS[ch]]), np.ones((scale, scale), bool))


def _draw_text(img: np.ndarray, text: str, y: int, x: int, scale: int, color: tuple[int, int, int]) -> None:
  """Stamps glyphs left to right (6 x scale pixels per character), clipped at the image border."""
  for ch in text:
    if ch in _GLYPHS:
      mask = _glyph(ch, scale)
      h, w = min(mask.shape[0], img.shape[0] - y), min(mask.shape[1], img.shape[1] - x)
      if h > 0 and w > 0:
        img[y:y + h, x:x + w][mask[:h, :w]] = color
    x += 6 * scale


def render_image(cards: Sequence[str], formula: Sequence[str], size: int = 300) -> np.ndarray:
  """uint8 [size, size, 3]: the two cards side by side on a green table (gym-cards' layout) and the formula."""
  img = _render_table(tuple(cards), size).copy()
  _draw_text(img, " ".join(formula), int(size * 0.86), 10, 2, _WHITE)
  return img


@functools.lru_cache(maxsize=64)
def _render_table(cards: tuple[str, ...], size: int) -> np.ndarray:
  img = np.empty((size, size, 3), np.uint8)
  img[:] = _GREEN
  cw = int(size / len(cards) * 0.9)
  ch = cw * 7 // 5
  for i, card in enumerate(cards):
    x0, y0 = 5 + int(i * cw * 1.1), (size - ch) // 2
    img[y0:y0 + ch, x0:x0 + cw] = _GRAY
    img[y0 + 2:y0 + ch - 2, x0 + 2:x0 + cw - 2] = _WHITE
    rank, suit = card[1:].upper().replace("T", "10"), card[0].lower()
    color = _RED if suit in "hd" else _BLACK
    _draw_text(img, rank, y0 + 8, x0 + 8, 2, color)
    _draw_text(img, suit, y0 + 26, x0 + 8, 2, color)
    scale = 6 if len(rank) == 1 else 5
    _draw_text(img, rank, y0 + ch // 2 - 7 * scale // 2 - 10, x0 + (cw - (6 * len(rank) - 1) * scale) // 2, scale,
               color)
    _draw_text(img, suit, y0 + ch // 2 + 7 * scale // 2, x0 + (cw - 5 * 4) // 2, 4, color)
  img.flags.writeable = False  # shared by the cache: callers draw on a copy
  return img
