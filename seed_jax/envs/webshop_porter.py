"""The Porter stemmer as Martin Porter's reference implementation runs it, which Lucene's PorterStemFilter
(and so the original WebShop index) uses. It departs from the 1980 paper in three places: words of one or
two letters are left alone, step 2 maps -bli to -ble (not -abli to -able) and adds -logi to -log.
"""
from __future__ import annotations

import functools

# Step 2 and step 3: for the letter before the last (step 2) or the last letter (step 3), the suffixes to try in
# order; the first that matches is the only candidate, replaced when the stem before it has measure > 0.
_STEP2 = {
  "a": (("ational", "ate"), ("tional", "tion")),
  "c": (("enci", "ence"), ("anci", "ance")),
  "e": (("izer", "ize"),),
  "l": (("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous")),
  "o": (("ization", "ize"), ("ation", "ate"), ("ator", "ate")),
  "s": (("alism", "al"), ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous")),
  "t": (("aliti", "al"), ("iviti", "ive"), ("biliti", "ble")),
  "g": (("logi", "log"),),
}
_STEP3 = {
  "e": (("icate", "ic"), ("ative", ""), ("alize", "al")),
  "i": (("iciti", "ic"),),
  "l": (("ical", "ic"), ("ful", "")),
  "s": (("ness", ""),),
}
# Step 4: suffixes removed when the remaining stem has measure > 1, keyed by the letter before the last.
_STEP4 = {
  "a": ("al",), "c": ("ance", "ence"), "e": ("er",), "i": ("ic",), "l": ("able", "ible"),
  "n": ("ant", "ement", "ment", "ent"), "o": ("ion", "ou"), "s": ("ism",), "t": ("ate", "iti"), "u": ("ous",),
  "v": ("ive",), "z": ("ize",),
}


class _Word:
  """A word being stemmed: b[0..k] is the current word (letters past k are stale), b[0..j] the stem before the
  suffix that ends() last matched."""

  def __init__(self, word: str):
    self.b, self.k, self.j = list(word), len(word) - 1, 0

  def cons(self, i: int) -> bool:
    ch = self.b[i]
    if ch in "aeiou":
      return False
    if ch == "y":
      return i == 0 or not self.cons(i - 1)
    return True

  def measure(self) -> int:
    """The number of vowel-consonant sequences in b[0..j]."""
    n, prev_vowel = 0, False
    for i in range(self.j + 1):
      vowel = not self.cons(i)
      n += prev_vowel and not vowel
      prev_vowel = vowel
    return n

  def vowel_in_stem(self) -> bool:
    return any(not self.cons(i) for i in range(self.j + 1))

  def double_cons(self, i: int) -> bool:
    return i >= 1 and self.b[i] == self.b[i - 1] and self.cons(i)

  def cvc(self, i: int) -> bool:
    return (i >= 2 and self.cons(i) and not self.cons(i - 1) and self.cons(i - 2)
            and self.b[i] not in "wxy")

  def ends(self, s: str) -> bool:
    start = self.k - len(s) + 1
    if start < 0 or "".join(self.b[start:self.k + 1]) != s:
      return False
    self.j = self.k - len(s)
    return True

  def set_to(self, s: str) -> None:
    self.b[self.j + 1:] = list(s)
    self.k = self.j + len(s)

  def replace(self, s: str) -> None:
    if self.measure() > 0:
      self.set_to(s)

  def text(self) -> str:
    return "".join(self.b[:self.k + 1])


def _step1ab(w: _Word) -> None:
  if w.b[w.k] == "s":
    if w.ends("sses"):
      w.k -= 2
    elif w.ends("ies"):
      w.set_to("i")
    elif w.b[w.k - 1] != "s":
      w.k -= 1
  if w.ends("eed"):
    if w.measure() > 0:
      w.k -= 1
  elif (w.ends("ed") or w.ends("ing")) and w.vowel_in_stem():
    w.k = w.j
    if w.ends("at"):
      w.set_to("ate")
    elif w.ends("bl"):
      w.set_to("ble")
    elif w.ends("iz"):
      w.set_to("ize")
    elif w.double_cons(w.k):
      if w.b[w.k - 1] not in "lsz":
        w.k -= 1
    elif w.measure() == 1 and w.cvc(w.k):
      w.set_to("e")


def _step1c(w: _Word) -> None:
  if w.ends("y") and w.vowel_in_stem():
    w.b[w.k] = "i"


def _map_suffix(w: _Word, table: dict[str, tuple[tuple[str, str], ...]], key_pos: int) -> None:
  if w.k + key_pos < 0:
    return
  for suffix, repl in table.get(w.b[w.k + key_pos], ()):
    if w.ends(suffix):
      w.replace(repl)
      return


def _step4(w: _Word) -> None:
  if w.k == 0:
    return
  for suffix in _STEP4.get(w.b[w.k - 1], ()):
    if w.ends(suffix):
      if suffix == "ion" and not (w.j >= 0 and w.b[w.j] in "st"):
        continue  # -ion goes only after s or t
      if w.measure() > 1:
        w.k = w.j
      return


def _step5(w: _Word) -> None:
  w.j = w.k
  if w.b[w.k] == "e":
    m = w.measure()
    if m > 1 or (m == 1 and not w.cvc(w.k - 1)):
      w.k -= 1
  if w.b[w.k] == "l" and w.double_cons(w.k) and w.measure() > 1:
    w.k -= 1


@functools.lru_cache(maxsize=1 << 18)
def stem(word: str) -> str:
  """The stem of a lower-cased word."""
  if len(word) <= 2:
    return word
  w = _Word(word)
  _step1ab(w)
  _step1c(w)
  _map_suffix(w, _STEP2, -1)
  _map_suffix(w, _STEP3, 0)
  _step4(w)
  _step5(w)
  return w.text()
