"""The Gemma 4 small decoder: embeddings, per-layer embeddings, the layer loop, chunked loss.

The model knows nothing of remat strategies. Its layer loop (``Transformer.decode``) hands
each layer to a ``LayerRunner`` as pure functions of the layer's parameter state; a
strategy decides how to call them (directly, under ``jax.checkpoint``, inside a scan).

With ``stacked=True`` the parameters are laid out as a scan-over-layers trainer keeps them:
for each ``LayerStack`` of the config (whole periods of the attention pattern), each
position in the period holds its layers' parameters stacked along a leading trip axis, and
the layer loop runs the stack's trips as one ``lax.scan``, handing every layer of a trip to
the runner as before, and each whole trip to the runner's ``wrap_trip``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import nnx

from memprobe.model._config import LayerStack, ModelConfig
from memprobe.model._modules import Block, RMSNorm, _param

KV = tuple[jax.Array, jax.Array]


@dataclasses.dataclass(frozen=True)
class LayerStep:
    """One decoder layer as pure functions of its parameter ``state``.

    ``forward(state, x, per_layer_input, kv)`` returns (output, kv); with ``kv`` None the
    layer computes its own K/V. ``key_value(state, x)`` computes only the K/V, which a
    donor layer hands to the KV-shared layers. Inside a stack's scan one step stands for
    its position in every trip: ``index`` is the first trip's layer, and ``is_donor`` holds
    when the position is a donor in any trip (its K/V then leaves every trip).
    """

    index: int
    is_donor: bool
    is_kv_shared: bool
    state: Any
    forward: Callable[..., tuple[jax.Array, KV]]
    key_value: Callable[[Any, jax.Array], KV]


TripFn = Callable[[jax.Array, Any], tuple[jax.Array, Any]]


class LayerRunner(Protocol):
    """The layer loop's hook. It is called for every layer; ``wrap_trip`` gets the body of a
    stack's scan, one trip of ``period`` layers as ``(x, per-trip inputs) -> (x, handed K/V)``,
    and returns what the scan runs instead (in the stacked layout only)."""

    def __call__(self, step: LayerStep, x: jax.Array, per_layer_input: jax.Array,
                 kv: KV | None) -> tuple[jax.Array, KV]: ...

    def wrap_trip(self, trip: TripFn) -> TripFn: ...


class _Direct:
    """The runner with no remat: every layer, and every trip, is called as written."""

    def __call__(self, step: LayerStep, x, per_layer_input, kv):
        return step.forward(step.state, x, per_layer_input, kv)

    def wrap_trip(self, trip: TripFn) -> TripFn:
        return trip

    def __repr__(self):
        return "run_directly"


run_directly = _Direct()


def _identity(x):
    return x


class StackedBlocks(nnx.Module):
    """The layers of one ``LayerStack``: per position in the period, one ``Block`` whose
    parameters are that position's layers' parameters stacked along a leading trip axis."""

    def __init__(self, stack: LayerStack, blocks: list[Block]):
        positions = []
        for j in range(stack.period):
            trips = [blocks[stack.layer(k, j)] for k in range(stack.repeats)]
            states = [nnx.state(b, nnx.Param) for b in trips]
            nnx.update(trips[0], jax.tree.map(lambda *xs: jnp.stack(xs), *states))
            positions.append(trips[0])
        self.positions = nnx.List(positions)


class Transformer(nnx.Module):
    """Gemma 4 small, text only. ``activation_dtype`` is what matmuls and activations use."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, activation_dtype=jnp.bfloat16,
                 stacked: bool = False):
        self.cfg = cfg
        self.activation_dtype = activation_dtype
        v, d, n_layers, p = cfg.vocab_size, cfg.width, cfg.num_layers, cfg.per_layer_dim
        self.embedding = _param(rngs, (v, d))
        self.ple_table = _param(rngs, (v, n_layers * p))
        self.ple_model_proj = _param(rngs, (d, n_layers * p))
        self.ple_proj_norm = RMSNorm(p, rngs=rngs)
        # Built in layer order in both layouts, so both draw the same initial values.
        blocks = [Block(cfg, i, rngs=rngs) for i in range(n_layers)]
        self.layout = cfg.layer_layout() if stacked else tuple(range(n_layers))
        self.layers = nnx.List([blocks[item] if isinstance(item, int) else StackedBlocks(item, blocks)
                                for item in self.layout])
        self.final_norm = RMSNorm(d, rngs=rngs)

    def embed(self, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Token embeddings [B, T, D] and per-layer inputs [B, T, L, P]."""
        cfg, dt = self.cfg, self.activation_dtype
        x = self.embedding[...][tokens].astype(dt) * jnp.asarray(math.sqrt(cfg.width), dt)
        b, t = tokens.shape
        proj = jnp.einsum("btd,dq->btq", x, self.ple_model_proj[...].astype(dt))
        proj = proj.reshape(b, t, cfg.num_layers, cfg.per_layer_dim)
        # The projection was scaled by 1/sqrt(width) at init in the reference; the table
        # lookup is scaled by sqrt(per_layer_dim). Both halves are averaged.
        proj = self.ple_proj_norm(proj * jnp.asarray(cfg.width ** -0.5, dt))
        table = self.ple_table[...][tokens].astype(dt).reshape(b, t, cfg.num_layers, cfg.per_layer_dim)
        table = table * jnp.asarray(math.sqrt(cfg.per_layer_dim), dt)
        return x, (proj + table) * jnp.asarray(2 ** -0.5, dt)

    def _step(self, block: Block, index: int, positions, is_donor: bool) -> LayerStep:
        graphdef, state = nnx.split(block)

        def forward(state, x, ple, kv):
            return nnx.merge(graphdef, state)(x, ple, positions, kv)

        def key_value(state, x):
            return nnx.merge(graphdef, state).key_value(x, positions)

        return LayerStep(index=index, is_donor=is_donor, is_kv_shared=self.cfg.is_kv_shared(index),
                         state=state, forward=forward, key_value=key_value)

    def _shared_kv(self, layer: int, donated: dict[int, KV]) -> KV | None:
        donor = self.cfg.kv_donor(layer)
        return donated[donor] if donor is not None else None

    def decode(self, x, per_layer_inputs, positions, runner: LayerRunner = run_directly,
               constrain: Callable[[jax.Array], jax.Array] = _identity) -> jax.Array:
        """The layer loop: the one place a strategy acts, through ``runner``."""
        donors = self.cfg.donor_layers
        donated: dict[int, KV] = {}
        for item, module in zip(self.layout, self.layers):
            if isinstance(item, LayerStack):
                x = self._scan_stack(item, module, x, per_layer_inputs, positions, runner,
                                     constrain, donated)
                continue
            step = self._step(module, item, positions, item in donors)
            with jax.named_scope(f"layer{item}"):  # op names say which layer a buffer is from
                x, kv = runner(step, x, per_layer_inputs[:, :, item, :], self._shared_kv(item, donated))
            x = constrain(x)
            if step.is_donor:
                donated[item] = kv
        return self.final_norm(x)

    def _scan_stack(self, stack: LayerStack, module: StackedBlocks, x, per_layer_inputs, positions,
                    runner, constrain, donated: dict[int, KV]):
        """One ``lax.scan`` over the stack's trips; each trip runs its ``period`` layers."""
        donors = self.cfg.donor_layers
        steps, shared, ples = [], [], []
        for j, block in enumerate(module.positions):
            trips = [stack.layer(k, j) for k in range(stack.repeats)]
            steps.append(self._step(block, trips[0], positions, any(i in donors for i in trips)))
            # A position's layers share their kind, hence their donor.
            shared.append(self._shared_kv(trips[0], donated))
            ples.append(jnp.moveaxis(per_layer_inputs[:, :, trips[0]:stack.layers.stop:stack.period, :], 2, 0))
        scope = f"layers{stack.first}-{stack.layers.stop - 1}"

        def trip(x, xs):
            states, trip_ples = xs
            handed = []
            for j, step in enumerate(steps):
                with jax.named_scope(f"{scope}/position{j}"):
                    x, kv = runner(dataclasses.replace(step, state=states[j]), x, trip_ples[j], shared[j])
                x = constrain(x)
                handed.append(kv if step.is_donor else None)
            return x, tuple(handed)

        x, handed = jax.lax.scan(runner.wrap_trip(trip), x,
                                 (tuple(step.state for step in steps), tuple(ples)))
        for j, kvs in enumerate(handed):
            for k in range(stack.repeats):
                if stack.layer(k, j) in donors:
                    donated[stack.layer(k, j)] = jax.tree.map(lambda a, k=k: a[k], kvs)
        return x

    def hidden(self, tokens, runner: LayerRunner = run_directly, constrain=_identity):
        x, ple = self.embed(tokens)
        x = constrain(x)
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        return self.decode(x, ple, positions, runner, constrain)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Soft-capped fp32 logits from final hidden states (tied output embedding)."""
        logits = jnp.einsum("...d,vd->...v", hidden, self.embedding[...].astype(hidden.dtype),
                            preferred_element_type=jnp.float32)
        cap = self.cfg.final_logit_softcap
        return jnp.tanh(logits / cap) * cap

    def loss(self, tokens, targets, *, loss_chunks: int, runner: LayerRunner = run_directly,
             constrain=_identity) -> jax.Array:
        """Mean token cross-entropy; logits exist for one sequence chunk at a time."""
        hidden = self.hidden(tokens, runner, constrain)
        b, t, d = hidden.shape
        if t % loss_chunks:
            raise ValueError(f"sequence length {t} does not split into {loss_chunks} loss chunks")
        chunk = t // loss_chunks
        hs = hidden.reshape(b, loss_chunks, chunk, d).swapaxes(0, 1)
        ts = targets.reshape(b, loss_chunks, chunk).swapaxes(0, 1)

        # Recomputed in the backward pass, so no chunk's logits outlive its iteration.
        @jax.checkpoint
        def chunk_loss(h, tgt):
            logits = self.logits(h)
            lse = jax.nn.logsumexp(logits, axis=-1)
            picked = jnp.take_along_axis(logits, tgt[..., None], axis=-1)[..., 0]
            return jnp.sum(lse - picked)

        def body(total, xs):
            return total + chunk_loss(*xs), None

        total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), (hs, ts))
        return total / float(b * t)  # a float: 2^31 tokens or more (seq 2^20 x 2048 devices) overflow int32
