"""WebShop (text), without Java, Lucene or a web server: the original text environment's pages, actions and
scoring over the official data files.

Follows web_agent_site/envs/web_agent_text_env.py (WebAgentTextEnv.step, SimServer.receive, the "text"
observation mode) with the page templates of the SEED/verl-agent copy: a page is the list of its visible text
nodes joined by " [SEP] " (whitespace-only nodes dropped as BeautifulSoup's html.parser does), and its
clickables are its buttons, result links (lower-cased) and option values. The agent sees what the reference's
environment manager shows: the page parts after the instruction, each quoted, and the actions
"search[<your query>]" (on the search page) plus "click[<clickable>]". Search: webshop_search (BM25 as the
original's pyserini index). Purchase score: webshop_reward (goal.py get_reward); success = score 1.0.
Goals: webshop_data; the test panel is the first `num_test_goals` goals (the paper's 500), training the rest.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import re
from typing import Any, Sequence

from seed_jax.envs import base, prompting, webshop_data, webshop_reward, webshop_search

NAME = "webshop"
SPLITS = ("test", "train")
WIN_REWARD = 10.0
PRODUCT_WINDOW = 10
SEP = " [SEP] "
SEARCH_ACTION = "search[<your query>]"
BUY, NEXT, PREV, BACK = "buy now", "next >", "< prev", "back to search"
SUB_PAGES = {"description": "Description", "features": "Features", "reviews": "Reviews"}
_ACTION = re.compile(r"(.+)\[(.+)\]")  # engine.parse_action
_ASCII_SPACE = frozenset(" \n\t\f\r")


def data_dir(cfg: Any) -> str:
  path = cfg.data_dir or os.environ.get("WEBSHOP_DATA_ROOT", "")
  if not path or not os.path.isdir(path):
    raise FileNotFoundError(f"WebShop data folder {path!r} not found (data_dir={cfg.data_dir!r}, "
                            f"$WEBSHOP_DATA_ROOT). {webshop_data.DOWNLOAD_HINT}")
  return path


def _key(cfg: Any) -> tuple[Any, ...]:
  return (data_dir(cfg), cfg.products_file, cfg.attributes_file, cfg.human_goals_file, bool(cfg.human_goals),
          int(cfg.num_products), int(cfg.goal_seed))


@functools.lru_cache(maxsize=2)
def _catalog(*key: Any) -> webshop_data.Catalog:
  return webshop_data.load_catalog(*key)


def _document(p: webshop_data.Product) -> str:
  """The product's index text, as search_engine/convert_product_file_format.py writes it."""
  options = ", and ".join(f"{name}: {', '.join(values)}" for name, values in p.options.items())
  return " ".join([p.title, p.description, p.bullet_points[0] if p.bullet_points else "", options]).lower()


@functools.lru_cache(maxsize=2)
def _search_index(*key: Any) -> webshop_search.BM25Index:
  return webshop_search.BM25Index([_document(p) for p in _catalog(*key).products])


def catalog(cfg: Any) -> webshop_data.Catalog:
  """Products and goals, loaded once per process for a given data configuration."""
  return _catalog(*_key(cfg))


def task_panel(cfg: Any, split: str) -> list[base.Task]:
  if split not in SPLITS:
    raise ValueError(f"webshop split={split!r}; expected one of {SPLITS}")
  goals = catalog(cfg).goals
  n_test = min(int(cfg.num_test_goals), len(goals))
  idxs = range(n_test) if split == "test" else range(n_test, len(goals))
  return [base.Task(f"{split}/{i}", split, NAME, {"goal_idx": i, "asin": goals[i].asin}, goals[i].category)
          for i in idxs]


def _visible(node: str) -> str | None:
  """A text node as the original's text mode shows it: None when BeautifulSoup drops it."""
  if node == "" or (set(node) <= _ASCII_SPACE and "\n" in node):
    return None
  return node.strip()


def format_observation(raw: str, instruction: str) -> str:
  """The reference manager's format_obs: the parts after the instruction, each quoted."""
  parts = raw.split(SEP)
  if instruction not in parts:
    return raw
  return SEP.join(f"'{p}'" for p in parts[parts.index(instruction) + 1:])


@dataclasses.dataclass
class _Session:
  goal: webshop_data.Goal
  page: str = "search"  # search | results | item | sub | done
  keywords: list[str] = dataclasses.field(default_factory=list)
  page_num: int = 1
  asin: str | None = None
  options: dict[str, str] = dataclasses.field(default_factory=dict)
  sub_page: str = ""
  score: float = 0.0
  reward_info: dict[str, Any] = dataclasses.field(default_factory=dict)


class WebShopEnv:

  def __init__(self, cfg: Any):
    self._cat = catalog(cfg)
    self._index = _search_index(*_key(cfg))
    self._nouns = webshop_reward.noun_tagger(cfg.type_tagger)
    self._attr_asins: dict[str, list[str]] = {}
    for p in self._cat.products:
      for a in p.attributes:
        self._attr_asins.setdefault(a, []).append(p.asin)
    self._rng = random.Random(0)
    self._s: _Session | None = None
    self._clickables: dict[str, tuple[str, str]] = {}  # of the page last shown

  def reset(self, task: base.Task) -> base.Observation:
    idx, asin = task.spec.get("goal_idx"), task.spec.get("asin")
    if not isinstance(idx, int) or not 0 <= idx < len(self._cat.goals):
      raise ValueError(f"webshop task {task.task_id!r}: goal_idx={idx!r} outside [0, {len(self._cat.goals)})")
    if asin is not None and self._cat.goals[idx].asin != asin:
      raise ValueError(f"webshop task {task.task_id!r}: goal {idx} is for {self._cat.goals[idx].asin}, the task "
                       f"says {asin}; the worker loaded different data or goal_seed than the task panel")
    self._rng.seed(0)
    self._s = _Session(self._cat.goals[idx])
    return self._observation()

  def step(self, action: str) -> base.StepResult:
    if self._s is None:
      raise RuntimeError("webshop: step() before reset()")
    was_done = self._s.page == "done"
    if not was_done:
      m = _ACTION.match(action)
      name, arg = (m.group(1), m.group(2).lower()) if m else (action, None)
      if name == "search" and arg:
        self._show_results(arg.split(" "), 1)
      elif name == "click" and arg in self._clickables and arg != "search":
        self._click(arg, self._clickables[arg])
    s = self._s
    done = s.page == "done"
    won = done and s.score == 1.0
    info = {"success": won, "score": s.score, "won": won}
    if done:
      info["reward_info"] = s.reward_info
    reward = WIN_REWARD if won and not was_done else 0.0  # the purchase pays once
    return base.StepResult(self._observation(), reward, done, info)

  def gold_actions(self) -> list[str] | None:
    return None  # WebShop exposes no expert trajectory

  def close(self) -> None:
    self._s = None

  # -- SimServer.receive: what a click does
  def _click(self, name: str, kind: tuple[str, str]) -> None:
    s = self._s
    if name == BUY:
      product = self._cat.by_asin[s.asin]
      s.score, s.reward_info = webshop_reward.get_reward(product, s.goal, self._cat.prices[s.asin], s.options,
                                                         self._nouns)
      s.page = "done"
    elif name == BACK:
      self._s = _Session(s.goal)
    elif name == NEXT and s.page == "results":
      self._show_results(s.keywords, s.page_num + 1)
    elif name == PREV and s.page == "results":
      self._show_results(s.keywords, s.page_num - 1)
    elif name == PREV and s.page == "sub":
      s.page = "item"
    elif name == PREV and s.page == "item":
      self._show_results(s.keywords, s.page_num)
    elif name in SUB_PAGES:
      s.page, s.sub_page = "sub", name
    else:  # an item page: a result link chooses the product, an option value sets that option
      if kind[0] == "product":
        s.asin = name.upper()
      elif kind[0] == "option":
        s.options[kind[1]] = name
      s.page = "item"

  def _show_results(self, keywords: list[str], page_num: int) -> None:
    s = self._s
    s.page, s.keywords, s.page_num, s.asin, s.options = "results", keywords, page_num, None, {}

  def _search(self, keywords: list[str]) -> list[str]:
    """engine.get_top_n_product_from_keywords, with its <r>/<a>/<c>/<q> debugging prefixes."""
    products, rest = self._cat.products, " ".join(keywords[1:]).strip()
    if keywords[0] == "<r>":
      return [p.asin for p in self._rng.sample(products, k=min(webshop_search.SEARCH_RETURN_N, len(products)))]
    if keywords[0] == "<a>":
      return list(self._attr_asins.get(rest, []))
    if keywords[0] == "<c>":
      category = keywords[1].strip() if len(keywords) > 1 else ""
      return [p.asin for p in products if p.category == category]
    if keywords[0] == "<q>":
      return [p.asin for p in products if p.query == rest]
    return [products[i].asin for i in self._index.search(" ".join(keywords))]

  # -- the current page: text nodes in document order, clickables (text -> kind), search bar
  def _page(self) -> tuple[list[str], dict[str, tuple[str, str]], bool]:
    s, cat = self._s, self._cat
    head = ["Instruction:", s.goal.instruction_text, "Back to Search"]
    buttons = lambda *names: {n.lower(): ("button", "") for n in names}
    if s.page == "search":
      return ["WebShop", "Instruction:", s.goal.instruction_text, "Search"], buttons("Search"), True
    if s.page == "results":
      asins = self._search(s.keywords)
      shown = asins[(s.page_num - 1) * PRODUCT_WINDOW:s.page_num * PRODUCT_WINDOW]
      nav = (["< Prev"] if s.page_num > 1 else []) + ["Next >"]
      nodes = head + [f"Page {s.page_num} (Total results: {len(asins)})"] + nav
      for a in shown:
        nodes += [a, cat.by_asin[a].title, cat.by_asin[a].price_tag]
      return nodes, {**buttons("Back to Search", *nav), **{a.lower(): ("product", "") for a in shown}}, False
    product = cat.by_asin[s.asin]
    if s.page == "item":
      nodes, clickables = head + ["< Prev"], buttons("Back to Search", "< Prev", *SUB_PAGES.values(), "Buy Now")
      for name, values in product.options.items():
        nodes += [name] + values
        clickables.update({v: ("option", name) for v in values})
      nodes += [product.title, f"Price: {product.price_tag}", "Rating: N.A.", *SUB_PAGES.values(), "Buy Now"]
      return nodes, clickables, False
    if s.page == "sub":
      content = {"description": [product.description], "features": [f" {b}" for b in product.bullet_points],
                 "reviews": []}[s.sub_page]  # the original loads no reviews
      return head + ["< Prev"] + content, buttons("Back to Search", "< Prev"), False
    return self._done_nodes(), {}, False

  def _done_nodes(self) -> list[str]:
    s = self._s
    options = json.dumps(s.options, sort_keys=True)  # Flask's tojson, HTML-safe escapes
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("'", "\\u0027")):
      options = options.replace(ch, esc)
    return ["Thank you for shopping with us!", "Your code:", "None", "(Paste it in your MTurk interface.)",
            "Purchased", "asin", s.asin, "options", options, "attrs", "None", "category", "None", "query", "None",
            "product category", "None", "Target", "asin", "options", "attrs", "price upper", "instuction text",
            "category", "product category", "query", "Goal", "None", "Reward", "Your score (min 0.0, max 1.0)",
            str(s.score), "Reward Details", "None"]

  def _observation(self) -> base.Observation:
    nodes, self._clickables, has_search_bar = self._page()
    raw = SEP.join(t for t in map(_visible, nodes) if t is not None)
    instruction = _visible(self._s.goal.instruction_text) or ""
    actions = ([SEARCH_ACTION] if has_search_bar else []) + [f"click[{c}]" for c in self._clickables]
    return base.Observation(format_observation(raw, instruction), instruction, actions,
                            {"raw": raw, "page": self._s.page})


def make_env(cfg: Any) -> WebShopEnv:
  return WebShopEnv(cfg)


def render_prompt(task_description: str, history: Sequence[tuple[str, str]], obs: base.Observation,
                  cfg: Any) -> str:
  # One action per line: clickables (option values, titles) may hold commas.
  return prompting.render_env_prompt(NAME, task_description, history, obs.text, obs.admissible or (), cfg,
                                     list_format="lines")


# The env reads the parsed text as search[<query>] or click[<clickable>]; anything else changes nothing.
parse_action = prompting.parse_env_action


FAMILY = base.EnvFamily(name=NAME, make_env=make_env, tasks=task_panel, render_prompt=render_prompt,
                        parse_action=parse_action, has_gold_paths=False)
