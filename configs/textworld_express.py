"""TextWorldExpress: the fast JVM environment for tests, demos and CPU-scale experiments.

Variants: "" = CPU-sized (coin, 2 rooms); "paper" = SEED's batch/group sizes and update settings; "experiment" =
the CPU-sized SEED-vs-GRPO experiment (seed_jax/experiment.py), "experiment,accelerator" the same on one chip;
"collect" / "annotate" / "sft" / "warmstart" (+ ",paper") = Stage 1 (configs/stage1.py).
"""
import ml_collections

from configs import base, stage1, variants


def get_config(variant: str = ""):
  """variant: names of VARIANTS (configs/variants.py), e.g. "", "paper", "sft,paper", "experiment,accelerator"."""
  c = base.get_base()
  c.env = env_config()
  c.env.name = "textworld_express"
  c.env.train_split = "train"
  c.eval.split = "eval"
  return variants.build(variant, "textworld_express", c, base.cpu_default, VARIANTS)


def paper(c, _=True) -> None:
  base.paper_default(c)
  c.env.max_steps, c.env.history_length = 30, 5


def experiment(c, paper: bool) -> None:
  """SEED against GRPO at CPU size (python -m seed_jax.experiment --config=configs/textworld_express.py:experiment
  --seeds=0,1): coin collection over 4 rooms, action-only replies, a weak warm start (SFT on 4 shortest-path
  demos, then on those and the honest hindsight analyses of 12 of its own episodes) shared by every arm and
  seed, evaluation on a fixed 32-game panel at the training temperature before training and after the last
  update. `--mode=paired` runs the one-update test on it instead (seed_jax/paired.py).

  The warm start is weak on purpose: from 8 (random-walk) demos the policy already solved most of the panel and
  RL had no room (docs/results/). The demos know where the coin is; the policy does not, so a skill that says
  where it was carries information the prompt lacks.

  No entropy bonus and no KL term in either arm: when every group of an update is homogeneous (all advantages
  0), Adam rescales the bonus's tiny gradient to full-size steps, and a pilot's policy went from no invalid actions to
  mostly invalid ones in one such update (docs/results/)."""
  if paper:
    raise ValueError("variant 'experiment' of configs/textworld_express.py is CPU-sized; it takes no 'paper'")
  c.env.game_params.coin = "numLocations=4,includeDoors=0,numDistractorItems=0"
  c.env.history_length, c.env.history_obs_chars = 2, 200
  c.env.require_think = False
  c.env.max_steps = 8
  # 4 tasks x 4 rollouts: the weak warm start's groups are rarely homogeneous (invalid replies are penalized)
  c.rollout.tasks_per_update, c.rollout.group_size, c.rollout.max_new_tokens = 4, 4, 16
  c.model.max_prompt_tokens = 768
  c.analyzer.max_prompt_tokens, c.analyzer.max_new_tokens = 1536, 128
  c.learner.minibatch_size, c.learner.micro_batch_size = 32, 8  # 8 x 576 positions: three packed rows of 1536
  c.learner.lr = 1e-5  # a few updates of a 135M model: the paper's 1e-6 (3B, 150 updates) would barely move it
  c.objectives.entropy_coef, c.objectives.kl_coef = 0.0, 0.0
  c.warmstart.before_rl = True
  stage1.cpu_warmstart(c)
  c.warmstart.num_tasks, c.warmstart.reasoning = 4, False
  c.warmstart.policy_weight = 2  # 4 shortest-path demos are 12 steps: twice each, or T 1.0 replies stay malformed
  c.warmstart.self_play_rollouts = 12  # failures to analyse: the demos all succeed
  c.train.num_updates = 3
  c.eval.every, c.eval.max_tasks, c.eval.at_start = 0, 32, True
  c.eval.temperature = c.rollout.temperature


def accelerator(c, _: bool) -> None:
  """After "experiment": the same experiment at accelerator size (one GPU/TPU chip, meant for minutes an arm and
  seed): 32 tasks x 8 rollouts per update, 40 updates, bf16 generation, bigger calls and mini-batches. Every 10
  updates (and before the first, after the last) the whole 50-game panel is played greedily and at 0.4, on the
  same keys, so each evaluation's episodes pair across arms and temperatures (McNemar in summary.md).

  Wall time of one arm and seed, from the metrics a run writes (nothing here is measured):
    U x (time/rollout_s + time/analysis_s + time/rescore_s + time/update_s)  +  E x time/eval_s
  with U = train.num_updates = 40 updates and E = U / eval.every + 1 = 5 evaluations (at 0, 10, 20, 30, 40
  updates); time/eval_s covers both temperatures (two panel passes, each one chunk: 50 games <= 32 x 8 envs).
  The experiment is arms x seeds of that (2 x 3 with the default --seeds=0,1,2), plus the shared warm start
  once and a compile per new program shape in the first run (the compile cache serves the others)."""
  c.rollout.tasks_per_update, c.rollout.group_size = 32, 8
  c.train.num_updates = 40
  c.eval.every, c.eval.max_tasks = 10, 0
  c.eval.temperature, c.eval.temperatures = 0.0, (0.0, 0.4)  # the first temperature keeps eval/<split>/*
  c.sampler.dtype, c.sampler.max_batch, c.rescore.max_rows = "bfloat16", 256, 256
  c.learner.minibatch_size, c.learner.micro_batch_size = 256, 32
  c.rescore.pack_tokens = 65536


VARIANTS = {variants.PAPER: paper, **variants.STAGES, "experiment": experiment, "accelerator": accelerator}


def env_config() -> ml_collections.ConfigDict:
  """The environment's own defaults (config.env before the variant's overrides; `name` is set by get_config)."""
  c = ml_collections.ConfigDict()
  c.games = "coin"  # comma-separated game names from GAMES; panels list them in this order
  # Generation parameters per game ("key=value,..." as the simulator takes them; "" = its defaults), one key
  # per name in seed_jax.envs.textworld_express.GAMES. The default coin game is the tiny CPU setting: 2 rooms,
  # no doors, no distractor items.
  c.game_params = ml_collections.ConfigDict({g: "" for g in (
      "coin", "cookingworld", "twc", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder")})
  c.game_params.coin = "numLocations=2,includeDoors=0,numDistractorItems=0"
  c.history_length = 3  # (observation, action) pairs shown in each step prompt
  c.history_obs_chars = 300  # past observations are clipped to this many characters (0 = no limit)
  c.max_steps = 20  # episode step limit (enforced by the rollout loop)
  c.require_think = True  # a response without <think>...</think> is an invalid action
  c.success_reward = 10.0  # reward of the step that solves the game; every other step gets 0
  c.eval_per_game = 50  # seeds per game in the "dev" and "eval" panels
  c.panel_seed = 0  # seed of the fixed dev/eval seed samples
  c.step_timeout_s = 30.0  # pool deadline of one step
  c.reset_timeout_s = 60.0  # pool deadline of one reset / gold-path call
  c.start_timeout_s = 60.0  # extra time for a fresh worker to start its JVM
  return c
