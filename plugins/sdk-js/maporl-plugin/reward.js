// Rewards from named parts, rounded as the Rust SDK rounds them.

import { reward as rewardRecord } from "./types.js";

/**
 * `x` rounded to the nearest f32 (what the contract's `f32` carries). Beyond the f32 range
 * the result is ±Infinity, as Rust's `x as f32` gives (Python's `struct.pack` raises an
 * OverflowError there instead).
 */
export function f32(x) {
  return Math.fround(x);
}

/**
 * A reward record: each part rounded to f32 and `total` the f32 sum of the rounded parts, so
 * that the total always equals the sum of the parts the trainer logs.
 * @param {number} turn
 * @param {number} agent
 * @param {Array<[string, number]>} parts
 * @returns {{turn: number, agent: number, total: number, parts: Array<[string, number]>}}
 */
export function reward(turn, agent, parts) {
  const rounded = [];
  for (const [name, value] of parts) rounded.push([name, f32(value)]);
  // Rust's float sum starts at -0.0 (so that a sum of -0.0 parts is -0.0).
  let total = -0;
  for (const [, value] of rounded) total = f32(total + value);
  return rewardRecord(turn, agent, total, rounded);
}
