"""The ",vl" variants of the visual games (Sokoban, EZPoints): the policy is a vision-language model that sees
the env's RGB frame in each step prompt (env.observation "image"), as in the paper.

"vl": CPU-sized, with "embedded-vl", a tiny random Qwen2.5-VL written once to the user cache (it runs the
pipeline end to end; it does not play). "paper,vl": SEED's visual settings for Qwen2.5-VL-3B-Instruct
(SEED_ALGORITHM.md §2 and §5): --config.model.path=/path/to/Qwen2.5-VL-3B-Instruct is required.
"""


def apply(c, paper: bool) -> None:
  """The "vl" overlay (configs/variants.py)."""
  c.env.observation, c.env.render_image = "image", True
  if paper:
    c.model.path = ""  # required: --config.model.path=/path/to/Qwen2.5-VL-3B-Instruct (or its SFT checkpoint)
    c.model.max_prompt_tokens = 1024  # step prompts (the frame's vision tokens included)
    c.model.frame_pixels = (256 * 256, 2048 * 2048)  # the reference's frame bounds before the processor
    c.analyzer.max_new_tokens = 2048  # the analysis reply
    c.sft.lr = 2e-6  # Stage 1 SFT of the vision model (text models: 5e-6)
    c.sft.max_len = 4096  # the reference's VL Stage-1 values: 4k-token SFT records, collection at temperature 1.0
    c.collect.temperature = 1.0
    if c.env.name == "sokoban":
      c.annotate.max_prompt_tokens = 24576  # its Sokoban analysis context
  else:
    c.model.path = "embedded-vl"
    c.analyzer.max_new_tokens = 48  # a random model's reply never parses: keep the analysis pass short
