"""Turns a ``Strategy`` into the layer runner the model's layer loop calls."""

from __future__ import annotations

import contextlib

import jax
from jax.experimental.xla_metadata import set_xla_metadata

from memprobe.model import LayerStep, run_directly
from memprobe.strategy import TRIP_COUNT_ONE_ATTR, Loop, Policy, Strategy


def checkpoint_policy(strategy: Strategy):
    cp = jax.checkpoint_policies
    match strategy.policy:
        case Policy.NOTHING:
            return cp.nothing_saveable
        case Policy.EVERYTHING:
            return cp.everything_saveable
        case Policy.DOTS:
            return cp.dots_saveable
        case Policy.DOTS_NO_BATCH:
            return cp.dots_with_no_batch_dims_saveable
        case Policy.NAMES if strategy.offload:
            return cp.save_and_offload_only_these_names(
                names_which_can_be_saved=list(strategy.save),
                names_which_can_be_offloaded=list(strategy.offload),
                offload_src="device",
                offload_dst="pinned_host",
            )
        case Policy.NAMES:
            return cp.save_only_these_names(*strategy.save)
    raise AssertionError(strategy.policy)  # every Policy member is matched above


class _Runner:
    """A strategy's layer runner: ``run`` for each layer, and the trip wrapper of a scan over
    stacked layers."""

    def __init__(self, run, checkpoint_period: bool):
        self._run = run
        self._checkpoint_period = checkpoint_period

    def __call__(self, step: LayerStep, x, per_layer_input, kv):
        return self._run(step, x, per_layer_input, kv)

    def wrap_trip(self, trip):
        if not self._checkpoint_period:
            return trip
        # Inside the scan, as for the layers in it: the loop keeps the recomputation apart.
        return jax.checkpoint(trip, policy=jax.checkpoint_policies.nothing_saveable, prevent_cse=False)


def make_layer_runner(strategy: Strategy):
    if strategy.loop is Loop.UNROLLED:
        return run_directly
    policy = checkpoint_policy(strategy.as_compiled())
    in_scan = strategy.loop is Loop.SCAN_CHECKPOINT

    def run(step: LayerStep, x, per_layer_input, kv):
        layer = jax.checkpoint(step.forward, policy=policy, prevent_cse=strategy.prevent_cse)
        donor_outside = step.is_donor and not strategy.shared_kv_inside
        if donor_outside:
            # The donor's K/V is computed outside the boundary, so its residuals are kept.
            kv = step.key_value(step.state, x)
        if not in_scan:
            y, kv_out = layer(step.state, x, per_layer_input, kv)
            return y, (kv if donor_outside else kv_out)

        emit_kv = step.is_donor and not donor_outside

        def body(carry, _):
            y, kv_out = layer(step.state, carry, per_layer_input, kv)
            return y, (kv_out if emit_kv else None)

        marked = (set_xla_metadata(**{TRIP_COUNT_ONE_ATTR: "true"})
                  if strategy.trip_count_one else contextlib.nullcontext())
        with marked:
            y, stacked = jax.lax.scan(body, x, None, length=1)
        if emit_kv:
            return y, jax.tree.map(lambda a: a[0], stacked)
        return y, kv

    return _Runner(run, strategy.checkpoint_period)
