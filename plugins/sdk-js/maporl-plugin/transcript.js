// Look-ups and checks on a transcript, as the Rust SDK's `transcript` module does.

/** An error a plugin returns as its world's error (the message as it is). */
export class PluginError extends Error {
  constructor(message) {
    super(message);
    this.name = "PluginError";
  }
}

/**
 * What the host promises: agents, turns from 1, one utterance per (turn, agent). Throws a
 * PluginError naming `plugin` otherwise.
 */
export function check(plugin, transcript) {
  if (transcript.agents === 0) {
    throw new PluginError(`${plugin}: the transcript has no agents (agents = 0)`);
  }
  const seen = new Set();
  for (const u of transcript.utterances) {
    if (u.turn === 0) throw new PluginError(`${plugin}: utterance at turn 0`);
    if (u.agent >= transcript.agents) {
      throw new PluginError(
        `${plugin}: agent ${u.agent} out of range (the team has ${transcript.agents})`,
      );
    }
    const key = `${u.turn},${u.agent}`;
    if (seen.has(key)) {
      throw new PluginError(`${plugin}: two utterances of agent ${u.agent} at turn ${u.turn}`);
    }
    seen.add(key);
  }
}

/** Throws a PluginError for turn 0 (turns are 1-based). */
export function checkTurn(plugin, turn) {
  if (turn === 0) throw new PluginError(`${plugin}: turns are 1-based, got turn 0`);
}

/** The utterance of `agent` at `turn`, or `undefined`. */
export function find(transcript, turn, agent) {
  for (const u of transcript.utterances) {
    if (u.turn === turn && u.agent === agent) return u;
  }
  return undefined;
}

/** The utterances of one turn, in transcript order. */
export function atTurn(transcript, turn) {
  return transcript.utterances.filter((u) => u.turn === turn);
}

/** The last turn anyone spoke at (`undefined` for an empty transcript). */
export function lastTurn(transcript) {
  let best;
  for (const u of transcript.utterances) {
    if (best === undefined || u.turn > best) best = u.turn;
  }
  return best;
}

/** The most recent utterance of `agent` at or before `turn` (the later one of a tie). */
export function latest(transcript, agent, turn) {
  let best;
  for (const u of transcript.utterances) {
    if (u.agent === agent && u.turn <= turn && (best === undefined || u.turn >= best.turn)) {
      best = u;
    }
  }
  return best;
}

/**
 * The mean score of the utterances at `turn` (`undefined` when nobody spoke then): the
 * scores added in transcript order from 0, as Rust's fold and Python 3.11's `sum` do.
 */
export function meanScore(transcript, turn) {
  let sum = 0;
  let n = 0;
  for (const u of transcript.utterances) {
    if (u.turn === turn) {
      sum += u.score;
      n++;
    }
  }
  return n > 0 ? sum / n : undefined;
}

/** Compares strings by code point, as Python (and Rust, by UTF-8 bytes) order them. */
export function compareCodePoints(a, b) {
  const ia = a[Symbol.iterator]();
  const ib = b[Symbol.iterator]();
  for (;;) {
    const x = ia.next();
    const y = ib.next();
    if (x.done) return y.done ? 0 : -1;
    if (y.done) return 1;
    const cx = x.value.codePointAt(0);
    const cy = y.value.codePointAt(0);
    if (cx !== cy) return cx < cy ? -1 : 1;
  }
}

/**
 * The answers with the most votes, sorted by code point; none when no answer is valid or
 * "invalid" (`undefined` or `null`) outvotes every answer (the paper's tie rule).
 * @param {Iterable<string|undefined|null>} votes
 * @returns {string[]}
 */
export function majority(votes) {
  const counts = new Map();
  let invalid = 0;
  for (const v of votes) {
    if (v === undefined || v === null) invalid++;
    else counts.set(v, (counts.get(v) ?? 0) + 1);
  }
  let best = 0;
  for (const n of counts.values()) if (n > best) best = n;
  if (best === 0 || invalid > best) return [];
  const winners = [];
  for (const [answer, n] of counts) if (n === best) winners.push(answer);
  return winners.sort(compareCodePoints);
}
