// The paper's influence-aware reward in JavaScript (Definition 1): an utterance's reward is
// its own score and the discounted mean scores of the turns after it,
//
//     R = [V(t, a) + sum_{t' > t} gamma^(t'-t) mean_j V(t', j)] / sum_{t' >= t} gamma^(t'-t),
//
// with the paper's incentives when their coefficients are set. The same rewards as the Rust
// reference `influence` for these settings (tests/js_plugins.rs diffs them, bit for bit).
//
// Settings: `gamma` (0.3), `alpha_0`, `alpha_1`, `beta_0`, `beta_1` (0: off).
//
//     node ../../sdk-js/maporl-plugin/build.mjs app.js --world reward-shaper -o influence.wasm

import { PluginError, RewardShaper, exportPlugin } from "../../sdk-js/maporl-plugin/index.js";
import { reward } from "../../sdk-js/maporl-plugin/reward.js";
import { atTurn, check, find, lastTurn, meanScore } from "../../sdk-js/maporl-plugin/transcript.js";

const NAME = "influence-js";
const COEFFICIENTS = ["alpha_0", "alpha_1", "beta_0", "beta_1"];

function influence(transcript, u, last, gamma) {
  let num = u.score;
  let den = 1;
  for (let t = u.turn + 1; t <= last; t++) {
    const m = meanScore(transcript, t);
    if (m !== undefined) {
      const d = gamma ** (t - u.turn);
      num += d * m;
      den += d;
    }
  }
  return num / den;
}

/** [alpha-0, alpha-1, beta-0, beta-1] of one utterance, the paper's signs. */
function incentives(transcript, u, last, c) {
  let [a0, a1, b0, b1] = [0, 0, 0, 0];
  if (u.turn >= 2) {
    const prev = find(transcript, u.turn - 1, u.agent);
    const others = atTurn(transcript, u.turn - 1)
      .filter((o) => o.agent !== u.agent)
      .map((o) => o.correct);
    if (prev !== undefined && others.length) {
      const othersRight = others.filter(Boolean).length / others.length >= 0.5;
      if (!prev.correct && u.correct) {
        if (othersRight) a1 = c.alpha_1;
        else a0 = c.alpha_0;
      } else if (prev.correct && !u.correct) {
        if (othersRight) a0 = -c.alpha_0;
        else a1 = -c.alpha_1;
      }
    }
  }
  if (u.turn < last) {
    const moves = [];
    for (const o of atTurn(transcript, u.turn)) {
      if (o.agent === u.agent) continue;
      const next = find(transcript, u.turn + 1, o.agent);
      if (next !== undefined) moves.push(!o.correct && next.correct);
    }
    if (moves.length) {
      const f = moves.filter(Boolean).length / moves.length;
      if (u.correct) b1 = c.beta_1 * f;
      else b0 = c.beta_0 * f;
    }
  }
  return [a0, a1, b0, b1];
}

class Influence extends RewardShaper {
  static NAME = NAME;
  static SETTINGS = { gamma: 0.3, alpha_0: 0, alpha_1: 0, beta_0: 0, beta_1: 0 };

  constructor(settings) {
    super(settings);
    if (!(settings.gamma >= 0 && settings.gamma <= 1)) {
      throw new PluginError(`${NAME}: gamma = ${settings.gamma}: expected a number in [0, 1]`);
    }
  }

  shape(task, transcript) {
    check(NAME, transcript);
    const last = lastTurn(transcript);
    if (last === undefined) return [];
    const c = Object.fromEntries(COEFFICIENTS.map((k) => [k, this.settings[k]]));
    const on = COEFFICIENTS.filter((k) => c[k] !== 0);
    return transcript.utterances.map((u) => {
      const parts = [["influence", influence(transcript, u, last, this.settings.gamma)]];
      if (on.length) {
        const terms = incentives(transcript, u, last, c);
        for (const k of on) parts.push([k.replace("_", "-"), terms[COEFFICIENTS.indexOf(k)]]);
      }
      return reward(u.turn, u.agent, parts);
    });
  }
}

export const rewardShaping = exportPlugin(Influence);
