"""Passage retrieval over HTTP with the Search-R1 protocol: a built-in BM25 server and a client.

Protocol (as served by Search-R1's `search_r1/search/retrieval_server.py`):
  POST /retrieve  {"queries": [q, ...], "topk": k, "return_scores": bool}
  -> {"result": [[{"document": {"id": ..., "contents": "Title\\ntext"}, "score": s}, ...], ...]}
  With "return_scores": false each inner item is the bare document dict. The client accepts both shapes, so
  any Search-R1 compatible retriever (e.g. dense e5 + FAISS) can be used in place of the built-in one.

Built-in server (numpy + stdlib only), one command:
  python -m seed_jax.envs.retriever --corpus passages.jsonl --port 8000
where each JSONL line is {"id": ..., "contents": "Title\\ntext"}. It also answers GET /health.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import http.client
import http.server
import json
import re
import sys
import threading
import time
import urllib.parse
from typing import Any, Sequence

import numpy as np

# Lucene's default English stop set: these words carry no retrieval signal and have the longest postings.
_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with".split())
_TOKEN_RE = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
  """Lower-cased word tokens without stop words (no stemming)."""
  return [t for t in _TOKEN_RE.findall(text.lower()) if t not in _STOPWORDS]


class RetrieverError(RuntimeError):
  """A retrieval request failed (after the client's retries) or the reply broke the protocol."""


class RetrieverUnavailableError(RetrieverError):
  """The retriever could not be reached by the start-up health check."""


# ----------------------------------------------------------------------------------------------- BM25 index


class BM25Index:
  """Okapi BM25 over a passage list, with Pyserini's defaults k1=0.9, b=0.4 and Lucene's idf
  log(1 + (N - df + 0.5) / (df + 0.5)). Per-posting impacts are precomputed, so a query is a gather and a
  segmented sum over the postings of its terms (cost scales with postings, not with the corpus size)."""

  def __init__(self, docs: Sequence[dict[str, Any]], k1: float = 0.9, b: float = 0.4):
    if not docs:
      raise ValueError("BM25Index: the corpus is empty")
    self.docs = [{"id": str(d.get("id", i)), "contents": d["contents"]} for i, d in enumerate(docs)]
    vocab: dict[str, int] = {}
    term_ids: list[int] = []
    doc_ids: list[int] = []
    tfs: list[int] = []
    doc_len = np.zeros(len(docs), np.float32)
    for i, d in enumerate(self.docs):
      toks = tokenize(d["contents"])
      doc_len[i] = len(toks)
      for tok, tf in collections.Counter(toks).items():
        term_ids.append(vocab.setdefault(tok, len(vocab)))
        doc_ids.append(i)
        tfs.append(tf)
    self.vocab = vocab
    term_B = np.asarray(term_ids, np.int64)
    order = np.argsort(term_B, kind="stable")  # CSR by term; doc ids stay ascending inside a term
    self.post_doc = np.asarray(doc_ids, np.int32)[order]
    tf_P = np.asarray(tfs, np.float32)[order]
    df_V = np.bincount(term_B, minlength=len(vocab))
    self.term_ptr = np.concatenate([[0], np.cumsum(df_V)]).astype(np.int64)
    n_docs = len(docs)
    idf_V = np.log1p((n_docs - df_V + 0.5) / (df_V + 0.5)).astype(np.float32)
    norm_P = k1 * (1.0 - b + b * doc_len[self.post_doc] / max(float(doc_len.mean()), 1e-6))
    idf_P = np.repeat(idf_V, df_V)
    self.post_weight = (idf_P * tf_P * (k1 + 1.0) / (tf_P + norm_P)).astype(np.float32)

  @classmethod
  def from_jsonl(cls, path: str) -> "BM25Index":
    docs = []
    with open(path, encoding="utf-8") as f:
      for lineno, line in enumerate(f, 1):
        if not line.strip():
          continue
        row = json.loads(line)
        if not isinstance(row, dict) or not isinstance(row.get("contents"), str):
          raise ValueError(f"{path}:{lineno}: each line needs a string field 'contents', got {line[:80]!r}")
        docs.append(row)
    return cls(docs)

  def search(self, query: str, topk: int) -> list[tuple[int, float]]:
    """(doc index, score) of the best `topk` passages with a positive score, best first."""
    counts = collections.Counter(t for t in tokenize(query) if t in self.vocab)
    if not counts or topk <= 0:
      return []
    ids, weights = [], []
    for tok, qtf in counts.items():
      v = self.vocab[tok]
      lo, hi = self.term_ptr[v], self.term_ptr[v + 1]
      ids.append(self.post_doc[lo:hi])
      weights.append(self.post_weight[lo:hi] * qtf)  # a repeated query term counts once per occurrence
    cand, inverse = np.unique(np.concatenate(ids), return_inverse=True)
    score_C = np.bincount(inverse, weights=np.concatenate(weights))
    k = min(topk, len(cand))
    top = np.argpartition(-score_C, k - 1)[:k]
    top = top[np.lexsort((cand[top], -score_C[top]))]  # ties: lower doc index first, so results are stable
    return [(int(cand[j]), float(score_C[j])) for j in top]


# ----------------------------------------------------------------------------------------------- server


def _make_handler(index: BM25Index, default_topk: int) -> type[http.server.BaseHTTPRequestHandler]:

  class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client reuses one connection
    disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms delayed-ACK stalls

    def _reply(self, status: int, payload: dict[str, Any]) -> None:
      body = json.dumps(payload).encode()
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(body)))
      self.end_headers()
      self.wfile.write(body)

    def do_GET(self) -> None:
      if self.path.rstrip("/") == "/health":
        self._reply(200, {"status": "ok", "passages": len(index.docs)})
      else:
        self._reply(404, {"error": f"no such path {self.path!r}; use POST /retrieve or GET /health"})

    def do_POST(self) -> None:
      body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
      if self.path.rstrip("/") != "/retrieve":
        self._reply(404, {"error": f"no such path {self.path!r}; use POST /retrieve"})
        return
      try:
        req = json.loads(body)
        if not isinstance(req, dict):
          raise ValueError("the body must be a JSON object")
        queries, topk = req["queries"], req.get("topk") or default_topk
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
          raise ValueError("'queries' must be a list of strings")
        if not isinstance(topk, int) or topk < 1:
          raise ValueError(f"'topk' must be a positive integer, got {topk!r}")
      except (ValueError, KeyError, TypeError) as e:
        self._reply(400, {"error": f"bad request: {e!r}"})
        return
      with_scores = bool(req.get("return_scores", False))
      result = []
      for q in queries:
        hits = index.search(q, topk)
        docs = [index.docs[i] for i, _ in hits]
        result.append([{"document": d, "score": s} for d, (_, s) in zip(docs, hits)] if with_scores else docs)
      self._reply(200, {"result": result})

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
      pass  # one line per request would swamp the terminal during RL

  return Handler


@dataclasses.dataclass
class RetrieverServer:
  """A running built-in server (in a daemon thread); `url` is the full /retrieve endpoint."""
  httpd: http.server.ThreadingHTTPServer
  thread: threading.Thread

  @property
  def url(self) -> str:
    host, port = self.httpd.server_address[:2]
    return f"http://{host}:{port}/retrieve"

  def close(self) -> None:
    self.httpd.shutdown()
    self.httpd.server_close()
    self.thread.join(timeout=5)

  def __enter__(self) -> "RetrieverServer":
    return self

  def __exit__(self, *exc: Any) -> None:
    self.close()


def start_server(index: BM25Index, host: str = "127.0.0.1", port: int = 0, topk: int = 3) -> RetrieverServer:
  """Serves `index` in a background thread; port 0 picks a free ephemeral port."""
  httpd = http.server.ThreadingHTTPServer((host, port), _make_handler(index, topk))
  httpd.daemon_threads = True
  thread = threading.Thread(target=httpd.serve_forever, name="retriever", daemon=True)
  thread.start()
  return RetrieverServer(httpd, thread)


# ----------------------------------------------------------------------------------------------- client


@dataclasses.dataclass(frozen=True)
class Passage:
  contents: str  # "Title\ntext", as in the Search-R1 corpora
  score: float | None = None

  @property
  def title(self) -> str:
    return self.contents.split("\n", 1)[0]

  @property
  def text(self) -> str:
    parts = self.contents.split("\n", 1)
    return parts[1] if len(parts) > 1 else ""


def _passage(item: Any) -> Passage:
  doc, score = (item["document"], item.get("score")) if isinstance(item, dict) and "document" in item else (item, None)
  if not isinstance(doc, dict):
    raise RetrieverError(f"malformed retriever reply: a result item is {type(doc).__name__}, not a document dict")
  if isinstance(doc.get("contents"), str):
    contents = doc["contents"]
  elif isinstance(doc.get("text"), str):  # some corpora store title and text separately
    contents = f"{doc.get('title', '')}\n{doc['text']}"
  else:
    raise RetrieverError(f"malformed retriever reply: document without 'contents' (keys {sorted(doc)})")
  return Passage(contents, None if score is None else float(score))


class RetrieverClient:
  """Client for a Search-R1 style /retrieve endpoint, with a per-request timeout and retries (exponential
  backoff) on connection errors and 5xx replies. One persistent connection; not shared across threads."""

  def __init__(self, url: str, timeout_s: float = 10.0, retries: int = 2, backoff_s: float = 0.5):
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
      raise ValueError(f"retriever_url must look like http://host:port/retrieve, got {url!r}")
    self.url = url
    self._https = parsed.scheme == "https"
    self._host, self._port = parsed.hostname, parsed.port
    self._path = parsed.path if parsed.path not in ("", "/") else "/retrieve"
    self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
    self._conn: http.client.HTTPConnection | None = None

  def _post(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    if self._conn is None:
      cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
      self._conn = cls(self._host, self._port, timeout=timeout_s)
    self._conn.timeout = timeout_s
    if self._conn.sock is not None:
      self._conn.sock.settimeout(timeout_s)
    self._conn.request("POST", self._path, body=json.dumps(payload), headers={"Content-Type": "application/json"})
    resp = self._conn.getresponse()
    body = resp.read()
    if resp.status >= 500:
      raise ConnectionError(f"HTTP {resp.status}: {body[:200]!r}")
    if resp.status != 200:  # a client error does not get better by retrying
      raise RetrieverError(f"retriever at {self.url} answered HTTP {resp.status}: {body[:300]!r}")
    return json.loads(body)

  def retrieve(self, queries: Sequence[str], topk: int = 3, *, retries: int | None = None,
               timeout_s: float | None = None) -> list[list[Passage]]:
    """The top-`topk` passages for each query, best first (a server may return fewer)."""
    retries = self.retries if retries is None else retries
    payload = {"queries": list(queries), "topk": topk, "return_scores": True}
    last: Exception | None = None
    for attempt in range(retries + 1):
      try:
        reply = self._post(payload, self.timeout_s if timeout_s is None else timeout_s)
        break
      except (OSError, http.client.HTTPException, json.JSONDecodeError) as e:  # ConnectionError is an OSError
        last = e
        self.close()
        if attempt < retries:
          time.sleep(self.backoff_s * 2 ** attempt)
    else:
      raise RetrieverError(f"retriever at {self.url} failed after {retries + 1} attempt(s): {last!r}")
    result = reply.get("result") if isinstance(reply, dict) else None
    if not isinstance(result, list) or len(result) != len(queries) or not all(isinstance(r, list) for r in result):
      raise RetrieverError(f"malformed retriever reply: expected {{'result': [list] * {len(queries)}}}, "
                           f"got {str(reply)[:200]}")
    return [[_passage(item) for item in r] for r in result]

  def check(self, timeout_s: float = 5.0) -> None:
    """Start-up health check: one real /retrieve call (any Search-R1 server answers it)."""
    try:
      self.retrieve(["health check"], topk=1, retries=1, timeout_s=timeout_s)
    except RetrieverError as e:
      raise RetrieverUnavailableError(
          f"retriever at {self.url} is unreachable or broken ({e}). Start the built-in one with "
          f"`python -m seed_jax.envs.retriever --corpus passages.jsonl --port 8000` or set retriever_url "
          f"to a running Search-R1 compatible server.") from e

  def close(self) -> None:
    if self._conn is not None:
      self._conn.close()
      self._conn = None


def main(argv: Sequence[str] | None = None) -> None:
  p = argparse.ArgumentParser(description="Built-in BM25 retriever with the Search-R1 /retrieve protocol.")
  p.add_argument("--corpus", required=True, help="JSONL passages, one {'id', 'contents'} object per line")
  p.add_argument("--host", default="127.0.0.1", help="interface to bind (0.0.0.0 to serve other machines)")
  p.add_argument("--port", type=int, default=8000, help="TCP port; 0 picks a free one")
  p.add_argument("--topk", type=int, default=3, help="passages per query when a request gives no topk")
  args = p.parse_args(argv)
  t0 = time.time()
  index = BM25Index.from_jsonl(args.corpus)
  server = start_server(index, args.host, args.port, args.topk)
  # One parseable line on stdout once the port is bound, so scripts and tests can wait for it.
  print(f"retriever ready: {len(index.docs)} passages indexed in {time.time() - t0:.1f}s, serving {server.url}",
        flush=True)
  try:
    server.thread.join()
  except KeyboardInterrupt:
    server.close()


if __name__ == "__main__":
  main(sys.argv[1:])
