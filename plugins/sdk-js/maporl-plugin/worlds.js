// One base class per world, and `exportPlugin`, which turns a plugin class into the object
// the component exports for its world (`collaboration`, `verification` or `rewardShaping`):
//
//     class Gsm8k extends Verifier {
//       static NAME = "gsm8k-js";
//       static SETTINGS = { strict: false };
//       extract(task, text) { ... }
//       score(task, responses) { ... }
//     }
//     export const verification = exportPlugin(Gsm8k);
//
// The glue parses `configure`'s JSON into `this.settings` (unknown keys and wrong types are
// refused by name), checks what the plugin returns field by field, and turns every thrown
// value into the world's error with its message and where it was thrown, so a failure never
// becomes a bare trap. Inside a component, `console.log` writes to the plugin log (info).

import { ROLES } from "./types.js";

/** What every world's plugin has: a name for its errors and its settings' defaults. */
export class Plugin {
  // The plugin's name, at the start of its errors.
  static NAME = "plugin";
  // Every setting the plugin takes, with its default; `configure` refuses any other key,
  // and a value whose kind differs from its default's (boolean, number, string, array,
  // object; a default of null takes anything).
  static SETTINGS = {};

  constructor(settings) {
    this.settings = settings;
  }
}

export class Protocol extends Plugin {
  /** The prompts of turn `turn`: one per agent that speaks, `{agent, messages}`. */
  planTurn(task, turn, transcript) {
    throw new Error(`${this.constructor.name} does not implement planTurn`);
  }

  /** The team's answers after turn `turn`, most voted first (empty: no decision). */
  decide(task, turn, transcript) {
    throw new Error(`${this.constructor.name} does not implement decide`);
  }
}

export class Verifier extends Plugin {
  /** The answer a response gives, or undefined. */
  extract(task, text) {
    throw new Error(`${this.constructor.name} does not implement extract`);
  }

  /** One verdict `{answer, score, correct}` per response, in order. */
  score(task, responses) {
    throw new Error(`${this.constructor.name} does not implement score`);
  }
}

export class RewardShaper extends Plugin {
  /** One reward `{turn, agent, total, parts}` per utterance of the transcript. */
  shape(task, transcript) {
    throw new Error(`${this.constructor.name} does not implement shape`);
  }
}

/** An error whose message is the whole reason: shown as it is, with no location added. */
export class PluginFailure extends Error {
  constructor(message) {
    super(message);
    this.name = "PluginFailure";
  }
}

function kindOf(v) {
  if (v === null) return "null";
  if (Array.isArray(v)) return "array";
  return typeof v;
}

const KIND_WORDS = {
  boolean: "true or false",
  number: "a number",
  string: "a string",
  array: "an array",
  object: "an object",
};

/**
 * `configure`'s JSON as the plugin's settings: its defaults, overridden by the keys the
 * document gives; refuses unknown keys and wrong kinds, naming them.
 */
export function parseSettings(cls, document) {
  const name = cls.NAME;
  let given = {};
  if (document.trim() !== "") {
    try {
      given = JSON.parse(document);
    } catch (e) {
      throw new PluginFailure(`${name}: settings are not JSON: ${e.message}`);
    }
  }
  if (kindOf(given) !== "object") {
    throw new PluginFailure(`${name}: settings must be a JSON object, not ${kindOf(given)}`);
  }
  const defaults = cls.SETTINGS ?? {};
  const values = { ...defaults };
  for (const [key, value] of Object.entries(given)) {
    if (!Object.prototype.hasOwnProperty.call(defaults, key)) {
      const known = Object.keys(defaults).sort().join(", ") || "none";
      throw new PluginFailure(`${name}: unknown setting \`${key}\` (the settings: ${known})`);
    }
    const want = kindOf(defaults[key]);
    if (want !== "null" && value !== null && kindOf(value) !== want) {
      throw new PluginFailure(
        `${name}: setting \`${key}\` must be ${KIND_WORDS[want] ?? want}, got ${JSON.stringify(value)}`,
      );
    }
    values[key] = value;
  }
  return Object.freeze(values);
}

// A stack frame's file and line, as SpiderMonkey (`f@file:3:7`), QuickJS and V8
// (`at f (file:3:7)`, `at file:3:7`) write them.
const FRAME = /([^\s()@]+):(\d+):(\d+)\)?\s*$/;

/**
 * Where an error was thrown: the innermost frame of its stack with a file and line, as
 * `app.js:12`. In a component the stack names the build's bundle; its line table (written
 * by the build) gives the source file and line instead.
 */
export function whereThrown(e) {
  const stack = e && typeof e.stack === "string" ? e.stack : "";
  for (const line of stack.split("\n")) {
    const m = FRAME.exec(line);
    if (!m) continue;
    const file = m[1].slice(m[1].lastIndexOf("/") + 1);
    const at = Number(m[2]);
    const table = globalThis.__maporlLines;
    if (table && file === table.bundle) {
      // The last segment of the line that starts at or before the frame's column.
      const segments = table.lines[at - 1] ?? [];
      const column = Number(m[3]) - 1;
      let found = -1;
      for (let i = 0; i < segments.length; i += 3) {
        if (found < 0 || segments[i] <= column) found = i;
        if (segments[i] > column) break;
      }
      if (found < 0) continue;
      return `${table.sources[segments[found + 1]]}:${segments[found + 2]}`;
    }
    return `${file}:${at}`;
  }
  return undefined;
}

/** A thrown value as the world's error: the plugin, the error and where it was thrown. */
export function reason(cls, e) {
  if (e instanceof PluginFailure || (e && e.name === "PluginError")) return e.message;
  if (e instanceof Error || (e && typeof e.message === "string")) {
    const where = whereThrown(e);
    return `${cls.NAME}: ${e.name ?? "Error"}: ${e.message}${where ? ` (at ${where})` : ""}`;
  }
  let shown;
  try {
    shown = typeof e === "string" ? e : JSON.stringify(e) ?? String(e);
  } catch {
    shown = String(e);
  }
  return `${cls.NAME}: threw ${shown}`;
}

// The error a component returns: componentize-js and componentize-qjs both return the
// `payload` of a thrown object as a function's `result` error.
function worldError(message) {
  const e = new Error(message);
  e.payload = message;
  return e;
}

function wrong(cls, what, message) {
  return new PluginFailure(`${cls.NAME}: ${what} ${message}`);
}

function whole(cls, what, v) {
  if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) {
    throw wrong(cls, what, `must be a whole number in [0, 2^32), got ${show(v)}`);
  }
  return v;
}

function number(cls, what, v) {
  if (typeof v !== "number") throw wrong(cls, what, `must be a number, got ${show(v)}`);
  return v;
}

function string(cls, what, v) {
  if (typeof v !== "string") throw wrong(cls, what, `must be a string, got ${show(v)}`);
  return v;
}

function optionalString(cls, what, v) {
  return v === undefined || v === null ? undefined : string(cls, what, v);
}

function array(cls, what, v) {
  if (!Array.isArray(v)) throw wrong(cls, what, `must be an array, got ${show(v)}`);
  return v;
}

function show(v) {
  if (v === undefined) return "undefined";
  try {
    const s = JSON.stringify(v) ?? String(v);
    return s.length > 80 ? `${s.slice(0, 77)}...` : s;
  } catch {
    return String(v);
  }
}

function plan(cls, prompts) {
  return array(cls, "the plan", prompts).map((p, i) => ({
    agent: whole(cls, `prompt ${i}'s \`agent\``, p?.agent),
    messages: array(cls, `prompt ${i}'s \`messages\``, p?.messages).map((m, j) => {
      if (!ROLES.includes(m?.role)) {
        throw wrong(cls, `prompt ${i}'s message ${j}'s \`role\``, `must be one of ${ROLES.join(", ")}, got ${show(m?.role)}`);
      }
      return { role: m.role, content: string(cls, `prompt ${i}'s message ${j}'s \`content\``, m.content) };
    }),
  }));
}

function answers(cls, decided) {
  return array(cls, "the decision", decided).map((a, i) => string(cls, `decided answer ${i}`, a));
}

function verdicts(cls, list) {
  return array(cls, "the verdicts", list).map((v, i) => {
    if (typeof v?.correct !== "boolean") {
      throw wrong(cls, `verdict ${i}'s \`correct\``, `must be true or false, got ${show(v?.correct)}`);
    }
    return {
      answer: optionalString(cls, `verdict ${i}'s \`answer\``, v.answer),
      score: number(cls, `verdict ${i}'s \`score\``, v.score),
      correct: v.correct,
    };
  });
}

function rewards(cls, list) {
  return array(cls, "the rewards", list).map((r, i) => ({
    turn: whole(cls, `reward ${i}'s \`turn\``, r?.turn),
    agent: whole(cls, `reward ${i}'s \`agent\``, r?.agent),
    total: number(cls, `reward ${i}'s \`total\``, r?.total),
    parts: array(cls, `reward ${i}'s \`parts\``, r?.parts).map((part, j) => {
      const [name, value] = array(cls, `reward ${i}'s part ${j}`, part);
      return [string(cls, `reward ${i}'s part ${j}'s name`, name), number(cls, `reward ${i}'s part ${j}'s value`, value)];
    }),
  }));
}

function task(t) {
  return {
    id: t.id,
    kind: t.kind,
    question: t.question,
    reference: t.reference,
    fields: Array.from(t.fields, ([k, v]) => [k, v]),
  };
}

function transcript(t) {
  return {
    agents: t.agents,
    turns: t.turns,
    utterances: Array.from(t.utterances, (u) => ({
      turn: u.turn,
      agent: u.agent,
      text: u.text,
      answer: u.answer ?? undefined,
      score: u.score,
      correct: u.correct,
    })),
  };
}

/** The world a plugin class belongs to: "protocol", "verifier" or "reward-shaper". */
export function worldOf(cls) {
  if (cls.prototype instanceof Protocol) return "protocol";
  if (cls.prototype instanceof Verifier) return "verifier";
  if (cls.prototype instanceof RewardShaper) return "reward-shaper";
  throw new TypeError(`${cls.name} does not extend Protocol, Verifier or RewardShaper`);
}

/** The name a component exports its world's interface under. */
export const EXPORTS = {
  protocol: "collaboration",
  verifier: "verification",
  "reward-shaper": "rewardShaping",
};

/**
 * The object a component exports for `cls`'s world; export it under the world's name:
 * `export const verification = exportPlugin(MyVerifier)` (`collaboration` for a protocol,
 * `rewardShaping` for a reward shaper). Every call is also callable natively, as the host
 * makes it (errors are thrown as objects whose `payload` is the message).
 */
export function exportPlugin(cls) {
  const world = worldOf(cls);
  let plugin = null;
  const call = (fn) => {
    try {
      if (plugin === null) throw new PluginFailure(`${cls.NAME}: called before \`configure\``);
      return fn(plugin);
    } catch (e) {
      throw worldError(reason(cls, e));
    }
  };
  const configure = (settings) => {
    try {
      plugin = null;
      plugin = new cls(parseSettings(cls, settings));
    } catch (e) {
      throw worldError(reason(cls, e));
    }
  };
  switch (world) {
    case "protocol":
      return {
        configure,
        planTurn: (t, turn, tr) => call((p) => plan(cls, p.planTurn(task(t), turn, transcript(tr)))),
        decide: (t, turn, tr) => call((p) => answers(cls, p.decide(task(t), turn, transcript(tr)))),
      };
    case "verifier":
      return {
        configure,
        extract: (t, text) =>
          call((p) => optionalString(cls, "the extracted answer", p.extract(task(t), text))),
        score: (t, responses) => call((p) => verdicts(cls, p.score(task(t), Array.from(responses)))),
      };
    default:
      return {
        configure,
        shape: (t, tr) => call((p) => rewards(cls, p.shape(task(t), transcript(tr)))),
      };
  }
}
