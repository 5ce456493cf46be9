"""The matmul FLOP counter on programs small enough to count by hand."""

import jax
import jax.numpy as jnp

from memprobe.flops import matmul_flops

W = jax.ShapeDtypeStruct((64, 32), jnp.float32)
X = jax.ShapeDtypeStruct((8, 64), jnp.float32)
DOT = 2 * 8 * 64 * 32  # one [8,64] @ [64,32]


def layer(w, x):
    return jnp.tanh(x @ w) @ w.T  # two matmuls, back to [8, 64]


def loss(w, x, wrap, n=3):
    for _ in range(n):
        x = wrap(layer)(w, x)
    return x.sum()


def flops_of(fn, *args):
    return matmul_flops(jax.jit(fn).trace(*args).jaxpr)


def test_forward_counts_each_matmul():
    assert flops_of(lambda w, x: loss(w, x, lambda f: f), W, X) == 3 * 2 * DOT


def test_backward_and_recompute_are_counted():
    plain = flops_of(jax.grad(lambda w, x: loss(w, x, lambda f: f)), W, X)
    remat = flops_of(jax.grad(lambda w, x: loss(w, x, jax.checkpoint)), W, X)
    # Forward 6 matmuls; backward: each of the 6 needs d/dw, and all but the very first
    # (whose input x is not differentiated) need d/dx: 6 + 6 + 5 = 17 of them.
    assert plain == 17 * DOT
    # Under checkpoint the backward pass recomputes what it needs of each layer's forward:
    # tanh(x @ w) (the second matmul's output is not needed), so 3 more.
    assert remat == 20 * DOT


def test_scan_body_counts_by_trip_count():
    def scanned(w, x):
        y, _ = jax.lax.scan(lambda c, _: (layer(w, c), None), x, None, length=5)
        return y.sum()

    assert flops_of(scanned, W, X) == 5 * 2 * DOT


def test_cond_counts_its_dearest_branch():
    def branchy(w, x):
        return jax.lax.cond(x.sum() > 0, lambda: layer(w, layer(w, x)), lambda: layer(w, x)).sum()

    assert flops_of(branchy, W, X) == 4 * DOT
