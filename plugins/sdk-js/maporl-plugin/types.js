// The records of the contract (`maporl:plugin/types`), as plain objects.
//
// A plugin works on these, natively testable without any wasm; the export glue converts from
// and to the generated bindings at the component's edge. Field names are the WIT record
// fields in camelCase; list-of-tuple fields are arrays of `[name, value]` pairs; a missing
// optional answer is `undefined` (readers also accept `null`).

export const SYSTEM = "system";
export const USER = "user";
export const ASSISTANT = "assistant";
export const ROLES = Object.freeze([SYSTEM, USER, ASSISTANT]);

/**
 * A task: `fields` is an array of `[name, value]` string pairs.
 * @returns {{id: string, kind: string, question: string, reference: string, fields: Array<[string, string]>}}
 */
export function task(id, kind, question, reference = "", fields = []) {
  return { id, kind, question, reference, fields };
}

/**
 * One agent's utterance at one (1-based) turn; `answer` is a string or `undefined`.
 * @returns {{turn: number, agent: number, text: string, answer: (string|undefined), score: number, correct: boolean}}
 */
export function utterance(turn, agent, text, answer = undefined, score = 0, correct = false) {
  return { turn, agent, text, answer, score, correct };
}

/**
 * A debate so far: the team size, the turn budget and the utterances in order.
 * @returns {{agents: number, turns: number, utterances: Array<object>}}
 */
export function transcript(agents, turns, utterances = []) {
  return { agents, turns, utterances };
}

/**
 * One chat message; `role` is one of `ROLES`.
 * @returns {{role: string, content: string}}
 */
export function chatMessage(role, content) {
  return { role, content };
}

/**
 * The conversation one agent is prompted with.
 * @returns {{agent: number, messages: Array<{role: string, content: string}>}}
 */
export function prompt(agent, messages) {
  return { agent, messages };
}

/**
 * A verifier's verdict on one response; `answer` is a string or `undefined`.
 * @returns {{answer: (string|undefined), score: number, correct: boolean}}
 */
export function verdict(answer, score, correct) {
  return { answer, score, correct };
}

/**
 * A reward for one utterance: `parts` is an array of `[name, number]` pairs.
 * @returns {{turn: number, agent: number, total: number, parts: Array<[string, number]>}}
 */
export function reward(turn, agent, total, parts) {
  return { turn, agent, total, parts };
}
