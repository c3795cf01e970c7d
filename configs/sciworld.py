"""ScienceWorld. Variants: "" = the embedded default sized for a CPU in minutes; "paper" = SEED's settings;
"collect" / "annotate" / "sft" / "warmstart" (+ ",paper") = Stage 1 (configs/stage1.py).

python -m seed_jax.main --config=configs/sciworld.py[:paper] [--config.model.path=...]
"""
import ml_collections

from configs import base, stage1, variants

VARIANTS = {variants.PAPER: lambda c, _: base.paper_default(c), **variants.STAGES}


def get_config(variant: str = ""):
  """variant: names of VARIANTS (configs/variants.py), e.g. "", "paper", "sft,paper"."""
  c = base.get_base()
  c.env = env_config()
  c.env.name = "sciworld"
  c.env.train_split = "train"
  c.eval.split = "eval_l0,eval_l2"
  return variants.build(variant, "sciworld", c, cpu, VARIANTS)


def cpu(c) -> None:
  base.cpu_default(c)
  c.env.task_types = "boil,find-living-thing,measure-melting-point-known-substance"
  # The embedded default's first phase: SmolLM2-135M answers in prose and cuts its JSON short unless it is
  # fine-tuned on the action format and the analysis reply first (cached after the first run).
  c.warmstart.before_rl = True
  stage1.cpu_warmstart(c)
  c.analyzer.max_new_tokens = 160  # the analysis JSON closes well within this


def env_config() -> ml_collections.ConfigDict:
  """The environment's own defaults (config.env before the variant's overrides; `name` is set by get_config)."""
  c = ml_collections.ConfigDict()
  c.simplification = "easy"  # "" or comma-separated names from SIMPLIFICATIONS ("easy" = all of them)
  c.task_types = ""  # comma-separated seen task types to use ("" = every type not held out)
  # L2 hold-out: one task type from each topic, the harder sibling of a seen type (unknown substance, tertiary
  # colours, unknown plant, ...), so the skills it needs are trained but the task itself never is. Held out of
  # train/dev/eval_l0; the eval_l2 types.
  c.unseen_task_types = ",".join((
      "chemistry-mix-paint-tertiary-color", "find-animal", "freeze", "grow-fruit", "identify-life-stages-2",
      "inclined-plane-friction-unnamed-surfaces", "lifespan-longest-lived-then-shortest-lived",
      "measure-melting-point-unknown-substance", "mendelian-genetics-unknown-plant",
      "test-conductivity-of-unknown-substances"))
  c.history_length = 5  # (observation, action) pairs shown in each step prompt
  c.history_obs_chars = 300  # past observations are clipped to this many characters (0 = no limit)
  c.max_steps = 30  # episode step limit (enforced by the rollout loop)
  c.require_think = True  # a response without <think>...</think> is an invalid action
  c.success_reward = 10.0  # reward of the step that completes the task with score 100; otherwise 0
  c.dev_per_type = 3  # variations per seen type in the "dev" panel
  c.eval_l0_per_type = 5  # variations per seen type in the "eval_l0" panel
  c.eval_l2_per_type = 10  # variations per held-out type in the "eval_l2" panel
  c.panel_seed = 0  # seed of the fixed dev/eval variation samples
  c.gold_path = False  # generate the gold path at every reset (seconds per load); off = on demand
  c.step_timeout_s = 60.0  # pool deadline of one step
  c.reset_timeout_s = 180.0  # pool deadline of one reset / gold-path call (a gold path is a search)
  c.start_timeout_s = 120.0  # extra time for a fresh worker to start its JVM
  # Options for each simulator JVM. The serial collector about halves a JVM's memory at no step-time
  # cost (docs/benchmarks.md); many JVMs share few cores, so parallel GC threads only contend. The heap is
  # fixed and touched at start: unbounded, a JVM grows for hours toward a quarter of the host's memory, and a
  # bounded heap still fills up over the first updates; the live set is 15-30 MB, but gold-path searches need
  # more than 128 MB (boil 27, paint mixing), so each JVM holds ~330 MB from its start on.
  c.jvm_options = "-XX:+UseSerialGC -Xms256m -Xmx256m -XX:+AlwaysPreTouch -XX:ReservedCodeCacheSize=48m"
  return c
