"""The single-process side of the multi-host pieces: shapes agreed over processes (packing.resized, empty
layouts), the canonical mini-batch draw, and row blocks. tests/test_pods.py runs them over 2 processes."""
import numpy as np
import pytest

from seed_jax import packing, shares
from seed_jax.infra import distributed


def test_resized_layout_fills_the_same_rows_in_larger_shapes():
  lengths = [300, 200, 500, 100]
  lay = packing.plan_layout(lengths, length=1024, group_tokens=4096, row_multiple=2)
  L = lay.length
  big = packing.resized(lay, L + 256, len(lay.groups) + 1, lay.rows_per_group + 2, lay.slots_per_group + 2)
  prompts = [list(range(1, n - 9)) for n in lengths]
  responses = [[7] * 10 for _ in lengths]
  small_rows, small_resp, _, small_slot = packing.fill_rows(lay, prompts, responses, 16)
  rows, resp, _, slot = packing.fill_rows(big, prompts, responses, 16)
  W, S = lay.rows_per_group, lay.slots_per_group
  np.testing.assert_array_equal(rows.tokens_WL[:W, :L], small_rows.tokens_WL[:W])
  assert not rows.tokens_WL[:, L:].any() and not rows.tokens_WL[W:W + 2].any()  # the extra room is padding
  # slot s of group 0 stays slot s; the sequences' responses are where their slots say
  np.testing.assert_array_equal(slot, small_slot)
  np.testing.assert_array_equal(resp[:S], small_resp[:S])
  with pytest.raises(ValueError, match="smaller"):
    packing.resized(lay, L - 256, 1, 1, 1)


def test_a_process_without_sequences_packs_an_empty_layout():
  lay = packing.plan_layout([], length=1536, group_tokens=8192, row_multiple=4)
  assert lay.groups == ((),) and lay.rows_per_group == lay.slots_per_group == 4
  rows, resp, rmask, slot = packing.fill_rows(lay, [], [], 16)
  assert rows.tokens_WL.shape == (4, 1536) and not rmask.any() and slot.size == 0


def test_one_process_draws_the_mini_batches_of_a_plain_permutation():
  """Keys in collect_samples order are already canonical: the draw is rng.permutation(N) in slices of `per`."""
  keys = [(g, t, j) for g in range(3) for t in range(2) for j in range(1 + (g + t) % 3)]
  draw = shares.MinibatchDraw(keys)
  got = list(draw.minibatches(np.random.default_rng(5), 4, 2))
  rng = np.random.default_rng(5)
  want = [order[s:s + 4] for order in (rng.permutation(len(keys)) for _ in range(2)) for s in range(0, len(keys), 4)]
  assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))


def test_one_process_owns_every_row_and_gathers_only_itself():
  from seed_jax.infra.mesh import make_mesh
  assert distributed.row_block(make_mesh((2, 4, 1)), 16) == (0, 16)
  assert distributed.allgather_objects({"a": 1}) == [{"a": 1}]
  assert distributed.any_process(False) is False and distributed.any_process(True) is True
  assert shares.my_tasks(5) == [0, 1, 2, 3, 4]
