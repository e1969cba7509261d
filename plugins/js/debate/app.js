// The paper's debate protocol in JavaScript: every agent answers every turn, seeing its own
// earlier answers and its peers'; the team's answer is the majority vote. The same prompts,
// to the byte, as the Rust reference `debate` (tests/js_plugins.rs diffs them).
//
// Settings: `peers` (a whole number or null: show at most this many other agents),
// `show_scores` (boolean), `early_stop` (boolean: an empty plan once every agent gave the
// same valid answer), `system` (a string or null: a system prompt).
//
//     node ../../sdk-js/maporl-plugin/build.mjs app.js --world protocol -o debate.wasm

import { PluginError, Protocol, exportPlugin } from "../../sdk-js/maporl-plugin/index.js";
import { debateMessages } from "../../sdk-js/maporl-plugin/prompts.js";
import { atTurn, check, checkTurn, find, majority } from "../../sdk-js/maporl-plugin/transcript.js";

const NAME = "debate-js";

function allAgree(transcript, turn) {
  const answers = [];
  for (let a = 0; a < transcript.agents; a++) answers.push(find(transcript, turn, a)?.answer);
  return answers.every((x) => x !== undefined && x !== null) && new Set(answers).size <= 1;
}

class Debate extends Protocol {
  static NAME = NAME;
  static SETTINGS = { peers: null, show_scores: false, early_stop: false, system: null };

  constructor(settings) {
    super(settings);
    const { peers, system } = settings;
    if (peers !== null && !(Number.isInteger(peers) && peers >= 0)) {
      throw new PluginError(`${NAME}: peers = ${JSON.stringify(peers)}: expected a whole number >= 0, or null`);
    }
    if (system !== null && typeof system !== "string") {
      throw new PluginError(`${NAME}: system = ${JSON.stringify(system)}: expected a string, or null`);
    }
  }

  planTurn(task, turn, transcript) {
    checkTurn(NAME, turn);
    check(NAME, transcript);
    const s = this.settings;
    if (turn >= 2 && s.early_stop && allAgree(transcript, turn - 1)) return [];
    const participants = [...Array(transcript.agents).keys()];
    return participants.map((agent) => ({
      agent,
      messages: debateMessages(NAME, task, transcript, agent, turn, participants, {
        peers: s.peers,
        showScores: s.show_scores,
        system: s.system,
      }),
    }));
  }

  decide(task, turn, transcript) {
    checkTurn(NAME, turn);
    check(NAME, transcript);
    return majority(atTurn(transcript, turn).map((u) => u.answer));
  }
}

export const collaboration = exportPlugin(Debate);
