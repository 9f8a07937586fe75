"""A discontinuous variant's discrete decisions (LSH's sort orders, LSHAttention.orders)
recorded from one forward and replayed in another, so that two runs that round differently
can be compared on the continuous part alone (test_export_parity, test_encoder)."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def _overridden_orders(encoder, make):
    """Each layer's attention.orders replaced by make(layer, index) inside the block."""
    for index, layer in enumerate(encoder.layers):
        layer.attention.orders = make(layer, index)
    try:
        yield
    finally:
        for layer in encoder.layers:
            del layer.attention.orders


@contextlib.contextmanager
def recorded_orders(encoder):
    """Yields a list with, per layer, {round: (q_order, k_order)} as the forwards inside take them."""
    log = [{} for _ in encoder.layers]

    def make(layer, index):
        take, rounds = layer.attention.orders, log[index]

        def orders(q, k, key_valid, round_):
            rounds[round_] = take(q, k, key_valid, round_)
            return rounds[round_]
        return orders

    with _overridden_orders(encoder, make):
        yield log


def replayed_orders(encoder, orders_by_layer):
    """Inside the block layer i takes orders_by_layer[i][round] as its (q_order, k_order)."""
    return _overridden_orders(encoder, lambda layer, index: lambda q, k, key_valid, round_: orders_by_layer[index][round_])
