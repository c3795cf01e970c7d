"""Analyzer backends: the policy itself (greedy, with the current weights), an external OpenAI-compatible
chat-completions server (threaded, with retries and backoff), or the privileged gold-path oracle (the upper
bound). Each turns analysis prompts into raw replies; skills.analyze_trajectories builds the prompts and parses
the replies. `shuffled_skills` is the control that moves every skill to another task.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import email.utils
import http.client
import json
import logging
import os
import random
import threading
import time
import urllib.error
import urllib.request
from typing import Callable, Sequence

import ml_collections

from seed_jax import sft_oracle, templates
from seed_jax.envs.base import Trajectory
from seed_jax.skills import Analysis, Analyzer, SkillParse, parse_skill

log = logging.getLogger(__name__)


REPLY_TAIL_CHARS = 500  # of a failed reply, for a json_retry template's {reply_tail}


def json_retry_message(error: str = "", reply: str = "") -> str:
  """The follow-up user turn (its template) sent when a reply does not parse; a template may name the parse
  error ({error}) and the failed reply's tail ({reply_tail}), as the reference's retry turn does."""
  return templates.get("json_retry").render({"error": error, "reply_tail": reply[-REPLY_TAIL_CHARS:]})


@dataclasses.dataclass
class AnalyzerStats:
  requests: int = 0  # HTTP attempts (or policy prompts) sent
  retries: int = 0  # attempts repeated after a transient error
  failures: int = 0  # requests that produced no reply after all retries
  json_retries: int = 0  # follow-up "JSON only" turns sent

  def as_dict(self) -> dict[str, int]:
    return dataclasses.asdict(self)


class PolicyAnalyzer:
  """The policy analyzes its own trajectories: `generate` is the pipeline's greedy decoder with the current
  weights (one batched call, one attempt, no JSON retry)."""

  def __init__(self, generate: Callable[[list[str]], list[str]]):
    self._generate = generate
    self.stats = AnalyzerStats()

  def analyze(self, prompts: list[str]) -> list[str]:
    """Calls `generate` even with no prompts: with several processes the decode is collective."""
    replies = list(self._generate(list(prompts)))
    if len(replies) != len(prompts):
      raise ValueError(f"generate returned {len(replies)} replies for {len(prompts)} prompts")
    self.stats.requests += len(prompts)
    return replies


class OracleAnalyzer:
  """The privileged backend: gold-path skills (sft_oracle) for the trajectories the prompts were built from, in
  order. Its failure skills name the gold action the agent never saw, so it is the upper bound of what a skill
  can teach, not an analyzer the policy could imitate."""

  def __init__(self, trajs: Sequence[Trajectory], golds: Sequence[Sequence[str] | None], success_threshold: float):
    self._replies = [sft_oracle.oracle_reply(t, g, success_threshold) for t, g in zip(trajs, golds)]
    self.stats = AnalyzerStats()

  def analyze(self, prompts: list[str]) -> list[str]:
    if len(prompts) != len(self._replies):
      raise ValueError(f"oracle analyzer: {len(prompts)} prompts for {len(self._replies)} trajectories")
    self.stats.requests += len(prompts)
    return list(self._replies)


def shuffled_skills(analysis: Analysis, task_ids: Sequence[str], seed: int) -> Analysis:
  """The control: each trajectory gets the skill of a trajectory of another task (the tasks' order rotated by a
  seeded non-zero offset; the k-th trajectory of task A takes the k-th skill, cyclically, of its image task B),
  so the skills keep their backend's wording and carry no information about the task they are shown with.
  With one task there is no other: no skills."""
  tasks = sorted(set(task_ids))
  by_task = {t: [i for i, x in enumerate(task_ids) if x == t] for t in tasks}
  parses: list[SkillParse] = [SkillParse(None, None, False, "control: no other task")] * len(task_ids)
  if len(tasks) > 1:
    shift = 1 + random.Random(seed).randrange(len(tasks) - 1)
    for a, task in enumerate(tasks):
      donors = by_task[tasks[(a + shift) % len(tasks)]]
      for k, i in enumerate(by_task[task]):
        parses[i] = analysis.parses[donors[k % len(donors)]]
  return dataclasses.replace(analysis, parses=list(parses))


class _Transient(Exception):
  def __init__(self, msg: str, retry_after: float | None = None):
    super().__init__(msg)
    self.retry_after = retry_after


def _retry_after_s(value: str | None) -> float | None:
  if not value:
    return None
  try:
    return max(0.0, float(value))
  except ValueError:
    try:
      return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
      return None


class ExternalAnalyzer:
  """Chat-completions client (OpenAI-compatible) on the standard library. Failures never raise: a prompt
  whose requests all fail gets "" (no skill) and is counted in `stats.failures`."""

  def __init__(self, cfg: ml_collections.ConfigDict):
    self.cfg = cfg
    self.url = cfg.base_url.rstrip("/") + "/chat/completions"
    self._api_key = ""
    if cfg.api_key_env:
      self._api_key = os.environ.get(cfg.api_key_env, "")
      if not self._api_key:
        raise ValueError(f"external analyzer: environment variable {cfg.api_key_env!r} (external.api_key_env) "
                         "is not set; set it or use api_key_env='' for a server without keys")
    self.stats = AnalyzerStats()
    self._lock = threading.Lock()

  def __repr__(self) -> str:  # the key never appears in logs
    return f"ExternalAnalyzer(url={self.url!r}, model={self.cfg.model!r})"

  def _count(self, **kw: int) -> None:
    with self._lock:
      for k, v in kw.items():
        setattr(self.stats, k, getattr(self.stats, k) + v)

  def _post(self, messages: list[dict[str, str]]) -> str:
    """One attempt; raises _Transient on errors worth retrying, RuntimeError on the others."""
    body = json.dumps({"model": self.cfg.model, "messages": messages, "temperature": self.cfg.temperature,
                       "max_tokens": self.cfg.max_tokens}).encode()
    headers = {"Content-Type": "application/json"}
    if self._api_key:
      headers["Authorization"] = "Bearer " + self._api_key
    request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
    self._count(requests=1)
    try:
      with urllib.request.urlopen(request, timeout=self.cfg.timeout_s) as response:
        payload = json.loads(response.read())
    except urllib.error.HTTPError as e:
      if e.code in (408, 429) or e.code >= 500:
        raise _Transient(f"HTTP {e.code}", _retry_after_s(e.headers.get("Retry-After"))) from None
      raise RuntimeError(f"HTTP {e.code}: {e.read()[:200]!r}") from None
    except (OSError, http.client.HTTPException) as e:  # URLError, timeouts, resets, truncated bodies
      raise _Transient(f"{type(e).__name__}: {e}") from None
    except ValueError as e:  # body is not JSON (e.g. a proxy error page)
      raise _Transient(f"bad response body: {e}") from None
    try:
      return payload["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
      raise RuntimeError(f"unexpected response shape: {str(payload)[:200]}") from None

  def _complete(self, messages: list[dict[str, str]]) -> str:
    cfg = self.cfg
    for attempt in range(cfg.max_retries + 1):
      try:
        return self._post(messages)
      except _Transient as e:
        if attempt == cfg.max_retries:
          log.warning("analyzer request failed after %d attempts: %s", attempt + 1, e)
          break
        wait = e.retry_after
        if wait is None:
          wait = cfg.backoff_base_s * 2**attempt * random.uniform(1.0, 1.0 + cfg.backoff_jitter)
        self._count(retries=1)
        time.sleep(min(wait, cfg.backoff_max_s))
      except RuntimeError as e:
        log.warning("analyzer request failed: %s", e)
        break
    self._count(failures=1)
    return ""

  def _one(self, prompt: str) -> str:
    messages = [{"role": "user", "content": prompt}]
    reply = self._complete(messages)
    parsed = parse_skill(reply) if reply and self.cfg.json_retry else None
    if parsed is not None and not parsed.ok:
      self._count(json_retries=1)
      retry = self._complete(messages + [{"role": "assistant", "content": reply},
                                         {"role": "user", "content": json_retry_message(parsed.error, reply)}])
      reply = retry or reply
    return reply

  def analyze(self, prompts: list[str]) -> list[str]:
    with concurrent.futures.ThreadPoolExecutor(self.cfg.concurrency) as pool:
      return list(pool.map(self._one, prompts))


def make_analyzer(cfg: ml_collections.ConfigDict, generate: Callable[[list[str]], list[str]] | None = None,
                  oracle: Callable[[], OracleAnalyzer] | None = None) -> Analyzer:
  """`generate` serves the policy backend, `oracle` builds the oracle backend (it needs the trajectories and
  their gold paths)."""
  if cfg.backend == "oracle":
    if oracle is None:
      raise ValueError("analyzer backend 'oracle' needs the trajectories' gold paths")
    return oracle()
  if cfg.backend == "policy":
    if generate is None:
      raise ValueError("analyzer backend 'policy' needs the pipeline's generate function")
    return PolicyAnalyzer(generate)
  if cfg.backend == "external":
    return ExternalAnalyzer(cfg.external)
  raise ValueError(f"analyzer.backend must be 'policy', 'oracle' or 'external', got {cfg.backend!r}")
