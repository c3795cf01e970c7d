"""A decode step's weight products alone, at 1 to 16 rows: what XLA:CPU's dot kernels make of the weight reads
that bound a decode step. SmolLM2-135M's shapes (30 layers of the fused q/k/v, o, fused gate/up and down
products, then the tied vocabulary projection; random fp32 weights) chained in one jitted program, over
per-layer weights as the decode loop holds them (`transformer.decode_params`), over stacked weights in a
`lax.scan` (each step slices its layer) and over per-layer weights stored transposed ([out, in]: the products
contract the weights' minor dimension, as the tied vocabulary projection does). Against two read rates measured
in the same process: a plain sum over the same weights, and `common.stream_bandwidth_gbs` (a matrix-vector
product, the decode floor's bandwidth).

Prints one JSON line: per row count the step's ms and the GB/s at which it read the weights.
Usage: python -m benchmarks.decode_products
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from benchmarks import common

D, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS, VOCAB = 576, 9, 3, 64, 1536, 30, 49152  # SmolLM2-135M
SHAPES = {"wqkv": (D, (HEADS + 2 * KV_HEADS) * HEAD_DIM), "wo": (HEADS * HEAD_DIM, D), "w_gate_up": (D, 2 * FFN),
          "w_down": (FFN, D)}


def _layer(x_BD, w, transposed: bool = False):
  mm = (lambda x, name: x @ w[name].T) if transposed else (lambda x, name: x @ w[name])
  qkv_BE = mm(x_BD, "wqkv")
  x_BD = x_BD + mm(qkv_BE[:, :HEADS * HEAD_DIM], "wo")  # stands in for attention's output: the same product
  gate_BF, up_BF = jnp.split(mm(x_BD, "w_gate_up"), 2, axis=-1)
  return x_BD + mm(jax.nn.silu(gate_BF) * up_BF, "w_down")


def _step(x_BD, layers, embed_VD, stacked: bool, transposed: bool):
  if stacked:
    x_BD, _ = jax.lax.scan(lambda x, w: (_layer(x, w), None), x_BD, layers)
  else:
    for w in layers:
      x_BD = _layer(x_BD, w, transposed)
  return x_BD @ embed_VD.T


def main() -> None:
  key = jax.random.key(0)
  stacked = {n: 0.02 * jax.random.normal(jax.random.fold_in(key, i), (LAYERS, *s), jnp.float32)
             for i, (n, s) in enumerate(SHAPES.items())}
  per_layer = [{n: jnp.array(w[i]) for n, w in stacked.items()} for i in range(LAYERS)]
  per_layer_t = [{n: jnp.array(w.T) for n, w in layer.items()} for layer in per_layer]
  embed_VD = 0.02 * jax.random.normal(jax.random.fold_in(key, 99), (VOCAB, D), jnp.float32)
  weight_bytes = (sum(w.size for w in stacked.values()) + embed_VD.size) * 4
  total = jax.jit(lambda ws, e: sum(jnp.sum(w) for w in ws.values()) + jnp.sum(e))
  total(stacked, embed_VD).block_until_ready()
  sum_gbs = weight_bytes / common.median(common.timed(lambda: total(stacked, embed_VD).block_until_ready(), 7)) / 1e9
  out = {"bench": "decode_products", "weights_mb": round(weight_bytes / 2 ** 20), "sum_read_gbs": round(sum_gbs, 1),
         "matvec_read_gbs": round(common.stream_bandwidth_gbs(), 1)}
  for layout, layers in (("per_layer", per_layer), ("scan", stacked), ("per_layer_transposed", per_layer_t)):
    step = jax.jit(lambda x, ls, e, s=layout == "scan", t=layout.endswith("transposed"): _step(x, ls, e, s, t))
    for rows in (1, 2, 4, 8, 16):
      x_BD = jnp.full((rows, D), 0.1, jnp.float32)
      step(x_BD, layers, embed_VD).block_until_ready()
      s = common.median(common.timed(lambda: step(x_BD, layers, embed_VD).block_until_ready(), 9))
      out[f"{layout}_rows{rows}"] = {"ms": round(s * 1e3, 1), "read_gbs": round(weight_bytes / s / 1e9, 1)}
  out["load_avg"] = common.load_avg()
  common.emit(out)


if __name__ == "__main__":
  main()
