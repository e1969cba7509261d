"""Rewards from named parts, rounded as the Rust SDK rounds them."""

import struct
from typing import Sequence, Tuple

from .types import Reward


def f32(x: float) -> float:
    """`x` rounded to the nearest f32 (what the contract's `f32` carries)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def reward(turn: int, agent: int, parts: Sequence[Tuple[str, float]]) -> Reward:
    """Each part rounded to f32 and `total` the f32 sum of the rounded parts, so that the
    total always equals the sum of the parts the trainer logs."""
    rounded = [(name, f32(value)) for name, value in parts]
    # Rust's float sum starts at -0.0 (so that a sum of -0.0 parts is -0.0).
    total = -0.0
    for _, value in rounded:
        total = f32(total + value)
    return Reward(turn, agent, total, rounded)
