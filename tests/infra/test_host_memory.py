"""The driver's host memory metrics, and freed pages handed back between updates."""
import jax.numpy as jnp

from seed_jax.infra import host_memory


def test_release_returns_freed_blocks_that_glibc_kept():
  # 250 MB in 64 KB blocks (malloc'd, below the mmap threshold), every page touched; every 16th block stays,
  # so the freed ones sit between live ones and free() alone cannot shrink the heap.
  blocks = [bytearray(b"\1" * (64 * 1024)) for _ in range(4000)]
  keep = blocks[::16]
  held_mb = host_memory.rss_mb()
  del blocks
  freed_mb = held_mb - host_memory.release()["mem/host_rss_mb"]
  assert freed_mb >= 150, (held_mb, freed_mb)  # of the 234 MB freed
  assert len(keep) == 250


def test_live_arrays_are_counted_by_their_bytes():
  before = host_memory.live_arrays_mb()
  x_f32 = jnp.ones((1024, 512), jnp.float32)
  assert host_memory.live_arrays_mb() - before == 2.0
  assert set(host_memory.release()) == {"mem/host_rss_mb", "mem/live_arrays_mb"}
  del x_f32
