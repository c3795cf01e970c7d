"""Step-sample rows, padding and mini-batches: padding rows are masked, never duplicated; shapes are buckets."""
import numpy as np
import pytest

from seed_jax import batch as batch_lib
from seed_jax.envs.base import Step, Task, Trajectory
from seed_jax.skills import SKILL_BLOCK_PREFIX


class _CharTokenizer:
  """One id per character of the text (chat template: a leading 1)."""

  def encode_chat(self, text):
    return [1] + [3 + ord(c) % 90 for c in text]


def _traj(k, n_steps, prompt_len=6):
  steps = [Step(prompt_text=f"Your task: t{k}\nstep {s}", prompt_tokens=list(range(10 + s, 10 + s + prompt_len)),
                response_text="r", response_tokens=[40 + k] * (s + 1), logps=[-0.5 * (s + 1)] * (s + 1),
                observation="o", action="a", action_valid=True) for s in range(n_steps)]
  return Trajectory(task=Task(task_id=f"t{k}", split="train", env="toy", spec={}), group_id=0, traj_id=k,
                    steps=steps)


def test_pad_left_and_pad_right():
  ids, mask = batch_lib.pad_left([[5, 6, 7], [8], []], rows=4, length=5, pad_id=0)
  np.testing.assert_array_equal(ids, [[0, 0, 5, 6, 7], [0, 0, 0, 0, 8], [0] * 5, [0] * 5])
  np.testing.assert_array_equal(mask, [[0, 0, 1, 1, 1], [0, 0, 0, 0, 1], [0] * 5, [0] * 5])
  vals, vmask = batch_lib.pad_right([[0.5, -1.0], [2.0]], rows=3, length=4, fill=9.0, dtype=np.float32)
  np.testing.assert_array_equal(vals, [[0.5, -1.0, 9, 9], [2.0, 9, 9, 9], [9] * 4])
  np.testing.assert_array_equal(vmask, [[1, 1, 0, 0], [1, 0, 0, 0], [0] * 4])
  assert ids.dtype == np.int32 and vals.dtype == np.float32 and mask.dtype == vmask.dtype == bool


def test_collect_samples_skill_prompts_and_opd_mask():
  trajs = [_traj(0, 2), _traj(1, 1), _traj(2, 1)]
  tok = _CharTokenizer()
  long_skill = "x" * 100  # its augmented prompt exceeds max_prompt_tokens: no OPD for that row
  s = batch_lib.collect_samples(trajs, ["Open it.", None, long_skill], tok, max_prompt_tokens=60)
  assert len(s) == 4
  np.testing.assert_array_equal(s.traj_index_N, [0, 0, 1, 2])
  np.testing.assert_array_equal(s.opd_mask_N, [True, True, False, False])
  assert s.prompts == [t.prompt_tokens for tr in trajs for t in tr.steps]
  aug = tok.encode_chat(f"Your task: t0\n{SKILL_BLOCK_PREFIX}Open it.\nstep 1")
  assert s.skill_prompts[1] == aug and len(aug) <= 60
  assert s.skill_prompts[2] == s.prompts[2] and s.skill_prompts[3] == s.prompts[3]
  assert s.responses[1] == [40, 40] and s.sampled_logps[1] == [-1.0, -1.0]
  none = batch_lib.collect_samples(trajs, None, tok, max_prompt_tokens=60)
  assert none.skill_prompts == none.prompts and not none.opd_mask_N.any()


def test_sampler_prompt_buckets_are_powers_of_two_then_quarters_of_an_octave():
  from seed_jax.buckets import prompt_sizes
  assert prompt_sizes(64, 1536) == (64, 128, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536)
  assert prompt_sizes(16, 32) == (16, 32) and prompt_sizes(64, 600) == (64, 128, 256, 320, 384, 448, 512, 600)
  assert prompt_sizes(512, 1024) == (512, 640, 768, 896, 1024)  # lo above fine_from: quarters from lo
  sizes = prompt_sizes(64, 16384)
  assert max(b / a for a, b in zip(sizes, sizes[1:]) if a >= 256) <= 1.25 and sizes[-1] == 16384


def test_shapes_for_buckets():
  s = batch_lib.collect_samples([_traj(0, 3, prompt_len=10)], None, _CharTokenizer(), 10**6)
  assert batch_lib.shapes_for(s) == (64, 64)  # everything below the smallest bucket
  s.prompts[0], s.responses[2] = list(range(65)), list(range(200))
  assert batch_lib.shapes_for(s) == (128, 256)  # powers of two above it
  s.skill_prompts[1] = list(range(300))
  assert batch_lib.shapes_for(s) == (512, 256)  # skill prompts count when the update reads them
  assert batch_lib.shapes_for(s, with_skill=False) == (128, 256)
  assert batch_lib.shapes_for(s, min_bucket=16) == (512, 256)
  s.prompts[0] = list(range(20))
  assert batch_lib.shapes_for(s, min_bucket=16, with_skill=False) == (32, 256)


@pytest.mark.parametrize("with_skill_prompts", [False, True])
def test_minibatch_padding_rows_are_masked(with_skill_prompts):
  trajs = [_traj(0, 2), _traj(1, 1)]
  s = batch_lib.collect_samples(trajs, ["Open it.", None], _CharTokenizer(), 10**6)
  adv_N = np.array([0.5, -1.0, 2.0], np.float32)
  old = [np.full(len(r), -1.0 - i, np.float32) for i, r in enumerate(s.responses)]
  mb = batch_lib.minibatch(s, [2, 0], rows=4, Pn=64, R=8, pad_id=0, adv_N=adv_N, old_logp=old, ref_logp=None,
                           skill_logp=old, with_skill_prompts=with_skill_prompts)
  assert mb.prompt_BP.shape == (4, 64) and mb.resp_BR.shape == mb.old_logp_BR.shape == (4, 8)
  np.testing.assert_array_equal(mb.adv_B, [2.0, 0.5, 0.0, 0.0])
  np.testing.assert_array_equal(mb.opd_mask_B, [False, True, False, False])
  np.testing.assert_array_equal(mb.rmask_BR.sum(1), [1, 1, 0, 0])
  np.testing.assert_array_equal(mb.pvalid_BP.sum(1), [6, 6, 0, 0])
  np.testing.assert_array_equal(mb.old_logp_BR[:, 0], [-3.0, -1.0, 0.0, 0.0])
  assert not mb.pvalid_BP[2:].any() and not mb.rmask_BR[2:].any() and (mb.resp_BR[2:] == 0).all()
  assert mb.ref_logp_BR is None
  if with_skill_prompts:
    n = len(s.skill_prompts[0])
    assert n > 6 and mb.skill_pvalid_BP.sum(1).tolist() == [6, n, 0, 0]
    np.testing.assert_array_equal(mb.skill_prompt_BP[1, 64 - n:], s.skill_prompts[0])
  else:
    assert mb.skill_prompt_BP is None and mb.skill_pvalid_BP is None
  with pytest.raises(ValueError, match="3 samples do not fit a mini-batch of 2 rows"):
    batch_lib.minibatch(s, [0, 1, 2], rows=2, Pn=64, R=8, pad_id=0, adv_N=adv_N, old_logp=old, ref_logp=None,
                        skill_logp=None, with_skill_prompts=False)


def test_minibatch_tokens_count_rows_x_buckets_against_real_lengths():
  s = batch_lib.collect_samples([_traj(0, 2), _traj(1, 1)], ["Open it.", None], _CharTokenizer(), max_prompt_tokens=60)
  # prompts 6, 6, 6; responses 1, 2, 1; the first two rows carry the skill
  t = batch_lib.minibatch_tokens(s, [0, 2, 1], rows=4, Pn=64, R=64, with_skill_prompts=False)
  assert (t.prompt_forwarded, t.prompt_real, t.response_forwarded, t.response_real) == (256, 18, 256, 4)
  assert (t.rows_forwarded, t.rows_real) == (4, 3)
  both = batch_lib.minibatch_tokens(s, [0, 2], rows=4, Pn=64, R=64, with_skill_prompts=True)
  skill_len = len(s.skill_prompts[0]) + len(s.skill_prompts[2])
  assert (both.prompt_forwarded, both.prompt_real) == (2 * 256, 12 + skill_len)
  assert (both.response_forwarded, both.response_real, both.rows_forwarded, both.rows_real) == (512, 2 * 2, 8, 4)
