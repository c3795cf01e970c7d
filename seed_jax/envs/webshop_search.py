"""WebShop search: a numpy BM25 index that mirrors the original's Lucene setup.

The original indexes one document per product (search_engine/convert_product_file_format.py: title,
description, first bullet point and "name: v1, v2, and name: ..." options text, lower-cased) with pyserini's
default English analyzer, and searches it with pyserini's LuceneSearcher defaults (BM25, k1=0.9, b=0.4),
returning the top 50. Here:
- analyzer: UAX#29 word segmentation (what Lucene's StandardTokenizer implements), English possessive
  removal, lower-casing, Lucene's English stop words, Porter stemming (webshop_porter, the reference implementation Lucene uses);
- scoring: Lucene 9's BM25Similarity (float32 idf and per-length cache, lossy one-byte document-length
  norms via SmallFloat.intToByte4) with pyserini's bag-of-words query (a repeated query term counts as a
  boost); hits are ordered by score, then by catalog position (Lucene's doc id order).
Known residual differences: rare tokenization corner cases (UAX#29 versions, tokens over 255 chars) and
float summation order, which can swap exactly tied scores.
"""
from __future__ import annotations

import collections

import numpy as np
import regex

from seed_jax.envs.webshop_porter import stem

SEARCH_RETURN_N = 50
# Lucene's EnglishAnalyzer.ENGLISH_STOP_WORDS_SET.
STOP_WORDS = frozenset(
  "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
  "they this to was will with".split())
_BOUNDARY = regex.compile(r"(?w)\b")
_WORDLIKE = regex.compile(r"[^\W_]")  # segments holding a letter, digit or ideograph become tokens
_APOSTROPHES = "'\u2019\uff07"

def analyze(text: str) -> list[str]:
  tokens = []
  for seg in _BOUNDARY.split(text):
    if not _WORDLIKE.search(seg):
      continue
    if len(seg) >= 2 and seg[-1] in "sS" and seg[-2] in _APOSTROPHES:  # EnglishPossessiveFilter
      seg = seg[:-2]
    seg = seg.lower()
    if seg and seg not in STOP_WORDS:
      tokens.append(stem(seg))
  return tokens


def _int4_to_long(i: int) -> int:
  bits, shift = i & 0x07, (i >> 3) - 1
  return bits if shift == -1 else (bits | 0x08) << shift


def _long_to_int4(i: int) -> int:
  num_bits = i.bit_length()
  if num_bits < 4:
    return i
  shift = num_bits - 4
  return ((i >> shift) & 0x07) | ((shift + 1) << 3)


_FREE_VALUES = 255 - _long_to_int4(2**31 - 1)  # 24: lengths below this are stored exactly


def quantized_length(n: int) -> int:
  """A document length after Lucene's one-byte norm round trip (SmallFloat.intToByte4, then byte4ToInt)."""
  if n < _FREE_VALUES:
    return n
  return _FREE_VALUES + _int4_to_long(_long_to_int4(n - _FREE_VALUES))


class BM25Index:
  """Postings per analyzed term; doc ids are positions in the `documents` list."""

  def __init__(self, documents: list[str], k1: float = 0.9, b: float = 0.4):
    postings: dict[str, dict[int, int]] = collections.defaultdict(dict)
    lengths = np.zeros(len(documents), np.int64)
    for doc_id, text in enumerate(documents):
      tokens = analyze(text)
      lengths[doc_id] = len(tokens)
      for t in tokens:
        postings[t][doc_id] = postings[t].get(doc_id, 0) + 1
    n_docs = len(documents)
    avgdl = np.float32(lengths.sum() / max(n_docs, 1))
    norm_len = np.array([quantized_length(int(n)) for n in lengths], np.float32)
    self._norm_inv_D = (np.float32(1) / (np.float32(k1) * ((np.float32(1 - b)) + np.float32(b) * norm_len / avgdl)))
    self._postings = {t: (np.fromiter(d.keys(), np.int64, len(d)), np.fromiter(d.values(), np.float32, len(d)))
                      for t, d in postings.items()}
    self._idf = {t: np.float32(np.log(1 + (n_docs - len(d) + 0.5) / (len(d) + 0.5))) for t, d in postings.items()}
    self._n_docs = n_docs

  def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
    """Doc ids of the top-k matching documents (those sharing at least one analyzed term with the query)."""
    return self.scored_search(query, k)[0]

  def scored_search(self, query: str, k: int = SEARCH_RETURN_N) -> tuple[list[int], list[float]]:
    """The top-k doc ids and their BM25 scores."""
    score_D = np.zeros(self._n_docs, np.float64)
    hit_D = np.zeros(self._n_docs, bool)
    for term, qtf in collections.Counter(analyze(query)).items():
      if term not in self._postings:
        continue
      docs, tf = self._postings[term]
      weight = np.float32(qtf) * self._idf[term]
      norm_inv = self._norm_inv_D[docs].astype(np.float64)
      term_score = (weight - weight / (1.0 + tf.astype(np.float64) * norm_inv)).astype(np.float32)
      score_D[docs] += term_score
      hit_D[docs] = True
    doc_ids = np.flatnonzero(hit_D)
    scores = score_D[doc_ids].astype(np.float32)
    order = np.lexsort((doc_ids, -scores))[:k]  # score descending, then doc id ascending
    return doc_ids[order].tolist(), scores[order].tolist()
