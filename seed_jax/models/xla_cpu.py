"""Workarounds for XLA:CPU, each a no-op on accelerators: bf16 kept as uint16 bits, products its fused kernels
take, and a weight gradient laid out for its library dot.

XLA:CPU converts bf16 arrays carried through a loop to f32 and back, lacks bf16 x bf16 -> f32 in its batched
dots, and hands dots that contract major dimensions to a slower generic kernel. The functions here route
around each; on a GPU or TPU they are the plain operation.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp


def storage_dtype(dtype) -> Any:
  """The dtype arrays of compute dtype `dtype` are kept in across loops: bf16 on CPU is kept as uint16 bits
  (XLA:CPU would convert bf16 carried through a scan to f32 and back; the bits pass untouched and are bitcast
  to bf16 where used). Accelerators handle bf16 natively."""
  if jnp.dtype(dtype) == jnp.bfloat16 and jax.default_backend() == "cpu":
    return jnp.uint16
  return dtype


def to_storage(x, dtype):
  return jax.lax.bitcast_convert_type(x.astype(dtype), jnp.uint16) if storage_dtype(dtype) == jnp.uint16 else x.astype(dtype)


def from_storage(x, dtype):
  return jax.lax.bitcast_convert_type(x, jnp.bfloat16) if x.dtype == jnp.uint16 else x.astype(dtype)


def widen(x):
  """fp32 values of a stored array. uint16 bf16 bits become the high half of fp32 bits by integer ops: a
  bf16 bitcast there would make XLA:CPU copy the whole cache on every decode step instead of updating it
  in place."""
  if x.dtype == jnp.uint16:
    return jax.lax.bitcast_convert_type(x.astype(jnp.uint32) << 16, jnp.float32)
  return x.astype(jnp.float32)


def batched_dot(eq, a, b, dtype):
  """einsum of operands in `dtype` with fp32 results. XLA:CPU runs batched dots outside its fused kernels,
  where bf16 x bf16 -> f32 is unimplemented: there the product is rounded to bf16 (accumulated in f32 inside
  the kernel) and widened right after."""
  if jnp.dtype(dtype) == jnp.bfloat16 and jax.default_backend() == "cpu":
    return jnp.einsum(eq, a.astype(dtype), b.astype(dtype)).astype(jnp.float32)
  return jnp.einsum(eq, a.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def projection(eq, a, b):
  """An activation x weight einsum (fp32 results) whose weight gradient runs in XLA:CPU's fused dot kernel."""
  return jnp.einsum(eq, a, b, preferred_element_type=jnp.float32)


def _projection_fwd(eq, a, b):
  return projection(eq, a, b), (a, b)


def _projection_bwd(eq, res, g):
  """d(activation) as autodiff writes it; d(weight) contracts the activation's batch/length dims, which XLA:CPU
  would hand to its slower generic dot (contracting the major dims); a transposed copy of the activation, kept
  by an optimization barrier, makes them minor, and the dot runs in the fused library kernel."""
  a, b = res
  lhs, so = eq.split("->")
  sa, sb = lhs.split(",")
  da = jnp.einsum(f"{so},{sb}->{sa}", g.astype(b.dtype), b, preferred_element_type=jnp.float32)
  batch = "".join(c for c in sa if c in so and c not in sb)
  rest = "".join(c for c in sa if c not in batch)
  a_t = jax.lax.optimization_barrier(jnp.einsum(f"{sa}->{rest + batch}", a))
  db = jnp.einsum(f"{rest + batch},{so}->{sb}", a_t, g.astype(a.dtype), preferred_element_type=jnp.float32)
  return da.astype(a.dtype), db.astype(b.dtype)


projection.defvjp(_projection_fwd, _projection_bwd)
