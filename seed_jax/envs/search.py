"""Search-QA: answer an open-domain question in up to `max_steps` turns with a retriever at hand.

Each turn the agent either searches (`<search>query</search>`: the top-k passages come back as
`<information>...</information>` in the next observation) or answers (`<answer>text</answer>`: the episode
ends). Reward = success_reward x exact match of the normalized answer against any gold answer (the
SQuAD / Search-R1 normalization); info["score"] = EM. Retrieval goes over HTTP to any Search-R1 compatible
server (see retriever.py, which also holds the built-in BM25 one); an unreachable server fails the health
check when the first env is made, not mid-run.

Questions come from local JSONL/parquet files (fields question, golden_answers, data_source; Search-R1's
parquet layout with reward_model.ground_truth.target is accepted too) or from prepared TFDS datasets named
`tfds:NAME[/CONFIG]:SPLIT` (e.g. `tfds:natural_questions_open:validation`), read by search_data. Task.family
is the data source (NQ, TriviaQA, ...), so evaluation reports accuracy per source.
"""
from __future__ import annotations

import re
import string
from typing import Any, Sequence

import ml_collections
import numpy as np

from seed_jax.envs import base, prompting, search_data
from seed_jax.envs.retriever import Passage, RetrieverClient

NAME = "search"


# ------------------------------------------------------------------------------------------ answers and EM


_PUNCT = frozenset(string.punctuation)


def normalize_answer(s: str) -> str:
  """SQuAD's normalize_answer, as used by Search-R1's em_check: lower-case, drop punctuation, drop the
  articles a/an/the, collapse whitespace."""
  s = s.lower()
  s = "".join(ch for ch in s if ch not in _PUNCT)
  s = re.sub(r"\b(a|an|the)\b", " ", s)
  return " ".join(s.split())


def exact_match(prediction: str, golden_answers: Sequence[str]) -> float:
  pred = normalize_answer(prediction)
  return float(any(pred == normalize_answer(g) for g in golden_answers))


def format_passages(passages: Sequence[Passage]) -> str:
  """Search-R1's `_passages2string` layout: one 'Doc i(Title: t) text' line per passage."""
  return "".join(f"Doc {i}(Title: {p.title}) {p.text}\n" for i, p in enumerate(passages, 1))


# ------------------------------------------------------------------------------------------ actions

# Search-QA answers with one of these tags instead of <action>; the action sent is the whole block.
TAGS = ("search", "answer")
_BLOCK_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.IGNORECASE | re.DOTALL)
_OPEN_RE = re.compile(r"<(search|answer)>", re.IGNORECASE)


def _first_block(text: str) -> tuple[str, str] | None:
  """(kind, stripped content) of the earliest complete <search>/<answer> block of an action the env got."""
  m = _BLOCK_RE.search(text)
  return (m.group(1).lower(), m.group(2).strip()) if m else None


def parse_action(response: str, cfg: ml_collections.ConfigDict) -> base.ParsedAction:
  """The shared parse over the <search>/<answer> tags, sending `<search>q</search>` or `<answer>a</answer>`.
  Also invalid ("multiple_actions") when the response opens more than one such tag, as in verl-agent's
  search_projection; the earliest block is still sent."""
  parsed = prompting.parse_action(response, cfg.require_think, TAGS)
  if parsed.valid and len(_OPEN_RE.findall(response)) > 1:
    return base.ParsedAction(parsed.action, False, "multiple_actions")
  return parsed


# ------------------------------------------------------------------------------------------ env

INVALID_TEXT = ("Invalid action: no <search> query </search> or <answer> answer </answer> was found, "
                "so nothing happened.")


class SearchEnv:
  """One Search-QA episode at a time; the retriever client is owned by the env."""

  def __init__(self, client: RetrieverClient, cfg: ml_collections.ConfigDict):
    self.client, self.cfg = client, cfg
    self._task: base.Task | None = None
    self._turn, self._done = 0, True

  def reset(self, task: base.Task) -> base.Observation:
    if not task.spec.get("question") or not task.spec.get("golden_answers"):
      raise ValueError(f"search task {task.task_id!r}: spec needs 'question' and 'golden_answers', got {task.spec}")
    self._task, self._turn, self._done = task, 0, False
    q = task.spec["question"]
    return base.Observation(text=q, task_description=q, info={"turn": 0})

  def step(self, action: str) -> base.StepResult:
    if self._task is None or self._done:
      raise ValueError("SearchEnv.step called before reset or after the episode ended")
    self._turn += 1
    question = self._task.spec["question"]
    info: dict[str, Any] = {"success": False, "score": 0.0, "turn": self._turn, "truncated": False,
                            "data_source": self._task.spec.get("data_source", "")}
    block = _first_block(action)
    reward, done = 0.0, False
    if block is not None and block[0] == "answer":
      em = exact_match(block[1], self._task.spec["golden_answers"])
      reward, done, text = self.cfg.success_reward * em, True, f"Your answer: {block[1]}"
      info.update(success=em == 1.0, score=em, answer=block[1])
    elif block is not None and block[1]:
      passages = self.client.retrieve([block[1]], self.cfg.topk)[0]
      text = f"<information>{format_passages(passages) or 'No results.'}</information>"
      info["query"] = block[1]
    else:
      text, info["invalid_action"] = INVALID_TEXT, True
    if not done and self._turn >= self.cfg.max_steps:
      done, info["truncated"] = True, True
    self._done = done
    return base.StepResult(base.Observation(text, question, info={"turn": self._turn}), reward, done, info)

  def gold_actions(self) -> list[str] | None:
    """Answering at once with the first gold answer is a gold path."""
    return None if self._task is None else [f"<answer>{self._task.spec['golden_answers'][0]}</answer>"]

  def close(self) -> None:
    self.client.close()


# ------------------------------------------------------------------------------------------ task panels

# Reporting names of the Search-R1 evaluation sources (Task.family); unknown sources keep their own name.
SOURCE_NAMES = {"nq": "NQ", "natural_questions_open": "NQ", "triviaqa": "TriviaQA", "trivia_qa": "TriviaQA",
                "popqa": "PopQA", "hotpotqa": "HotpotQA", "2wikimultihopqa": "2Wiki", "2wiki": "2Wiki",
                "musique": "MuSiQue", "bamboogle": "Bamboogle"}


def _sources(spec: str | Sequence[str]) -> list[str]:
  items = spec.split(",") if isinstance(spec, str) else list(spec)
  return [s.strip() for s in items if s.strip()]


def task_panel(cfg: ml_collections.ConfigDict, split: str) -> list[base.Task]:
  files = {"train": cfg.train_files, "test": cfg.test_files}.get(split)
  if files is None:
    raise ValueError(f"search split must be 'train' or 'test', got {split!r}")
  if not _sources(files):
    raise ValueError(f"search split {split!r} has no question sources: set {split}_files to .jsonl/.parquet "
                     f"paths or tfds:NAME:SPLIT entries")
  by_source: dict[str, list[search_data.Question]] = {}
  for src in _sources(files):
    for q in search_data.load_questions(src, cfg.tfds_data_dir):
      by_source.setdefault(q.data_source, []).append(q)
  tasks, seen = [], set()
  for source, qs in by_source.items():  # sources in order of first appearance, file order inside
    keep = range(len(qs))
    if 0 < cfg.max_tasks_per_source < len(qs):
      keep = sorted(np.random.default_rng(cfg.panel_seed).choice(len(qs), cfg.max_tasks_per_source, replace=False))
    for i in keep:
      q = qs[i]
      task_id = f"{source}:{q.qid or i}"
      if task_id in seen:
        raise ValueError(f"duplicate question id {task_id!r} in split {split!r}")
      seen.add(task_id)
      spec = {"question": q.question, "golden_answers": list(q.golden_answers), "data_source": source}
      tasks.append(base.Task(task_id, split, NAME, spec, SOURCE_NAMES.get(source.lower(), source)))
  return tasks


# ------------------------------------------------------------------------------------------ family

_CHECKED_URLS: set[str] = set()  # one health check per retriever per process


def make_client(cfg: ml_collections.ConfigDict) -> RetrieverClient:
  client = RetrieverClient(cfg.retriever_url, cfg.timeout_s, cfg.retries, cfg.backoff_s)
  if cfg.health_check and cfg.retriever_url not in _CHECKED_URLS:
    client.check()  # raises RetrieverUnavailableError naming the URL
    _CHECKED_URLS.add(cfg.retriever_url)
  return client


def render_prompt(task_description: str, history: Sequence[tuple[str, str]], obs: base.Observation,
                  cfg: ml_collections.ConfigDict) -> str:
  # The bare question: the default templates say "answer the question:", a reference-style one need not.
  return prompting.render_env_prompt(NAME, task_description, history, obs.text, (), cfg,
                                     tags=TAGS)


def make_env(cfg: ml_collections.ConfigDict) -> SearchEnv:
  return SearchEnv(make_client(cfg), cfg)


FAMILY = base.EnvFamily(name=NAME, make_env=make_env, tasks=task_panel, render_prompt=render_prompt,
                        parse_action=parse_action)
