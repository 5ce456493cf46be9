"""Matmul FLOPs of the traced train step: the recompute cost column.

XLA's ``Compiled.cost_analysis()`` counts the body of every while loop once. A full-size
compile turns attention blocks, loss chunks and (after remat) recomputed layers into
hundreds of loops, so its FLOPs shrink as a strategy recomputes *more* (measured on
Gemma 4 E2B at seq 24576: checkpoint 0.86x and dots-no-batch 0.44x of unrolled).

This module counts instead from the step's jaxpr, before the compiler sees it: every
``dot_general`` is ``2 * prod(output shape) * prod(contracted sizes)`` FLOPs; a ``scan``
body counts ``length`` times; the recomputation that ``jax.checkpoint`` adds to the
backward pass is in the jaxpr, so it is counted; a ``cond`` counts its dearest branch.
A ``while`` loop with a trip count only known at run time would count once; memprobe's
model has none (its ``fori_loop``s have static bounds and trace to scans).
Elementwise work (norms, softmax, optimizer) is left out: in a transformer step it is a
few percent of the matmuls, and it would only blur what this figure is for, which is
comparing strategies' recompute.
"""

from __future__ import annotations

import math
from typing import Any


def _sub_jaxprs(params: dict[str, Any]):
    from jax.extend import core

    def walk(v):
        if isinstance(v, core.ClosedJaxpr):
            yield v.jaxpr
        elif isinstance(v, core.Jaxpr):
            yield v
        elif isinstance(v, (tuple, list)):
            for x in v:
                yield from walk(x)

    for v in params.values():
        yield from walk(v)


def _dot_flops(eqn) -> int:
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval.shape
    out = eqn.outvars[0].aval.shape
    return 2 * math.prod(out) * math.prod(lhs[d] for d in lhs_contract)


def _count(jaxpr) -> int:
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            total += _dot_flops(eqn)
        elif name == "scan":
            total += eqn.params["length"] * _count(eqn.params["jaxpr"].jaxpr)
        elif name == "cond":
            total += max(_count(b.jaxpr) for b in eqn.params["branches"])
        else:  # pjit, checkpoint, custom_vjp_call, while, ...: their bodies count once
            total += sum(_count(j) for j in _sub_jaxprs(eqn.params))
    return total


def matmul_flops(closed_jaxpr) -> int:
    """Matmul FLOPs of a ``ClosedJaxpr``: the whole program, all devices together."""
    return _count(closed_jaxpr.jaxpr)
