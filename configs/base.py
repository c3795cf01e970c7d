"""Shared defaults of every run; environment configs start from `get_base()` and override. The shared sizings
(`cpu_default`, `paper_default`) and the text-played visual games' base (`text_game`) live here too.

Plain data: this file imports no seed_jax module, so loading a config never pulls in the training stack.
Every default lives here (or in the environment config); the package reads them from the config it is given.
"""
import ml_collections


def checkpoint(save_interval_steps: int) -> ml_collections.ConfigDict:
  """Checkpoint settings (seed_jax.infra.checkpoint.Checkpointer); one fresh copy per user."""
  c = ml_collections.ConfigDict()
  c.max_to_keep = 3  # newest checkpoints kept; older steps are deleted after each successful save
  c.save_interval_steps = save_interval_steps  # save() only writes steps divisible by this (force=True overrides)
  c.async_save = True  # write in a background thread; training continues while arrays go to disk
  return c


def get_base() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  # "rl" (SEED / GRPO) | "generate" (answer `generate.prompt` with the model and exit) | Stage 1: "collect"
  # (base-policy trajectories), "annotate" (hindsight skills -> SFT records), "sft" (train + export an HF folder)
  # | "warmstart" (policy demos + analyzer records -> SFT) | "eval" (score weights or a checkpoint on the panels)
  c.stage = "rl"

  c.model = ml_collections.ConfigDict()
  c.model.path = "embedded"  # HF checkpoint folder, .gguf file, or "embedded" (SmolLM2-135M-Instruct)
  c.model.tokenizer = ""  # "" = from model.path
  # Cache-less attention (prefill, re-score, update): "auto" | "blocked" | "xla_blockwise" | "splash" | "cudnn"
  # (models/spec.py; splash needs a TPU, cudnn an NVIDIA GPU)
  c.model.attention = "auto"
  c.model.attention_block = 512  # query/key tile of "xla_blockwise" and "splash"
  c.model.attention_interpret = False  # "splash" off a TPU: run the kernel in Pallas' interpreter (slow; tests)
  c.model.max_prompt_tokens = 1024  # step prompts are fitted to this by dropping the oldest history pairs
  # A VL policy's frames are first scaled into (min, max) pixels, as verl's process_image does before the
  # processor (the reference: (256 * 256, 2048 * 2048), so a 96x96 frame is 81 vision tokens, not 9); 0 = no bound.
  c.model.frame_pixels = (0, 0)

  c.env = ml_collections.ConfigDict()  # filled by the environment config (configs/<env>.py)

  c.rollout = ml_collections.ConfigDict()
  c.rollout.tasks_per_update = 16  # B: distinct task instances per update
  c.rollout.group_size = 8  # G: envs per task, all reset to the same instance
  c.rollout.temperature = 1.0
  c.rollout.top_p = 1.0
  c.rollout.top_k = 0
  c.rollout.max_new_tokens = 512
  c.rollout.stop_strings = ("</action>",)  # generation of a row also ends at these (after EOS)

  a = c.analyzer = ml_collections.ConfigDict()
  # "policy": the current weights decode greedily (self-analysis); "oracle": privileged gold-path skills (the upper
  # bound: they name actions the trajectory never shows); "external": an OpenAI-compatible server
  a.backend = "policy"
  a.control = "none"  # "shuffled": each trajectory gets another task's skill of the same backend (a null signal)
  a.teacher_metrics = True  # every update with skills, where the env has gold paths: teacher/* (teacher_quality.py)
  a.max_prompt_tokens = 16384  # analysis prompts are fitted to this many tokens by dropping the oldest steps
  a.max_new_tokens = 4096  # longest analysis reply (policy backend; the external one uses external.max_tokens)
  # > 0: no analysis reply writes the same n tokens twice (the greedy decode's loops; sample.SamplingParams)
  a.no_repeat_ngram = 0
  a.max_skill_chars = 2000  # a longer skill is cut to this many characters (it enters every step prompt); 0 = no cap
  a.success_threshold = 1.0  # episode return >= this counts as success for the analyzer's instruction
  # A reply cut off inside its "episode_skill" string keeps the text up to the cut (analysis/salvaged_rate);
  # False = such a reply has no skill, as in the reference code.
  a.salvage_truncated = False
  e = a.external = ml_collections.ConfigDict()
  e.base_url = "http://127.0.0.1:8000/v1"  # POST {base_url}/chat/completions
  e.model = ""  # model name sent in the request body
  e.api_key_env = "OPENAI_API_KEY"  # name of the environment variable holding the key; "" = send no key
  e.temperature = 0.0  # annotation is deterministic
  e.max_tokens = 4096  # reply length limit sent to the server
  e.timeout_s = 300.0  # per-request socket timeout
  e.max_retries = 5  # retries after the first attempt on 408/429/5xx, timeouts and connection errors
  e.backoff_base_s = 1.0  # wait before retry k is backoff_base_s * 2**k (times jitter), unless Retry-After says
  e.backoff_max_s = 60.0  # cap on any single wait, Retry-After included
  e.backoff_jitter = 0.25  # waits are multiplied by uniform(1, 1 + jitter) so parallel clients spread out
  e.concurrency = 8  # requests in flight at once
  e.json_retry = True  # one follow-up turn asking for the JSON object only when the reply does not parse
  a.enabled = True  # False = plain GRPO baseline (no analysis, no OPD), same code path
  a.start_update = 0  # OPD active from this update ...
  a.stop_update = -1  # ... until this one (exclusive); -1 = to the end

  # Prompt templates (docs/templates.md): one text file each, with str.format placeholders such as
  # {current_observation}; "" = the packaged default in seed_jax/templates/. A bad file, an unknown placeholder or
  # a missing required one is a config error at start-up.
  t = c.templates = ml_collections.ConfigDict()
  t.step_first = ""  # a step prompt showing no past step; "" = seed_jax/templates/<env.name>/step_first.txt
  t.step_later = ""  # a step prompt with the history window; "" = seed_jax/templates/<env.name>/step_later.txt
  t.step_history = ""  # one past (observation, action) pair of {action_history}; pairs are joined by line breaks
  t.analysis_success = ""  # the analysis prompt's header (instruction, schema, task, outcome) after a success
  t.analysis_failure = ""  # ... after a failure
  t.analysis_step = ""  # one step block of the analysis prompt (the oldest are dropped to fit)
  t.analysis_omitted = ""  # the note standing in for the dropped step blocks
  t.analysis_footer = ""  # the analysis prompt's end (the answer format); its parts are set off by blank lines
  t.skill_block = ""  # the skill in H(h, s)
  # Where H(h, s) puts the skill block: "after_task" (after the task line, else before the turn line, else at the
  # end), "before_turn" (before the turn line, else at the end), "placeholder" (at {skill} in both step templates).
  t.skill_placement = "after_task"
  # How {admissible_actions} joins the env's actions: "comma", "lines", "quoted_lines" ('a' newline-space 'b', as
  # verl-agent's ALFWorld prompt), "quoted_commas" ('a', newline 'b',  as its WebShop prompt); "" = the env's own.
  t.action_list = ""
  # {action_history} pairs each action with the observation it answered ("before") or with its "result" (the one
  # that followed it, as verl-agent's Search prompt shows its searches and what they returned)
  t.history_pairs = "before"
  t.analysis_first_step = 1  # the analysis prompt numbers an episode's steps from here (verl-agent-style: 0)
  t.analysis_separator = "\n\n"  # between the analysis prompt's header, blocks and footer; "" = the files own them
  t.empty_task = ""  # the analysis header's {task_description} when an episode has no task text
  t.strip_teacher = False  # H(h, s) with its leading and trailing whitespace stripped (the reference strips it)
  t.json_retry = ""  # the external analyzer's follow-up turn when a reply does not parse (external.json_retry)

  o = c.objectives = ml_collections.ConfigDict()  # seed_jax.advantages (host) and seed_jax.losses (device)
  # --- advantages (host) ---
  o.adv_estimator = "grpo"  # "grpo" | "gigpo" (GRPO episode advantage + gigpo_weight · anchor-state step advantage)
  o.norm_mode = "mean_std_norm"  # "mean_std_norm": (s − μ)/(σ + 1e-6); "mean_norm": s − μ (WebShop)
  o.grpo_stats = "step"  # "step": μ, unbiased σ over all step-samples of a group (reference code);
  #                        "trajectory": μ, population σ over the group's trajectory returns (paper)
  o.invalid_penalty = 0.1  # c_inv subtracted from the score of a step whose action did not parse (Search: 0.01)
  o.gigpo_gamma = 0.95  # γ of GiGPO's discounted step returns
  o.gigpo_weight = 1.0  # ω in A = A^E + ω·A^S
  o.gigpo_similarity = 1.0  # anchor-state match: 1.0 = identical text; < 1 = difflib ratio ≥ this value
  # --- loss (device) ---
  o.agg_mode = "token-mean"  # "token-mean" | "seq-mean-token-mean" | "seq-mean-token-sum"
  o.clip_low = 0.2  # ε_low: ratio clipped below at 1 − ε_low
  o.clip_high = 0.2  # ε_high: ratio clipped above at 1 + ε_high (asymmetric "clip-higher" when > clip_low)
  o.clip_c = 3.0  # dual-clip c: for A < 0 the loss is capped at −c·A
  o.entropy_coef = 0.001  # c_H in pg − c_H·H (Search: 0)
  o.kl_coef = 0.01  # c_KL for the KL to the reference (Search: 0.001; 0 disables, ref log-probs not needed)
  o.kl_estimator = "low_var_kl"  # "k1" | "k2" | "low_var_kl" (k3)
  o.opd_variant = "gated"  # "gated" | "positive_gap" | "reverse_kl_adv" | "teacher_adv" | "none"
  o.opd_coef = 0.01  # λ_opd, weight of the OPD loss term ("gated", "positive_gap")
  o.opd_beta = 5.0  # β of the gate g = σ(β·Δ)
  o.opd_adv_coef = 1.0  # λ / w of the advantage-shaping variants ("reverse_kl_adv", "teacher_adv")

  u = c.learner = ml_collections.ConfigDict()  # the update step (optimizer, mini-batching, teacher)
  u.lr = 1e-6  # AdamW learning rate (peak, for schedules)
  u.b1 = 0.9
  u.b2 = 0.999
  u.eps = 1e-8
  u.weight_decay = 0.01
  u.max_grad_norm = 1.0  # global-norm clip
  # "constant" | "warmup_cosine" (over total_steps optimizer steps) | "warmup_constant" (linear warm-up over the
  # first warmup_frac x train.num_updates RL updates, then lr: the reference's scheduler, stepped per update)
  u.schedule = "constant"
  u.warmup_frac = 0.0  # share of the schedule spent warming up (warmup_cosine, warmup_constant)
  u.total_steps = 0  # optimizer steps of the schedule (warmup_cosine); 0 = set by the pipeline
  u.minibatch_size = 256  # step-samples per optimizer step (padded rows are masked, never duplicated)
  u.micro_batch_size = 8  # step-samples per forward/backward; gradients accumulate over micro-batches
  u.ppo_epochs = 1
  u.teacher = "old"  # "old": skill log-probs from π_old at rescore time (reference code); "current": from π_θ
  u.remat = True  # rematerialize each layer in the backward pass (memory for compute)
  # What a rematerialized layer keeps for the backward: "attention" (its input and the blockwise attention's
  # output) or "projections" (also the weight products' outputs: the backward recomputes no matmul, for
  # [rows, tokens, (heads + 2 kv heads) x head_dim + 2 ffn + dim] more activations per layer)
  u.remat_saves = "attention"
  u.dtype = "float32"  # compute dtype of the training forward
  # > 0: step-samples packed several to a row of this many tokens (seed_jax/packing.py) instead of one padded
  # row each; a micro-batch then holds at most micro_batch_size x (padded prompt + response) positions, the
  # padded one's memory. Serves teacher "old"; "current" keeps the padded layout. 0: padded rows.
  u.pack_length = 1536
  # Packed rows store a head that step-samples share (chat header, instructions, task, common history) once, as
  # a prefix tree (seed_jax/packing.py): the same log-probs and gradient, fewer positions. Text only.
  u.share_prefix = True

  c.sampler = ml_collections.ConfigDict()
  c.sampler.dtype = "float32"  # "bfloat16": bf16 weights and KV cache in generation (fp32 logits/softmax)
  # rows per generation call; more run as several calls (samples do not depend on the split). 0 = auto: the
  # largest power of two that the planner (seed_jax/plan.py) fits in device memory next to everything else.
  c.sampler.max_batch = 64
  # > 0: longer prompts are prefilled in chunks of this many tokens, each written into the KV cache (attention
  # over the cache tiled by model.attention_block where model.attention is blockwise), so the prefill holds one
  # chunk's activations (the analysis prompts of :paper); 0: the whole prompt in one pass.
  c.sampler.prefill_chunk = 0
  # Rows that refill (seed_jax/slots.py): an episode's next turn enters a decode slot as soon as its env has
  # stepped, instead of each turn waiting for its longest reply; the same trajectories. One process only.
  c.sampler.refill = True
  # > 0: a prompt reuses the keys and values of a head (chat header, instructions, task, steps so far) that an
  # earlier prompt of the same call or rollout prefilled, and prefills only its tail (seed_jax/prefix.py); the
  # prefilled prompts kept for that hold at most this many MB of cache. 0: every prompt prefilled whole.
  c.sampler.prefix_reuse_mb = 1024

  c.rescore = ml_collections.ConfigDict()
  c.rescore.max_rows = 64  # contexts x samples per padded forward pass (pack_length 0); 0 = auto, as max_batch
  c.rescore.vocab_chunk = 128  # response positions per vocabulary-projection chunk
  c.rescore.dtype = "float32"
  # > 0: every (context, sample) sequence packed into rows of this many tokens (seed_jax/packing.py), at most
  # pack_tokens positions per forward pass; 0: one padded row per sequence, max_rows per pass.
  c.rescore.pack_length = 1536
  c.rescore.pack_tokens = 16384
  c.rescore.share_prefix = True  # as learner.share_prefix, for the re-score's packed rows
  # Where π_old's log-probs come from. "auto": the sampler's own when they are the same numbers (fp32 sampling and
  # scoring), else as "update"; "update": the update's own forward, stop-gradient, when the update is one
  # optimizer step (ppo_epochs 1, every step-sample in one mini-batch: π_θ is π_old there; the teacher metrics,
  # which read them before the update, get them re-scored on the rows with a skill), else re-scored; "rescore":
  # always re-score the ordinary context (one more forward).
  c.rescore.old_logps = "auto"

  # Device mesh. Either name a preset (--config.mesh.preset=v5p_64, a file in configs/mesh/) or set
  # --config.mesh.shape / --config.mesh.dcn_shape by hand; a preset's fields win over hand-set ones.
  m = c.mesh = ml_collections.ConfigDict()
  m.preset = ""  # name of configs/mesh/<preset>.py; its fields replace the ones below ("" = use them as set)
  m.shape = (1, -1, 1)  # (data, fsdp, tensor) inside one slice; one entry may be -1 (= the remaining devices)
  m.dcn_shape = (1, 1, 1)  # slices along (data, fsdp, tensor) over the data-center network; product = slices
  m.ref_params_memory = "device"  # "device" | "pinned_host": where the frozen KL-reference weights are kept
  d = c.distributed = ml_collections.ConfigDict()  # multi-process start-up (TPU pods detect themselves)
  d.mode = "auto"  # "auto": join a cluster when one is configured or detected; "on": always; "off": never
  d.coordinator_address = ""  # "host:port" of process 0 (CPU/GPU clusters); "" = let JAX detect it (TPU)
  d.num_processes = 0  # with coordinator_address: the total number of processes
  d.process_id = -1  # with coordinator_address: this process's index in [0, num_processes)
  d.initialization_timeout_s = 300  # how long to wait for every process to join
  # A process silent this long counts as dead: JAX's coordination service then ends every other process (its
  # log names the dead task); the same command on every host resumes from the last checkpoint.
  d.heartbeat_timeout_s = 100

  c.train = ml_collections.ConfigDict()
  c.train.num_updates = 150
  c.train.dump_trajectories = 4  # trajectories dumped as JSONL per update
  c.train.checkpoint = checkpoint(save_interval_steps=1)

  c.eval = ml_collections.ConfigDict()
  c.eval.temperature = 0.4
  # Temperatures each evaluation plays the panel at (0.0 = greedy), on the same draws' keys; () = eval.temperature
  # alone. The first must equal eval.temperature and keeps the eval/<split>/* keys; the others write
  # eval/<split>_t<T>/*. Every evaluation's episodes are dumped (dumps/eval_episodes_step<updates>.jsonl).
  c.eval.temperatures = ()
  c.eval.split = "eval"
  c.eval.max_tasks = 0  # 0 = the whole panel
  # > 0: the reference's protocol instead of the fixed panel: this many tasks drawn with replacement per split,
  # seeded by config.seed (duplicates are played as separate episodes); excludes eval.max_tasks.
  c.eval.draws = 0
  # Stage "eval" (seed_jax/evaluate.py): a run's workdir or checkpoints folder to score ("" = model.path's own
  # weights) and its step (-1 = the latest).
  c.eval.checkpoint = ""
  c.eval.checkpoint_step = -1
  c.eval.every = 10  # updates between evaluations (0 = never during training)
  c.eval.at_end = True
  c.eval.batch_envs = 0  # minimum pool size for evaluation (the pool has at least B*G envs)
  c.eval.at_start = False  # also evaluate the starting weights (recorded as 0 updates done)

  w = c.warmstart = ml_collections.ConfigDict()  # stage "warmstart"; and RL's first phase with before_rl
  w.before_rl = False  # stage "rl": warm-start the policy first (cached, see cache_dir), then RL from it
  w.num_tasks = 16  # demo tasks, spread evenly over the env's train panel
  w.max_steps = 0  # gold steps per demo; 0 = env.max_steps (what an RL episode sees)
  w.envs = 4  # envs playing gold paths in parallel
  w.reasoning = True  # demo replies carry one short <think> line before the action (False: the action only)
  w.policy_weight = 1  # times each demo step record enters the SFT mix
  w.analyzer_weight = 1  # times each analyzer record (an analysis of the demo's RL-length view) enters it
  # Times each demo step record also enters with the demo's honest hindsight skill in its prompt, H(h, s) as the
  # re-score renders it: a policy that never saw a skill block may not read one (0 = off)
  w.skill_prompt_weight = 0
  # Who writes the analyzer records: "hindsight" (honest: only what the trajectory shows, as the policy must when it
  # analyses its own episodes) | "oracle" (privileged: failure rules name gold actions the trajectory never shows)
  w.analyzer_source = "hindsight"
  # > 0: the demo-SFT policy plays this many train tasks (one episode each, at the rollout sampling), annotated by
  # analyzer_source, and a second SFT pass on the policy records + these analyzer records gives the warm policy
  # (failures as well as successes, as its own rollouts produce them); 0 = off
  w.self_play_rollouts = 0
  w.cache_dir = ""  # before_rl: finished warm starts are kept here by config hash; "" = ~/.cache/seed_jax/warmstart

  f = c.faults = ml_collections.ConfigDict()  # fault drills (seed_jax/infra/faults.py; one process only)
  f.plan = ""  # "kind@update,...", kinds env_kill, nan_grad, sigterm, ckpt_write, kill9; "" = none

  j = c.compile_cache = ml_collections.ConfigDict()  # JAX's persistent compilation cache
  j.enabled = True
  j.dir = ""  # "" = $JAX_COMPILATION_CACHE_DIR, else ~/.cache/seed_jax/jax_compilation_cache
  j.min_compile_time_s = -1.0  # programs that compile faster are not written; < 0: JAX's env variable, else 1 s

  g = c.log = ml_collections.ConfigDict()
  g.jsonl_name = "metrics.jsonl"  # per-step scalars, one JSON object per line, in the workdir
  g.tensorboard = True  # write TensorBoard event files under <workdir>/<tb_subdir>
  g.tb_subdir = "tb"
  g.dump_subdir = "dumps"  # dump_jsonl writes <workdir>/<dump_subdir>/<name>_step<step:06d>.jsonl
  g.wandb = False  # also log to Weights & Biases when the `wandb` package is importable
  g.wandb_project = "seed_jax"
  g.wandb_entity = ""  # "" = the account's default entity
  g.wandb_run_name = ""  # "" = let W&B choose
  g.wandb_mode = "online"  # "online" | "offline" | "disabled"
  g.progress = True  # terminal progress bars per phase (only when stdout is a terminal)

  k = c.collect = ml_collections.ConfigDict()  # stage "collect"
  k.num_tasks = 180  # N training tasks: the first N of the seeded permutation of the env's train panel
  k.rollouts = 8  # K rollouts of each task (a group, all from the same reset state)
  k.temperature = 0.4
  k.top_p = 1.0
  k.max_new_tokens = 512  # per step
  k.tasks_per_batch = 16  # tasks played at once; the env pool has tasks_per_batch * rollouts envs
  k.output = ""  # trajectory JSONL; "" = <workdir>/trajectories.jsonl

  n = c.annotate = ml_collections.ConfigDict()  # stage "annotate" ("external" uses analyzer.external)
  n.analyzer = "oracle"  # "oracle" (gold paths) | "local" (a seed_jax model, greedy) | "external" (config.analyzer.external)
  n.input = ""  # trajectory JSONL; "" = <workdir>/trajectories.jsonl
  n.output = ""  # kept SFT records; "" = <workdir>/sft_records.jsonl
  n.log = ""  # every analysis (also the dropped ones), the resume state; "" = <workdir>/annotations.jsonl
  n.max_prompt_tokens = 7168  # analysis prompts (chat template included) are fitted to this by dropping old steps
  n.chunk = 64  # trajectories per analyzer call; each finished chunk is appended to the log
  n.gold_envs = 8  # "oracle": envs resetting tasks in parallel to read their gold paths
  n.local_model_path = ""  # "local": HF folder, .gguf file or "embedded"; its tokenizer comes from the same path
  n.local_max_new_tokens = 1024  # "local": longest reply
  n.local_max_batch = 16  # "local": rows per generation call
  n.local_dtype = "float32"  # "local": sampler compute dtype ("float32" | "bfloat16")

  f = c.sft = ml_collections.ConfigDict()  # stage "sft"
  f.data = ""  # SFT records JSONL (prompt, response); "" = <workdir>/sft_records.jsonl
  f.export_dir = ""  # HF folder written at the end (weights + tokenizer); "" = <workdir>/export
  f.epochs = 3
  f.batch_size = 8  # records per optimizer step (global batch)
  # AdamW (read by update.make_optimizer): warmup to lr over warmup_frac of the steps, then cosine to 0.
  f.lr = 5e-6
  f.b1 = 0.9
  f.b2 = 0.95
  f.eps = 1e-8
  f.weight_decay = 0.01
  f.max_grad_norm = 1.0
  f.schedule = "warmup_cosine"  # "warmup_cosine" | "constant"
  f.warmup_frac = 0.1
  f.total_steps = 0  # 0 = epochs * steps per epoch (set from the data)
  f.max_len = 8192  # tokens of one record (prompt + response + EOS); longer records are dropped and counted
  f.min_len_bucket = 64  # packed row lengths are powers of two from this up to max_len
  f.micro_rows = 1  # packed rows per forward/backward; gradients accumulate over the step's rows
  f.val_frac = 0.1  # share of records held out for the validation loss (0 = none)
  f.val_every = 0  # optimizer steps between validation passes; 0 = at the end of every epoch
  f.vocab_chunk = 128  # loss positions per vocabulary-projection chunk
  f.remat = True  # rematerialize each layer in the backward pass
  f.dtype = "float32"  # compute dtype of the forward ("float32" | "bfloat16")
  f.checkpoint = checkpoint(save_interval_steps=50)

  c.generate = ml_collections.ConfigDict()
  c.generate.prompt = "What is the capital of France?"
  c.generate.max_new_tokens = 64
  c.generate.temperature = 0.0
  return c


def cpu_default(c) -> None:
  """Small enough to finish on a laptop CPU in minutes with SmolLM2-135M: few tasks, short answers."""
  c.rollout.tasks_per_update, c.rollout.group_size = 2, 2
  c.rollout.max_new_tokens = 48
  c.env.max_steps, c.env.history_length = 4, 2
  c.model.max_prompt_tokens = 1024
  c.analyzer.max_prompt_tokens, c.analyzer.max_new_tokens = 1536, 96
  c.analyzer.salvage_truncated = True  # a small model's reply cut at max_new_tokens still yields its skill
  c.learner.minibatch_size, c.learner.micro_batch_size = 16, 4
  # learner.remat stays on: without it an update over packed rows of 1536 tokens keeps every layer's attention
  # and runs several times slower on a CPU
  c.train.num_updates = 2
  c.eval.every, c.eval.max_tasks = 0, 4
  c.sampler.max_batch = 16


def paper_default(c) -> None:
  """SEED's model-side settings (docs/algorithm.md §2-3): a 3B checkpoint, 4k step prompts, 16k/4k analysis,
  mini-batches of 256 step-samples, bf16 compute, replies sampled to EOS, no JSON-retry turn. B, G, the env's
  steps/history and the exceptions (mini-batch, prompt limit, retry turn) are the env config's."""
  c.model.path = ""  # required: --config.model.path=/path/to/Qwen2.5-3B-Instruct (SFT checkpoint)
  c.model.max_prompt_tokens = 4096
  c.analyzer.max_prompt_tokens, c.analyzer.max_new_tokens = 16384, 4096
  c.analyzer.external.json_retry = False  # the reference retries for WebShop, Sokoban and EZPoints only (their configs turn it on)
  c.rollout.stop_strings = ()  # the reference samples every reply to EOS
  c.analyzer.max_skill_chars = 0  # the reference inserts the parsed skill whole (its length is bounded by the reply's)
  c.learner.minibatch_size = 256
  c.sampler.dtype = c.rescore.dtype = c.learner.dtype = "bfloat16"
  c.sampler.prefill_chunk = 2048  # 16k-token analysis prompts: one chunk's activations, not the prompt's


def text_game(name: str, env: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A visual game of the paper played from text (Sokoban, EZPoints), before its sizing: the env's RGB rendering
  off, train/test panels."""
  c = get_base()
  c.env = env
  c.env.name = name
  c.env.train_split = "train"
  c.eval.split = "test"
  c.env.observation, c.env.render_image = "text", False
  return c


def text_game_cpu(c) -> None:
  """`cpu_default` with no history, as in the paper."""
  cpu_default(c)
  c.env.history_length = 0


def text_game_paper(c, *, tasks_per_update: int, max_steps: int) -> None:
  """`paper_default` with the game's B (G = 8) and step limit, no history."""
  paper_default(c)
  c.rollout.tasks_per_update, c.rollout.group_size = tasks_per_update, 8
  c.env.max_steps, c.env.history_length = max_steps, 0
