"""Joins model and strategy into an abstract, sharded train step ready to lower.

Nothing is allocated: parameters, optimizer state and the batch are ``ShapeDtypeStruct``s.
Parameters are stored in the job's dtype (fp32 or bf16; the model casts them to bf16 where
it computes) and the optimizer's state follows them. Both are sharded FSDP-style over every
device of the target
(each array along its largest dimension that the device count divides); the batch is
split over the devices; activations are kept batch-sharded at every layer boundary. With
gradient accumulation the step takes its microbatches stacked and runs them one after
another in a ``lax.scan``, summing their gradients.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from memprobe.errors import BadInput
from memprobe.liveness import ACCUM_SCOPE, OPTIMIZER_SCOPE
from memprobe.model import ModelConfig, Transformer
from memprobe.plan import CompileJob, Optimizer, ParamDtype, Step
from memprobe.targets import Target

AXIS = "fsdp"


def make_devices(target: Target) -> list:
    """Compile-only devices for a TPU topology or a GPU target config, or the local CPU devices."""
    if target.platform == "tpu":
        from jax.experimental import topologies

        kwargs = {"chip_config_name": target.chip_config} if target.chip_config else {}
        try:
            desc = topologies.get_topology_desc(platform="tpu", topology_name=target.topology, **kwargs)
        except Exception as e:  # libtpu's own words for a topology it rejects
            # Not "--topology:": the topology may have come from --target v5p:9x9x9 or v5p-8.
            raise BadInput(f"libtpu rejects the topology {target.topology!r}: "
                           f"{str(e).strip().splitlines()[0]}") from None
        devices = list(desc.devices)
    elif target.platform == "cuda":
        from jax.experimental import topologies

        from memprobe.targets import gpu_target_config

        # topology is partitions x hosts x devices per host; one host holds them all here.
        desc = topologies.get_topology_desc(platform="cuda", topology_name="",
                                            target_config=gpu_target_config(target.gpu_config),
                                            topology=f"1x1x{target.num_devices}")
        devices = list(desc.devices)
    else:
        devices = jax.devices("cpu")
    if len(devices) < target.num_devices:
        raise BadInput(f"{target.name}: {target.num_devices} devices asked for, {len(devices)} available")
    return devices[: target.num_devices]


def fsdp_spec(shape: Sequence[int], num_devices: int) -> P:
    """Shard the largest dimension the device count divides; replicate what cannot split."""
    if num_devices == 1:
        return P()
    best = None
    for axis, size in enumerate(shape):
        if size % num_devices == 0 and size >= num_devices and (best is None or size > shape[best]):
            best = axis
    if best is None:
        return P()
    return P(*([None] * best + [AXIS]))


@dataclasses.dataclass
class AbstractStep:
    """A jitted step and the abstract arguments to lower it with."""

    fn: Callable
    args: tuple
    parameter_count: int

    def lower(self):
        return self.fn.lower(*self.args)


def abstract_params(cfg: ModelConfig, stacked: bool = False):
    model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0), stacked=stacked))
    graphdef, params = nnx.split(model, nnx.Param)
    return graphdef, params


def parameter_count(cfg: ModelConfig, stacked: bool = False) -> int:
    _, params = abstract_params(cfg, stacked)
    return sum(math.prod(x.shape) for x in jax.tree.leaves(params))


def _with_sharding(tree, mesh: Mesh, dtype=None):
    """``tree`` sharded over ``mesh``; its floating arrays in ``dtype`` where one is given."""
    def one(x):
        sharding = NamedSharding(mesh, fsdp_spec(x.shape, mesh.size))
        cast = dtype is not None and jnp.issubdtype(x.dtype, jnp.floating)
        return jax.ShapeDtypeStruct(x.shape, dtype if cast else x.dtype, sharding=sharding)

    return jax.tree.map(one, tree)


PARAM_DTYPES = {ParamDtype.FP32: jnp.float32, ParamDtype.BF16: jnp.bfloat16}


def make_optimizer(kind: Optimizer = Optimizer.ADAMW) -> optax.GradientTransformation:
    """The update of a train step. The hyperparameters change no buffer's size; the state
    each keeps does (moments in the parameters' dtype, as optax makes them by default)."""
    if kind is Optimizer.ADAMW:
        return optax.adamw(learning_rate=1e-4, b1=0.9, b2=0.95, weight_decay=0.1)
    if kind is Optimizer.ADAFACTOR:
        return optax.adafactor(learning_rate=1e-4)
    if kind is Optimizer.LION:
        return optax.lion(learning_rate=1e-5, b1=0.9, b2=0.99, weight_decay=0.1)
    return optax.sgd(learning_rate=1e-2)


def build_step(job: CompileJob, devices: list) -> AbstractStep:
    cfg, shapes = job.model, job.shapes
    mesh = Mesh(np.asarray(devices), (AXIS,))
    graphdef, params = abstract_params(cfg, stacked=job.strategy.stacks_layers)
    params = _with_sharding(params, mesh, PARAM_DTYPES[job.param_dtype])
    runner = job.strategy.layer_runner()
    act = NamedSharding(mesh, P(AXIS))
    batch_sharding = NamedSharding(mesh, P(AXIS, None))
    replicated = NamedSharding(mesh, P())

    def constrain(x):
        return jax.lax.with_sharding_constraint(x, act)

    def loss_fn(p, tokens, targets):
        model = nnx.merge(graphdef, p)
        return model.loss(tokens, targets, loss_chunks=shapes.loss_chunks, runner=runner,
                          constrain=constrain)

    p_shardings = jax.tree.map(lambda x: x.sharding, params)
    count = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    accum = job.grad_accum
    if accum == 1:
        batch = jax.ShapeDtypeStruct((job.global_batch, shapes.seq_len), jnp.int32, sharding=batch_sharding)
        loss_and_grads = jax.value_and_grad(loss_fn)
    else:  # the step's batch comes as [microbatch, example, token], each microbatch over every device
        batch = jax.ShapeDtypeStruct((accum, job.global_batch, shapes.seq_len), jnp.int32,
                                     sharding=NamedSharding(mesh, P(None, AXIS, None)))

        def loss_and_grads(p, tokens, targets):
            """The mean loss and gradients of ``accum`` microbatches, one at a time in a scan, so
            one microbatch's activations are live at once beside a running sum of gradients (in
            the parameters' dtype and sharding, as MaxText accumulates)."""
            def one(carry, micro):
                total, summed = carry
                loss, grads = jax.value_and_grad(loss_fn)(p, *micro)
                summed = jax.lax.with_sharding_constraint(jax.tree.map(jnp.add, summed, grads), p_shardings)
                return (total + loss.astype(jnp.float32), summed), None

            with jax.named_scope(ACCUM_SCOPE):  # names the loop's buffers in `explain`
                start = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, p))
                (total, summed), _ = jax.lax.scan(one, start, (tokens, targets))
                return total / accum, jax.tree.map(lambda g: g / accum, summed)

    if job.step is Step.GRAD:
        def grad_step(p, tokens, targets):  # the module's name, jit_grad_step, as before accumulation
            return loss_and_grads(p, tokens, targets)

        fn = jax.jit(grad_step, out_shardings=(replicated, p_shardings))
        return AbstractStep(fn, (params, batch, batch), count)

    optimizer = make_optimizer(job.optimizer)
    opt_state = _with_sharding(jax.eval_shape(optimizer.init, params), mesh)
    o_shardings = jax.tree.map(lambda x: x.sharding, opt_state)

    def train_step(p, o, tokens, targets):
        loss, grads = loss_and_grads(p, tokens, targets)
        with jax.named_scope(OPTIMIZER_SCOPE):
            updates, o = optimizer.update(grads, o, p)
            return optax.apply_updates(p, updates), o, loss

    fn = jax.jit(train_step, out_shardings=(p_shardings, o_shardings, replicated), donate_argnums=(0, 1))
    return AbstractStep(fn, (params, opt_state, batch, batch), count)
