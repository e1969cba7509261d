// Prompts: the turn-1 prompt per task kind and the debate's follow-up messages, the same text
// as the Rust SDK's `prompts` module. Agents are numbered from 1 in prompt text.

import { pyFormatFixed, trim } from "./text.js";
import { PluginError, find } from "./transcript.js";
import { ASSISTANT, SYSTEM, USER, chatMessage } from "./types.js";

export const NUMERIC = "numeric";
export const NLI = "nli";
export const GENERIC = "generic";

/** NUMERIC for `gsm8k` / `arith`, NLI for `anli`, GENERIC otherwise (any case, trimmed). */
export function taskKind(task) {
  const kind = trim(task.kind).toLowerCase();
  if (kind === "gsm8k" || kind === "arith") return NUMERIC;
  if (kind === "anli") return NLI;
  return GENERIC;
}

/** The trimmed value of the first field named `name`, or `undefined` (also when empty). */
export function field(task, name) {
  for (const [k, v] of task.fields) {
    if (k === name) {
      const value = trim(v);
      return value === "" ? undefined : value;
    }
  }
  return undefined;
}

/** "Question: ..." (or the premise and hypothesis of an NLI task). */
export function questionBlock(task) {
  if (taskKind(task) === NLI) {
    const p = field(task, "premise");
    const h = field(task, "hypothesis");
    if (p !== undefined && h !== undefined) return `Premise: ${p}\nHypothesis: ${h}`;
    return trim(task.question);
  }
  return `Question: ${trim(task.question)}`;
}

export const INSTRUCTION = Object.freeze({
  [NUMERIC]:
    "Provide a reasoning for your solution. At the end, write the answer as " +
    "`Answer: \\boxed{N}` where N is an integer.",
  [NLI]:
    "Does the premise entail the hypothesis? Choose one of entailment / neutral / " +
    "contradiction, reason briefly, and conclude with `Answer: \\boxed{label}` where " +
    "label is entailment, neutral or contradiction.",
  [GENERIC]: "Answer briefly and end with `Answer: \\boxed{...}`.",
});

/** The question block and the task kind's instruction. */
export function firstTurnPrompt(task) {
  return `${questionBlock(task)}\n${INSTRUCTION[taskKind(task)]}`;
}

export const REVISE_WITH_PEERS =
  "Consider your previous solution and the other agents' answers. If you believe your " +
  "previous answer was wrong, revise it; otherwise keep it. Avoid merely repeating earlier " +
  "reasoning, and keep the reasoning short.";
export const REVISE_ALONE =
  "Consider your previous solution. If you believe it was wrong, revise it; otherwise keep " +
  "it. Avoid merely repeating earlier reasoning, and keep the reasoning short.";

/** "Agent N", numbered from 1. */
export function agentLabel(agent) {
  return `Agent ${agent + 1}`;
}

/** The score note shown under an answer (the score as Python's `f"{score:.3f}"`). */
export function scoreNote(score) {
  const verdict = score >= 0.5 ? "correct" : "incorrect";
  return (
    `Reward: ${pyFormatFixed(score, 3)} out of 1.0, which means the verifier thinks this ` +
    `answer is likely ${verdict}.`
  );
}

/**
 * `[label, text, score]` per shown answer (score `undefined` or `null` when not shown), one
 * paragraph each.
 * @param {Array<[string, string, (number|undefined|null)]>} shown
 * @returns {string}
 */
export function renderShown(shown) {
  return shown
    .map(([label, text, score]) =>
      score === undefined || score === null
        ? `${label}: ${trim(text)}`
        : `${label}: ${trim(text)}\n${scoreNote(score)}`,
    )
    .join("\n\n");
}

/** The follow-up user message after an agent's answer; `peers` as for `renderShown`. */
export function followupMessage(task, peers) {
  const question = firstTurnPrompt(task);
  if (peers.length === 0) return `${REVISE_ALONE}\n\n${question}`;
  return (
    "These are the other agents' answers from the previous turn:\n\n" +
    `${renderShown(peers)}\n\n${REVISE_WITH_PEERS}\n\n${question}`
  );
}

/** `[system message]`, or `[]` when `system` is `undefined`, `null` or blank. */
export function systemMessage(system) {
  if (system === undefined || system === null || trim(system) === "") return [];
  return [chatMessage(SYSTEM, system)];
}

/**
 * At most `limit` (all when `undefined` or `null`) other participants, cyclically after
 * `agent`; `[]` when `agent` is not a participant.
 * @param {number[]} participants
 * @param {number} agent
 * @param {number|undefined|null} limit
 * @returns {number[]}
 */
export function peersOf(participants, agent, limit) {
  const n = participants.length;
  const pos = participants.indexOf(agent);
  if (pos < 0) return [];
  const count = limit === undefined || limit === null ? n - 1 : Math.min(limit, n - 1);
  const out = [];
  for (let i = 0; i < count; i++) out.push(participants[(pos + 1 + i) % n]);
  return out;
}

/**
 * The conversation `agent` sees at `turn`: the question, then for each earlier turn its own
 * answer and a follow-up showing its peers' answers. Throws a PluginError when `agent` has no
 * utterance at an earlier turn.
 * @param {string} plugin the plugin's name, for errors
 * @param {object} task
 * @param {object} transcript
 * @param {number} agent
 * @param {number} turn 1-based
 * @param {number[]} participants the agents of the debate, in order
 * @param {object} [options]
 * @param {number|null} [options.peers] show at most this many peers (all when absent or null)
 * @param {boolean} [options.showScores=false] show each shown answer's verifier score
 * @param {string|null} [options.system] a system prompt (none when absent, null or blank)
 * @returns {Array<{role: string, content: string}>}
 */
export function debateMessages(plugin, task, transcript, agent, turn, participants, options = {}) {
  const { peers = undefined, showScores = false, system = undefined } = options;
  const shownPeers = peersOf(participants, agent, peers);
  const messages = systemMessage(system);
  messages.push(chatMessage(USER, firstTurnPrompt(task)));
  for (let k = 1; k < turn; k++) {
    const own = find(transcript, k, agent);
    if (own === undefined) {
      throw new PluginError(
        `${plugin}: task \`${task.id}\`: agent ${agent} has no utterance at turn ${k}, so its ` +
          `turn-${turn} conversation cannot be built (the transcript does not follow ` +
          "this protocol)",
      );
    }
    messages.push(chatMessage(ASSISTANT, own.text));
    const shown = [];
    for (const p of shownPeers) {
      const u = find(transcript, k, p);
      if (u !== undefined) {
        shown.push([agentLabel(u.agent), u.text, showScores ? u.score : undefined]);
      }
    }
    messages.push(chatMessage(USER, followupMessage(task, shown)));
  }
  return messages;
}
