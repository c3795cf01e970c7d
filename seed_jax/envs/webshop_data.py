"""WebShop data: the product catalog and the goals, read from the official data files.

Follows web_agent_site/engine/engine.py load_products and generate_product_prices, and goal.py
get_human_goals / get_synthetic_goals, in the seeded form of the SEED reference's SimServer: one
random.Random(goal_seed) draws the product prices and then the goals' price bounds (in catalog order), a
second random.Random(goal_seed) shuffles the goal list. Same data + same seed => the same goal list, in the
same order, as the reference's canonical one.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
import re
from collections import defaultdict
from decimal import Decimal, InvalidOperation
from typing import Any

PRICE_RANGE = [10.0 * i for i in range(1, 100)]
NO_PRICE_BOUND = 1000000
DOWNLOAD_HINT = ("Get the official files (items_shuffle_1000.json, items_ins_v2_1000.json, items_human_ins.json, "
                  "or the full items_shuffle.json / items_ins_v2.json) with WebShop's setup.sh "
                  "(github.com/princeton-nlp/WebShop) and point the config field data_dir (or $WEBSHOP_DATA_ROOT) "
                  "at their folder.")


@dataclasses.dataclass
class Product:
  asin: str
  title: str  # the original's 'name' / 'Title'
  category: str
  query: str
  product_category: str
  description: str
  bullet_points: list[str]
  attributes: list[str]
  options: dict[str, list[str]]  # option name -> values, as shown on the item page
  pricing: list[float]  # one price, or a [low, high] range
  price_tag: str  # "$12.99" or "$10.99 to $20.0"
  instructions: list[dict[str, Any]] | None = None  # human goals for this product
  instruction_text: str | None = None  # synthetic goal text
  instruction_attributes: list[str] | None = None


@dataclasses.dataclass
class Goal:
  asin: str
  category: str
  query: str
  name: str
  product_category: str
  instruction_text: str
  attributes: list[str]
  price_upper: float
  goal_options: list[str] | dict[str, str]  # human goals: option values; synthetic: option name -> value
  weight: float = 1.0


@dataclasses.dataclass
class Catalog:
  products: list[Product]
  by_asin: dict[str, Product]
  prices: dict[str, float]  # the price a purchase is charged (a draw inside the range for ranged products)
  goals: list[Goal]


def _parse_pricing(asin: str, pricing: Any) -> tuple[list[float], str]:
  if not pricing:
    return [100.0], "$100.0"
  try:
    values = [float(Decimal(re.sub(r"[^\d.]", "", part))) for part in pricing.split("$")[1:]]
  except (InvalidOperation, AttributeError) as e:
    raise ValueError(f"product {asin}: cannot parse pricing={pricing!r}") from e
  if not values:
    raise ValueError(f"product {asin}: pricing={pricing!r} holds no '$' price")
  if len(values) == 1:
    return values, f"${values[0]}"
  return values[:2], f"${values[0]} to ${values[1]}"


def _product(raw: dict[str, Any], attrs: dict[str, Any], human: dict[str, Any] | None) -> Product:
  asin = raw["asin"]
  pricing, price_tag = _parse_pricing(asin, raw.get("pricing"))
  options = {}
  for name, contents in (raw.get("customization_options") or {}).items():
    if contents is not None:
      options[name.lower()] = [c["value"].strip().replace("/", " | ").lower() for c in contents]
  bullets = raw.get("small_description")
  product = Product(
    asin=asin, title=raw["name"], category=raw["category"], query=raw["query"].lower().strip(),
    product_category=raw["product_category"], description=raw.get("full_description") or "",
    bullet_points=bullets if isinstance(bullets, list) else [] if bullets is None else [bullets],
    attributes=attrs.get(asin, {}).get("attributes", ["DUMMY_ATTR"]), options=options,
    pricing=pricing, price_tag=price_tag)
  if human is not None:
    product.instructions = human.get(asin)
  else:
    product.instruction_text = attrs.get(asin, {}).get("instruction")
    product.instruction_attributes = attrs.get(asin, {}).get("instruction_attributes")
  return product


def _price_bound(price: float, rng: random.Random) -> tuple[float, str]:
  above = [p for p in PRICE_RANGE if p > price][:4]
  if len(above) < 2:
    return NO_PRICE_BOUND, ""
  _, upper = sorted(rng.sample(above, 2))
  return upper, f", and price lower than {upper:.2f} dollars"


def _human_goals(products: list[Product], prices: dict[str, float], rng: random.Random) -> list[Goal]:
  goals = []
  for p in products:
    for ins in p.instructions or []:
      if not ins["instruction_attributes"]:  # the original skips goals without attributes
        continue
      upper, price_text = _price_bound(prices[p.asin], rng)
      goals.append(Goal(p.asin, p.category, p.query, p.title, p.product_category,
                        ins["instruction"].strip(".") + price_text, ins["instruction_attributes"], upper,
                        ins["instruction_options"]))
  return goals


def _synthetic_goals(products: list[Product], prices: dict[str, float], rng: random.Random) -> list[Goal]:
  goals, attr_count = [], defaultdict(int)
  for p in products:
    if p.instruction_text is None:
      continue
    if not p.instruction_attributes:
      raise ValueError(f"product {p.asin}: synthetic goal without instruction_attributes")
    upper, price_text = _price_bound(prices[p.asin], rng)
    names = sorted(p.options)
    for combo in itertools.product(*(p.options[n] for n in names)):
      options = dict(zip(names, combo))
      option_text = ", and ".join(f"{k}: {v}" for k, v in options.items())
      option_text = f" with {option_text}" if option_text else ""
      goals.append(Goal(p.asin, p.category, p.query, p.title, p.product_category,
                        f"{p.instruction_text}{option_text}{price_text}", p.instruction_attributes, upper, options))
      for a in p.instruction_attributes:
        attr_count[a] += 1
  for g in goals:  # rarer attributes weigh more (goal.py get_synthetic_goals)
    g.weight = sum(1.0 / attr_count[a] for a in g.attributes) / len(g.attributes)
  return goals


def _read_json(data_dir: str, name: str) -> Any:
  path = os.path.join(data_dir, name)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"WebShop data file {path} does not exist. {DOWNLOAD_HINT}")
  with open(path) as f:
    return json.load(f)


def load_catalog(data_dir: str, products_file: str, attributes_file: str, human_goals_file: str,
                 human_goals: bool, num_products: int, goal_seed: int) -> Catalog:
  """Products (deduplicated, asin filter as the original), their prices and the shuffled goal list."""
  raw = _read_json(data_dir, products_file)
  attrs = _read_json(data_dir, attributes_file)
  human = _read_json(data_dir, human_goals_file) if human_goals else None
  if num_products > 0:
    raw = raw[:num_products]
  products, by_asin = [], {}
  for r in raw:
    asin = r["asin"]
    if asin == "nan" or len(asin) > 10 or asin in by_asin:
      continue
    by_asin[asin] = _product(r, attrs, human)
    products.append(by_asin[asin])
  rng = random.Random(goal_seed)
  prices = {p.asin: p.pricing[0] if len(p.pricing) == 1 else rng.uniform(*p.pricing[:2]) for p in products}
  goals = (_human_goals if human_goals else _synthetic_goals)(products, prices, rng)
  random.Random(goal_seed).shuffle(goals)
  return Catalog(products, by_asin, prices, goals)
