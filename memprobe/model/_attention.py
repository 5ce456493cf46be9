"""Blockwise (flash-style) causal attention in plain JAX, with an explicit backward pass.

No [seq, seq] score matrix ever exists: the forward keeps a running max and sum per query
block and saves only the output and the log-sum-exp; the backward recomputes each score
block. Sliding-window layers visit only the key blocks that can fall inside the window, so
their cost grows with seq x window, not seq^2. Runs on every backend (no Pallas).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

_NEG_INF = -1e30


def _span(window: int | None, block: int, num_blocks: int) -> tuple[int, int]:
    """(key blocks looked back, key blocks visited per query block); window None is causal-global."""
    if window is None:
        return 0, num_blocks
    back = math.ceil(window / block)
    return back, back + 1


def _mask(q_pos, k_pos, window):
    keep = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] >= 0)
    if window is not None:
        keep &= k_pos[None, :] > q_pos[:, None] - window
    return keep


def _key_range(i, j, window, block, back_blocks):
    """Start index and true positions of the j-th key block seen by query block i.

    Sliding layers look back ``back_blocks`` blocks; before the sequence start the slice is
    clamped to block 0 and its positions (negative) are all masked.
    """
    first = i - back_blocks if window is not None else 0
    block_index = first + j
    positions = block_index * block + jnp.arange(block)
    return jnp.maximum(block_index, 0) * block, positions


# Blocks are cut with dynamic slices and written back with dynamic updates; no array's
# sequence axis is reshaped into (blocks, block): libtpu's code generator aborts on some
# such splits fused into the score matmuls ("split of a padded window dim").


def _grouped(x, kh):
    """[B, T, N, H] -> [B, T, K, G, H]: query heads under their K/V head."""
    b, t, n, h = x.shape
    return x.reshape(b, t, kh, n // kh, h)


def _slice(x, start, block):
    return jax.lax.dynamic_slice_in_dim(x, start, block, axis=1)


def _score_block(q_blk, q_pos, k, v, i, j, window, block, back):
    """Key/value block j of query block i, its raw scores [B, K, G, bq, bk] and mask."""
    start, k_pos = _key_range(i, j, window, block, back)
    k_blk, v_blk = _slice(k, start, block), _slice(v, start, block)
    s = jnp.einsum("bqkgh,bskh->bkgqs", q_blk, k_blk, preferred_element_type=jnp.float32)
    # The mask depends only on block positions, not on the layer's data. Without the barrier
    # XLA computes it ahead for every (query, key) block pair at once, broadcast over batch
    # and heads, when the layers sit in one-trip scans: 36 GiB per device for full-size E4B
    # scan-checkpoint (memprobe explain). Tying it to the scores keeps it per block.
    s, keep = jax.lax.optimization_barrier((s, _mask(q_pos, k_pos, window)))
    return start, k_blk, v_blk, s, keep


def _forward(q, k, v, window, block, scale):
    b, t, n, h = q.shape
    kh = k.shape[2]
    g = n // kh
    back, span = _span(window, block, t // block)
    qg = _grouped(q, kh)

    def one_query_block(i, carry):
        out, lse = carry
        q_start = i * block
        q_blk = _slice(qg, q_start, block)  # [B, bq, K, G, H]
        q_pos = q_start + jnp.arange(block)

        def step(state, j):
            m, l, acc = state
            _, _, v_blk, s, keep = _score_block(q_blk, q_pos, k, v, i, j, window, block, back)
            s = jnp.where(keep, s * scale, _NEG_INF)
            m_new = jnp.maximum(m, s.max(-1))
            p = jnp.where(keep, jnp.exp(s - m_new[..., None]), 0.0)
            corr = jnp.exp(m - m_new)
            l = l * corr + p.sum(-1)
            pv = jnp.einsum("bkgqs,bskh->bqkgh", p.astype(v_blk.dtype), v_blk,
                            preferred_element_type=jnp.float32)
            acc = acc * jnp.moveaxis(corr, -1, 1)[..., None] + pv
            return (m_new, l, acc), None

        init = (
            jnp.full((b, kh, g, block), _NEG_INF, jnp.float32),
            jnp.zeros((b, kh, g, block), jnp.float32),
            jnp.zeros((b, block, kh, g, h), jnp.float32),
        )
        (m, l, acc), _ = jax.lax.scan(step, init, jnp.arange(span))
        o_blk = (acc / jnp.moveaxis(l, -1, 1)[..., None]).astype(q.dtype)
        out = jax.lax.dynamic_update_slice_in_dim(out, o_blk, q_start, axis=1)
        lse = jax.lax.dynamic_update_slice_in_dim(lse, m + jnp.log(l), q_start, axis=3)
        return out, lse

    init = (jnp.zeros_like(qg), jnp.zeros((b, kh, g, t), jnp.float32))
    out, lse = jax.lax.fori_loop(0, t // block, one_query_block, init)
    return out.reshape(b, t, n, h), lse


def _backward(q, k, v, out, lse, d_out, window, block, scale):
    b, t, n, h = q.shape
    kh = k.shape[2]
    back, span = _span(window, block, t // block)
    qg, dog = _grouped(q, kh), _grouped(d_out, kh)
    # delta = rowsum(dO * O): [B, K, G, T]
    delta = jnp.einsum("btkgh,btkgh->bkgt", dog.astype(jnp.float32),
                       _grouped(out, kh).astype(jnp.float32))

    def one_query_block(i, carry):
        dq_all, dk_acc, dv_acc = carry
        q_start = i * block
        q_blk, do_blk = _slice(qg, q_start, block), _slice(dog, q_start, block)
        lse_blk = jax.lax.dynamic_slice_in_dim(lse, q_start, block, axis=3)
        delta_blk = jax.lax.dynamic_slice_in_dim(delta, q_start, block, axis=3)
        q_pos = q_start + jnp.arange(block)

        def step(inner, j):
            dq, dk_acc, dv_acc = inner
            start, k_blk, v_blk, s, keep = _score_block(q_blk, q_pos, k, v, i, j, window, block, back)
            p = jnp.where(keep, jnp.exp(s * scale - lse_blk[..., None]), 0.0)
            dv = jnp.einsum("bkgqs,bqkgh->bskh", p.astype(do_blk.dtype), do_blk,
                            preferred_element_type=jnp.float32)
            dp = jnp.einsum("bqkgh,bskh->bkgqs", do_blk, v_blk, preferred_element_type=jnp.float32)
            ds = (p * (dp - delta_blk[..., None]) * scale).astype(q_blk.dtype)
            dq = dq + jnp.einsum("bkgqs,bskh->bqkgh", ds, k_blk, preferred_element_type=jnp.float32)
            dk = jnp.einsum("bkgqs,bqkgh->bskh", ds, q_blk, preferred_element_type=jnp.float32)
            dk_acc = jax.lax.dynamic_update_slice_in_dim(dk_acc, _slice(dk_acc, start, block) + dk, start, 1)
            dv_acc = jax.lax.dynamic_update_slice_in_dim(dv_acc, _slice(dv_acc, start, block) + dv, start, 1)
            return (dq, dk_acc, dv_acc), None

        dq0 = jnp.zeros(q_blk.shape, jnp.float32)
        (dq, dk_acc, dv_acc), _ = jax.lax.scan(step, (dq0, dk_acc, dv_acc), jnp.arange(span))
        dq_all = jax.lax.dynamic_update_slice_in_dim(dq_all, dq.astype(q.dtype), q_start, axis=1)
        return dq_all, dk_acc, dv_acc

    init = (jnp.zeros_like(qg), jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32))
    dq, dk, dv = jax.lax.fori_loop(0, t // block, one_query_block, init)
    return dq.reshape(b, t, n, h), dk.astype(k.dtype), dv.astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def _flash(q, k, v, window, block, scale):
    return _forward(q, k, v, window, block, scale)[0]


def _flash_fwd(q, k, v, window, block, scale):
    out, lse = _forward(q, k, v, window, block, scale)
    return out, (q, k, v, out, lse)


def _flash_bwd(window, block, scale, residuals, d_out):
    q, k, v, out, lse = residuals
    return _backward(q, k, v, out, lse, d_out, window, block, scale)


_flash.defvjp(_flash_fwd, _flash_bwd)


def blockwise_attention(q, k, v, *, window: int | None, block: int, scale: float = 1.0):
    """Causal attention over [B, T, N, H] queries and [B, T, K, H] keys/values (N a multiple of K).

    ``window`` None attends to every earlier position; an int keeps keys with
    ``q_pos - window < k_pos <= q_pos`` and skips the key blocks outside that range.
    """
    t = q.shape[1]
    if t % block:
        raise ValueError(f"sequence length {t} is not a multiple of the attention block {block}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"{q.shape[2]} query heads do not group over {k.shape[2]} K/V heads")
    return _flash(q, k, v, window, block, scale)


def reference_attention(q, k, v, *, window: int | None, scale: float = 1.0):
    """Dense [T, T] attention, for tests on tiny shapes only."""
    t = q.shape[1]
    g = q.shape[2] // k.shape[2]
    k = jnp.repeat(k, g, axis=2)
    v = jnp.repeat(v, g, axis=2)
    s = jnp.einsum("bqnh,bsnh->bnqs", q, k, preferred_element_type=jnp.float32) * scale
    pos = jnp.arange(t)
    s = jnp.where(_mask(pos, pos, window), s, _NEG_INF)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bnqs,bsnh->bqnh", p.astype(v.dtype), v).astype(q.dtype)
