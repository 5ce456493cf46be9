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


def attention_block_size(seq_len: int, preferred: int = 512) -> int:
    """The query/key block length used for ``seq_len``: ``preferred`` or the whole sequence."""
    return min(preferred, seq_len)


def _span(window: int | None, block: int, num_blocks: int) -> tuple[int, int]:
    """(front padding, key blocks visited per query block) for a window, None meaning causal-global."""
    if window is None:
        return 0, num_blocks
    pad_blocks = math.ceil(window / block)
    return pad_blocks * block, pad_blocks + 1


def _mask(q_pos, k_pos, window):
    keep = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] >= 0)
    if window is not None:
        keep &= k_pos[None, :] > q_pos[:, None] - window
    return keep


def _prepare(q, k, v, window, block):
    b, t, n, h = q.shape
    kh = k.shape[2]
    nq = t // block
    pad, span = _span(window, block, nq)
    if pad:
        widths = ((0, 0), (pad, 0), (0, 0), (0, 0))
        k = jnp.pad(k, widths)
        v = jnp.pad(v, widths)
    # [nq, B, bq, K, G, H]: query blocks grouped under their K/V head.
    qb = q.reshape(b, nq, block, kh, n // kh, h).transpose(1, 0, 2, 3, 4, 5)
    return qb, k, v, pad, span


def _key_range(i, j, window, block, pad):
    """Padded start index and true positions of the j-th key block seen by query block i."""
    first = i if window is not None else 0
    start = (first + j) * block
    return start, start - pad + jnp.arange(block)


def _forward(q, k, v, window, block, scale):
    b, t, n, h = q.shape
    qb, kp, vp, pad, span = _prepare(q, k, v, window, block)
    kh = k.shape[2]
    g = n // kh

    def one_query_block(args):
        i, q_blk = args
        q_pos = i * block + jnp.arange(block)

        def step(carry, j):
            m, l, acc = carry
            start, k_pos = _key_range(i, j, window, block, pad)
            k_blk = jax.lax.dynamic_slice_in_dim(kp, start, block, axis=1)
            v_blk = jax.lax.dynamic_slice_in_dim(vp, start, block, axis=1)
            s = jnp.einsum("bqkgh,bskh->bkgqs", q_blk, k_blk, preferred_element_type=jnp.float32)
            keep = _mask(q_pos, k_pos, window)
            s = jnp.where(keep, s * scale, _NEG_INF)
            m_new = jnp.maximum(m, s.max(-1))
            p = jnp.where(keep, jnp.exp(s - m_new[..., None]), 0.0)
            corr = jnp.exp(m - m_new)
            l = l * corr + p.sum(-1)
            pv = jnp.einsum("bkgqs,bskh->bkgqh", p.astype(v_blk.dtype), v_blk,
                            preferred_element_type=jnp.float32)
            acc = acc * corr[..., None] + pv
            return (m_new, l, acc), None

        init = (
            jnp.full((b, kh, g, block), _NEG_INF, jnp.float32),
            jnp.zeros((b, kh, g, block), jnp.float32),
            jnp.zeros((b, kh, g, block, h), jnp.float32),
        )
        (m, l, acc), _ = jax.lax.scan(step, init, jnp.arange(span))
        out = (acc / l[..., None]).astype(q.dtype)  # [B, K, G, bq, H]
        return out, m + jnp.log(l)

    nq = t // block
    out, lse = jax.lax.map(one_query_block, (jnp.arange(nq), qb))
    # out: [nq, B, K, G, bq, H] -> [B, T, N, H]; lse: [nq, B, K, G, bq]
    out = out.transpose(1, 0, 4, 2, 3, 5).reshape(b, t, n, h)
    return out, lse


def _backward(q, k, v, out, lse, d_out, window, block, scale):
    b, t, n, h = q.shape
    kh = k.shape[2]
    g = n // kh
    nq = t // block
    qb, kp, vp, pad, span = _prepare(q, k, v, window, block)
    dob = d_out.reshape(b, nq, block, kh, g, h).transpose(1, 0, 2, 3, 4, 5)
    ob = out.reshape(b, nq, block, kh, g, h).transpose(1, 0, 2, 3, 4, 5)
    # delta = rowsum(dO * O), [nq, B, K, G, bq]
    delta = jnp.einsum("nbqkgh,nbqkgh->nbkgq", dob.astype(jnp.float32), ob.astype(jnp.float32))

    def one_query_block(carry, args):
        dk_acc, dv_acc = carry
        i, q_blk, do_blk, lse_blk, delta_blk = args
        q_pos = i * block + jnp.arange(block)

        def step(inner, j):
            dq, dk_acc, dv_acc = inner
            start, k_pos = _key_range(i, j, window, block, pad)
            k_blk = jax.lax.dynamic_slice_in_dim(kp, start, block, axis=1)
            v_blk = jax.lax.dynamic_slice_in_dim(vp, start, block, axis=1)
            s = jnp.einsum("bqkgh,bskh->bkgqs", q_blk, k_blk, preferred_element_type=jnp.float32)
            keep = _mask(q_pos, k_pos, window)
            p = jnp.where(keep, jnp.exp(s * scale - lse_blk[..., None]), 0.0)
            dv = jnp.einsum("bkgqs,bqkgh->bskh", p.astype(do_blk.dtype), do_blk,
                            preferred_element_type=jnp.float32)
            dp = jnp.einsum("bqkgh,bskh->bkgqs", do_blk, v_blk, preferred_element_type=jnp.float32)
            ds = (p * (dp - delta_blk[..., None]) * scale).astype(q_blk.dtype)
            dq = dq + jnp.einsum("bkgqs,bskh->bqkgh", ds, k_blk, preferred_element_type=jnp.float32)
            dk = jnp.einsum("bkgqs,bqkgh->bskh", ds, q_blk, preferred_element_type=jnp.float32)
            dk_acc = jax.lax.dynamic_update_slice_in_dim(
                dk_acc, jax.lax.dynamic_slice_in_dim(dk_acc, start, block, 1) + dk, start, 1)
            dv_acc = jax.lax.dynamic_update_slice_in_dim(
                dv_acc, jax.lax.dynamic_slice_in_dim(dv_acc, start, block, 1) + dv, start, 1)
            return (dq, dk_acc, dv_acc), None

        dq0 = jnp.zeros((b, block, kh, g, h), jnp.float32)
        (dq, dk_acc, dv_acc), _ = jax.lax.scan(step, (dq0, dk_acc, dv_acc), jnp.arange(span))
        return (dk_acc, dv_acc), dq.astype(q.dtype)

    acc0 = (jnp.zeros(kp.shape, jnp.float32), jnp.zeros(vp.shape, jnp.float32))
    (dk, dv), dq = jax.lax.scan(one_query_block, acc0, (jnp.arange(nq), qb, dob, lse, delta))
    dq = dq.transpose(1, 0, 2, 3, 4, 5).reshape(b, t, n, h)
    return dq, dk[:, pad:].astype(k.dtype), dv[:, pad:].astype(v.dtype)


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
