// The JavaScript SDK's pure helpers (text, answers, transcript, prompts, reward, types): unit
// tests, then a differential test against the Python SDK (test/python_oracle.py, run once
// with python3 over every generated case).
//
//     node --test plugins/sdk-js/test/

import { spawnSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";
import { describe, it } from "node:test";

import * as answers from "../maporl-plugin/answers.js";
import * as prompts from "../maporl-plugin/prompts.js";
import * as reward from "../maporl-plugin/reward.js";
import * as text from "../maporl-plugin/text.js";
import * as transcript from "../maporl-plugin/transcript.js";
import * as types from "../maporl-plugin/types.js";

const HERE = dirname(fileURLToPath(import.meta.url));
const { task, utterance, chatMessage } = types;
const tr = types.transcript;

// ---------------------------------------------------------------------------------------------
// Unit tests

describe("text", () => {
  it("trims and splits on Rust's White_Space only", () => {
    assert.equal(text.trim("\x1c a \u2003"), "\x1c a");
    assert.equal(text.trim("\ufeffa\ufeff"), "\ufeffa\ufeff");
    assert.equal(text.trim("\x85\u3000 a b\u2029\n"), "a b");
    assert.equal(text.trim(" \t "), "");
    assert.deepEqual(text.splitWhitespace("a\x1fb c\u00a0d"), ["a\x1fb", "c", "d"]);
    assert.deepEqual(text.splitWhitespace("  "), []);
    assert.deepEqual(text.splitWhitespace("😀 x\u200by"), ["😀", "x\u200by"]);
    assert.equal(text.isWhitespace("\u0085"), true);
    assert.equal(text.isWhitespace("\u200b"), false);
    assert.equal(text.isWhitespace("  "), false);
    assert.equal(text.isWhitespace(""), false);
  });

  it("formats floats as Python does", () => {
    assert.equal(text.pyFormatFixed(0.0625, 3), "0.062");
    assert.equal(text.pyFormatFixed(0.1875, 3), "0.188");
    assert.equal(text.pyFormatFixed(-0, 3), "-0.000");
    assert.equal(text.pyFormatFixed(-1e-9, 3), "-0.000");
    assert.equal(text.pyFormatFixed(1e22, 3), "10000000000000000000000.000");
    assert.equal(text.pyFormatFixed(2.5, 0), "2");
    assert.equal(text.pyFormatFixed(NaN, 3), "nan");
    assert.equal(text.pyFormatFixed(-Infinity, 3), "-inf");
    assert.equal(text.pyFloatRepr(0.1), "0.1");
    assert.equal(text.pyFloatRepr(1), "1.0");
    assert.equal(text.pyFloatRepr(0.1 + 0.2), "0.30000000000000004");
    assert.equal(text.pyFloatRepr(1e-5), "1e-05");
    assert.equal(text.pyFloatRepr(0.0001), "0.0001");
    assert.equal(text.pyFloatRepr(1e16), "1e+16");
    assert.equal(text.pyFloatRepr(1e15), "1000000000000000.0");
    assert.equal(text.pyFloatRepr(-1.5e-7), "-1.5e-07");
    assert.equal(text.pyFloatRepr(5e-324), "5e-324");
    assert.equal(text.pyFloatRepr(-0), "-0.0");
    assert.equal(text.pyFloatRepr(Infinity), "inf");
  });
});

describe("answers", () => {
  it("reads the last complete box", () => {
    assert.equal(answers.lastBoxed("\\boxed{1} \\boxed{\\frac{1}{2}} \\boxed{3"), "\\frac{1}{2}");
    assert.equal(answers.lastBoxed("\\boxed \n{ 7 }"), " 7 ");
    assert.equal(answers.lastBoxed("\\boxed\x0b{7}"), undefined);
    assert.equal(answers.lastBoxed("\\fbox{7}"), undefined);
    assert.equal(answers.lastBoxed("\\boxed{a}} \\boxed{b"), "a");
    assert.equal(answers.lastBoxed(""), undefined);
  });

  it("finds a box by code point position", () => {
    assert.equal(answers.boxAt("😀\\boxed{x}", 1), "x");
    assert.equal(answers.boxAt("😀\\boxed{x}", 2), undefined);
    assert.equal(answers.boxAt("ab\\boxed{x}", -9), "x");
    assert.throws(() => answers.boxAt("ab", -20), RangeError);
    assert.throws(() => answers.boxAt("\\boxed{x}", 0.5), TypeError);
    assert.equal(answers.boxAt("ab", 0.5), undefined);
  });

  it("parses integers as Rust's i64 parse, canonically", () => {
    assert.equal(answers.parseInteger("\u22127"), -7);
    assert.equal(answers.parseInteger("$1,234"), 1234);
    assert.equal(answers.parseInteger("3.5"), undefined);
    assert.equal(answers.parseInteger("-"), undefined);
    assert.ok(Object.is(answers.parseInteger("-0"), 0));
    assert.equal(answers.parseInteger("9007199254740991"), Number.MAX_SAFE_INTEGER);
    assert.equal(answers.parseInteger("9007199254740992"), 9007199254740992n);
    assert.equal(answers.parseInteger("-9223372036854775808"), -(2n ** 63n));
    assert.equal(answers.parseInteger("9223372036854775808"), undefined);
    assert.equal(answers.parseInteger("99999999999999999999"), undefined);
    assert.equal(answers.parseInteger(`${"0".repeat(5000)}42`), 42);
    assert.equal(answers.parseInteger("1".repeat(5000)), undefined);
    // Equal as Python's ints are exactly when ===.
    assert.ok(answers.parseInteger("9,007,199,254,740,993") === answers.parseInteger("+09007199254740993"));
  });

  it("reads NLI labels and references", () => {
    assert.equal(answers.nliLabel("so \\boxed{\\text{Neutral}}"), "neutral");
    assert.equal(answers.nliLabel("not entailment, so neutral"), undefined);
    assert.equal(answers.nliLabel(" Contradiction. "), "contradiction");
    assert.equal(answers.nliLabel("\\boxed{neutralé}"), undefined);
    assert.equal(answers.nliReference(" E "), "entailment");
    assert.equal(answers.nliReference("n"), "neutral");
    assert.equal(answers.nliReference("x"), undefined);
    assert.equal(answers.nliReference(""), undefined);
    assert.equal(answers.stripLatexCommands("\\text{A}\\ \\1"), "{A}\\ \\1");
    assert.equal(answers.numericChars("a\u2212b1.2,+"), "-1.2+");
  });
});

describe("transcript", () => {
  const t = tr(2, 3, [
    utterance(1, 0, "a", "7", 1),
    utterance(1, 1, "b", undefined, 0.5),
    utterance(2, 0, "c", "8", 0.25),
  ]);

  it("looks up utterances", () => {
    assert.equal(transcript.find(t, 1, 1).text, "b");
    assert.equal(transcript.find(t, 2, 1), undefined);
    assert.deepEqual(transcript.atTurn(t, 1).map((u) => u.text), ["a", "b"]);
    assert.equal(transcript.lastTurn(t), 2);
    assert.equal(transcript.lastTurn(tr(1, 1)), undefined);
    assert.equal(transcript.latest(t, 1, 3).text, "b");
    assert.equal(transcript.latest(t, 0, 3).text, "c");
    assert.equal(transcript.meanScore(t, 1), 0.75);
    assert.equal(transcript.meanScore(t, 3), undefined);
  });

  it("checks what the host promises", () => {
    assert.doesNotThrow(() => transcript.check("p", t));
    const fails = (x, message) =>
      assert.throws(() => transcript.check("p", x), (e) => {
        assert.ok(e instanceof transcript.PluginError);
        assert.ok(e instanceof Error);
        assert.equal(e.name, "PluginError");
        assert.equal(e.message, message);
        return true;
      });
    fails(tr(0, 1), "p: the transcript has no agents (agents = 0)");
    fails(tr(2, 1, [utterance(0, 0, "x")]), "p: utterance at turn 0");
    fails(tr(2, 1, [utterance(1, 2, "x")]), "p: agent 2 out of range (the team has 2)");
    fails(tr(2, 1, [utterance(1, 1, "x"), utterance(1, 1, "y")]), "p: two utterances of agent 1 at turn 1");
    assert.throws(() => transcript.checkTurn("p", 0), { name: "PluginError", message: "p: turns are 1-based, got turn 0" });
    assert.doesNotThrow(() => transcript.checkTurn("p", 1));
  });

  it("votes with the paper's tie rule, sorted by code point", () => {
    assert.deepEqual(transcript.majority(["7", undefined, "8", "7"]), ["7"]);
    assert.deepEqual(transcript.majority([null, null, "7"]), []);
    assert.deepEqual(transcript.majority([null, "3"]), ["3"]);
    assert.deepEqual(transcript.majority(["9", "10"]), ["10", "9"]);
    assert.deepEqual(transcript.majority([]), []);
    assert.deepEqual(transcript.majority(["😀", "\uff01"]), ["\uff01", "😀"]);
    assert.deepEqual(transcript.majority(new Set(["b", "a"])), ["a", "b"]);
  });
});

describe("prompts", () => {
  const gsm = task("t1", " GSM8K ", " What is 2+2? ");
  const nli = task("t2", "anli", "q", "e", [["premise", " P "], ["hypothesis", "H"]]);

  it("builds the first-turn prompt per task kind", () => {
    assert.equal(prompts.taskKind(gsm), prompts.NUMERIC);
    assert.equal(prompts.taskKind(task("x", "gsm8\u212a", "")), prompts.NUMERIC);
    assert.equal(prompts.taskKind(nli), prompts.NLI);
    assert.equal(prompts.taskKind(task("x", "trivia", "")), prompts.GENERIC);
    assert.equal(prompts.field(nli, "premise"), "P");
    assert.equal(prompts.field(task("x", "anli", "", "", [["a", " "], ["a", "b"]]), "a"), undefined);
    assert.equal(
      prompts.firstTurnPrompt(gsm),
      "Question: What is 2+2?\nProvide a reasoning for your solution. At the end, write the answer as `Answer: \\boxed{N}` where N is an integer.",
    );
    assert.ok(prompts.firstTurnPrompt(nli).startsWith("Premise: P\nHypothesis: H\nDoes the premise"));
  });

  it("notes scores and picks peers", () => {
    assert.equal(
      prompts.scoreNote(0.0625),
      "Reward: 0.062 out of 1.0, which means the verifier thinks this answer is likely incorrect.",
    );
    assert.ok(prompts.scoreNote(0.5).includes("0.500 out of 1.0") && prompts.scoreNote(0.5).endsWith("likely correct."));
    assert.equal(prompts.agentLabel(0), "Agent 1");
    assert.deepEqual(prompts.peersOf([0, 1, 2, 3], 2, undefined), [3, 0, 1]);
    assert.deepEqual(prompts.peersOf([0, 1, 2, 3], 2, 1), [3]);
    assert.deepEqual(prompts.peersOf([0, 1, 2], 5, null), []);
    assert.deepEqual(prompts.systemMessage("  "), []);
    assert.deepEqual(prompts.systemMessage("S"), [chatMessage("system", "S")]);
    assert.equal(prompts.renderShown([["A", " x ", undefined], ["B", "y", null]]), "A: x\n\nB: y");
  });

  it("builds the debate's conversation", () => {
    const t = tr(2, 2, [utterance(1, 0, "mine", "4", 1), utterance(1, 1, " theirs ", "5", 0)]);
    const m = prompts.debateMessages("p", gsm, t, 0, 2, [0, 1], { showScores: true, system: "S" });
    assert.deepEqual(m.map((x) => x.role), ["system", "user", "assistant", "user"]);
    assert.equal(m[2].content, "mine");
    assert.ok(m[3].content.startsWith("These are the other agents' answers from the previous turn:\n\nAgent 2: theirs\nReward: 0.000 out of 1.0"));
    const alone = prompts.debateMessages("p", gsm, t, 0, 2, [0, 1], { peers: 0 });
    assert.ok(alone[2].content.startsWith(prompts.REVISE_ALONE));
    assert.throws(() => prompts.debateMessages("p", gsm, t, 0, 3, [0, 1]), {
      name: "PluginError",
      message:
        "p: task `t1`: agent 0 has no utterance at turn 2, so its turn-3 conversation cannot be built (the transcript does not follow this protocol)",
    });
  });
});

describe("reward and types", () => {
  it("rounds parts to f32 and sums them as f32 from -0", () => {
    const r = reward.reward(1, 0, [["a", 0.1], ["b", 0.2]]);
    assert.deepEqual(r.parts, [["a", Math.fround(0.1)], ["b", Math.fround(0.2)]]);
    assert.equal(r.total, Math.fround(Math.fround(0.1) + Math.fround(0.2)));
    assert.notEqual(r.total, 0.1 + 0.2);
    assert.ok(Object.is(reward.reward(1, 0, [["z", -0]]).total, -0));
    assert.ok(Object.is(reward.reward(1, 0, []).total, -0));
    assert.equal(reward.f32(1e39), Infinity);
  });

  it("makes plain records", () => {
    assert.deepEqual(types.ROLES, ["system", "user", "assistant"]);
    assert.deepEqual(task("i", "k", "q"), { id: "i", kind: "k", question: "q", reference: "", fields: [] });
    assert.deepEqual(utterance(1, 0, "t"), { turn: 1, agent: 0, text: "t", answer: undefined, score: 0, correct: false });
    assert.deepEqual(tr(2, 3), { agents: 2, turns: 3, utterances: [] });
    assert.deepEqual(types.prompt(0, []), { agent: 0, messages: [] });
    assert.deepEqual(types.verdict(undefined, 1, true), { answer: undefined, score: 1, correct: true });
    assert.deepEqual(types.reward(1, 0, 2, [["a", 2]]), { turn: 1, agent: 0, total: 2, parts: [["a", 2]] });
  });
});

// ---------------------------------------------------------------------------------------------
// Differential test against the Python SDK

// Python name -> the JavaScript function (keyword arguments arrive as the last argument).
const JS = {
  "text.trim": text.trim,
  "text.is_whitespace": text.isWhitespace,
  "text.split_whitespace": text.splitWhitespace,
  "text.WHITE_SPACE": text.WHITE_SPACE,
  "builtin.repr_float": text.pyFloatRepr,
  "builtin.format_fixed": text.pyFormatFixed,
  "answers.box_at": answers.boxAt,
  "answers.last_boxed": answers.lastBoxed,
  "answers.numeric_chars": answers.numericChars,
  "answers.parse_integer": answers.parseInteger,
  "answers.strip_latex_commands": answers.stripLatexCommands,
  "answers.nli_label": answers.nliLabel,
  "answers.nli_reference": answers.nliReference,
  "answers.ASCII_WS": answers.ASCII_WS,
  "answers.NLI_LABELS": answers.NLI_LABELS,
  "answers.I64_MIN": answers.I64_MIN,
  "answers.I64_MAX": answers.I64_MAX,
  "transcript.check": transcript.check,
  "transcript.check_turn": transcript.checkTurn,
  "transcript.find": transcript.find,
  "transcript.at_turn": transcript.atTurn,
  "transcript.last_turn": transcript.lastTurn,
  "transcript.latest": transcript.latest,
  "transcript.mean_score": transcript.meanScore,
  "transcript.majority": transcript.majority,
  "transcript.PluginError": (m) => new transcript.PluginError(m),
  "prompts.task_kind": prompts.taskKind,
  "prompts.field": prompts.field,
  "prompts.question_block": prompts.questionBlock,
  "prompts.first_turn_prompt": prompts.firstTurnPrompt,
  "prompts.agent_label": prompts.agentLabel,
  "prompts.score_note": prompts.scoreNote,
  "prompts.render_shown": prompts.renderShown,
  "prompts.followup_message": prompts.followupMessage,
  "prompts.system_message": prompts.systemMessage,
  "prompts.peers_of": prompts.peersOf,
  "prompts.debate_messages": (plugin, t, x, agent, turn, participants, kw = {}) =>
    prompts.debateMessages(plugin, t, x, agent, turn, participants, {
      peers: kw.peers,
      showScores: kw.show_scores,
      system: kw.system,
    }),
  "prompts.NUMERIC": prompts.NUMERIC,
  "prompts.NLI": prompts.NLI,
  "prompts.GENERIC": prompts.GENERIC,
  "prompts.INSTRUCTION": prompts.INSTRUCTION,
  "prompts.REVISE_WITH_PEERS": prompts.REVISE_WITH_PEERS,
  "prompts.REVISE_ALONE": prompts.REVISE_ALONE,
  "reward.f32": reward.f32,
  "reward.reward": reward.reward,
  "types.Task": types.task,
  "types.Utterance": types.utterance,
  "types.Transcript": types.transcript,
  "types.ChatMessage": types.chatMessage,
  "types.Prompt": types.prompt,
  "types.Verdict": types.verdict,
  "types.Reward": types.reward,
  "types.SYSTEM": types.SYSTEM,
  "types.USER": types.USER,
  "types.ASSISTANT": types.ASSISTANT,
  "types.ROLES": types.ROLES,
};

// Exports with no Python counterpart of their own, tested above and through others.
const JS_ONLY = new Set(["transcript.compareCodePoints"]);
// Exports called through an adapter in JS above.
const ADAPTED = { "prompts.debateMessages": "prompts.debate_messages", "transcript.PluginError": "transcript.PluginError" };

// A seeded generator (mulberry32).
function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (lo, hi) => lo + Math.floor(next() * (hi - lo + 1));
  const pick = (xs) => xs[Math.floor(next() * xs.length)];
  const chance = (p) => next() < p;
  return { next, int, pick, chance };
}
const R = rng(20250207);

const TOKENS = [
  "\\boxed", "\\boxed ", "\\boxed{", "\\boxed\n{", "\\fbox{", "\\boxed\x0b{", "{", "{", "}", "}",
  " ", " ", "\t", "\n", "\x0b", "\x0c", "\r", "\x1c", "\x1f", "\x85", "\xa0", "\u1680", "\u2000",
  "\u200a", "\u200b", "\u2028", "\u202f", "\u205f", "\u3000", "\ufeff",
  "0", "1", "7", "9", "42", "007", "9223372036854775807", "9223372036854775808", "9007199254740993",
  "+", "-", ".", ",", "\u2212", "$", "%", "\\", "\\text", "\\mathrm{", "\\frac{1}{2}", "\\ ",
  "a", "Z", "e", "E", "n", "N", "c", "C", "\u212a", "é", "İ", "ß", "Σ", "ǅ", "\u0345", "ª",
  "😀", "𝟘", "𝐀", "\ud800", "\udc00", "\uff01",
  "entailment", "Neutral", "CONTRADICTION", "neutral", "Answer:", "gsm8k", "#",
];

function randomString(maxTokens = 12) {
  let s = "";
  const n = R.int(0, maxTokens);
  for (let i = 0; i < n; i++) s += R.pick(TOKENS);
  return s;
}

function randomDouble() {
  const view = new DataView(new ArrayBuffer(8));
  view.setUint32(0, Math.floor(R.next() * 2 ** 32));
  view.setUint32(4, Math.floor(R.next() * 2 ** 32));
  return view.getFloat64(0);
}

const SPECIAL_FLOATS = [
  0, -0, 1, -1, 0.5, 0.1, 0.2, 0.1 + 0.2, 1 / 3, 2 / 3, 0.0625, 0.1875, 0.3125, 0.4375, 0.5625, 0.9375,
  1.0625, 0.0005, 0.0015, 0.4995, 0.49949999999999994, 0.9995, 0.99949999, 1e-5, 1e-4, 1e-7, 1.5e-7,
  123456.789, 1e15, 1e16, 1e17, 1e21, 1e22, 1.7976931348623157e308, 5e-324, 2.2250738585072014e-308,
  9007199254740993, 2 ** 53, 2 ** 63, 3.4028234663852886e38, 3.4028235677973366e38, 3.4028235677973362e38,
  -3.4028235677973366e38, 1.401298464324817e-45, 7e-46, 1e-46, NaN, Infinity, -Infinity,
  Math.fround(0.1), Math.fround(0.7), Math.fround(1 / 3), -0.0005, -2.5, 2.5, 1234.5, 0.125, 0.375,
];

function randomFloat() {
  switch (R.int(0, 5)) {
    case 0:
      return randomDouble();
    case 1:
      return R.pick(SPECIAL_FLOATS);
    case 2:
      return Math.fround(R.next() * 1.5 - 0.25);
    case 3:
      return R.int(-40, 40) / 16;
    case 4:
      return R.int(-20000, 20000) / 10000;
    default:
      return (R.next() - 0.5) * 10 ** R.int(-30, 30);
  }
}

function randomIntegerText() {
  const sign = R.pick(["", "", "+", "-", "\u2212", "--", "+-", " - "]);
  const special = [
    "9007199254740991", "9007199254740992", "9007199254740993", "9223372036854775807",
    "9223372036854775808", "9223372036854775806", "18446744073709551616", "0", "00", "000123",
    "0009223372036854775807", "12345678901234567890",
  ];
  let digits = R.chance(0.3) ? R.pick(special) : "";
  if (!digits) {
    const n = R.int(0, 22);
    for (let i = 0; i < n; i++) digits += String(R.int(0, 9));
  }
  if (R.chance(0.2)) digits = digits.replace(/(\d)(?=(\d{3})+$)/g, "$1,");
  const noise = R.chance(0.15) ? R.pick(["$", " ", ".", "x", "\u00a0", "e3", "\\!"]) : "";
  const at = R.int(0, digits.length);
  return R.pick(["", "$", "\\boxed{"]) + sign + digits.slice(0, at) + noise + digits.slice(at);
}

const KINDS = ["gsm8k", " GSM8K ", "arith", "Arith\u3000", "anli", "ANLI", "gsm8\u212a", "nli", "", "trivia", "\ufeffgsm8k", "\x1canli"];
const FIELD_NAMES = ["premise", "hypothesis", "Premise", "other"];

function randomTask() {
  const fields = [];
  const nf = R.int(0, 4);
  for (let i = 0; i < nf; i++) {
    fields.push([R.pick(FIELD_NAMES), R.pick(["", "  ", " A cat sleeps. ", "\u3000x\u2003", randomString(4)])]);
  }
  return task(`task-${R.int(0, 99)}`, R.pick(KINDS), R.pick([randomString(6), " How many? ", ""]), "", fields);
}

function randomUtterance(maxTurn, maxAgent) {
  return utterance(
    R.int(0, maxTurn),
    R.int(0, maxAgent),
    randomString(6),
    R.chance(0.3) ? undefined : R.pick(["4", "5", "neutral", "😀", "\uff01", ""]),
    randomFloat(),
    R.chance(0.5),
  );
}

function randomTranscript() {
  const agents = R.int(0, 4);
  const turns = R.int(1, 4);
  const n = R.int(0, 8);
  const us = [];
  for (let i = 0; i < n; i++) us.push(randomUtterance(turns, agents + 1));
  return tr(agents, turns, us);
}

// A transcript as a debate leaves it, with some utterances missing (and shuffled order).
function debateTranscript() {
  const agents = R.int(1, 4);
  const turns = R.int(1, 4);
  const us = [];
  for (let t = 1; t <= turns; t++) {
    for (let a = 0; a < agents; a++) {
      if (R.chance(0.9)) {
        us.push(utterance(t, a, R.pick([`answer ${t}.${a} \\boxed{${a}}`, ` spaced\u3000${t} `, randomString(5)]), `${a}`, R.pick([randomFloat(), Math.fround(R.next())]), R.chance(0.5)));
      }
    }
  }
  if (R.chance(0.3)) us.reverse();
  return tr(agents, turns, us);
}

function buildCases() {
  const cases = [];
  const add = (fn, args, kwargs) => cases.push(kwargs === undefined ? { fn, args } : { fn, args, kwargs });
  // A finite number beyond f32's range: Python's struct.pack raises there (see KNOWN).
  const overflows = (x) => Number.isFinite(x) && !Number.isFinite(Math.fround(x));

  // Constants and record constructors.
  for (const name of Object.keys(JS)) if (typeof JS[name] !== "function") add(name, []);
  add("types.Task", ["i", "k", "q"]);
  add("types.Task", ["i", "k", "q", "r", [["premise", "p"]]]);
  add("types.Utterance", [1, 0, "t"]);
  add("types.Utterance", [2, 1, "t", "a", 0.5, true]);
  add("types.Transcript", [2, 3]);
  add("types.Transcript", [1, 1, [utterance(1, 0, "x")]]);
  add("types.ChatMessage", ["user", "hi"]);
  add("types.Prompt", [0, [chatMessage("user", "hi")]]);
  add("types.Verdict", [null, 0, false]);
  add("types.Verdict", ["4", 1, true]);
  add("types.Reward", [1, 0, 0.5, [["a", 0.5]]]);
  add("transcript.PluginError", ["p: message"]);

  // Strings for the text and answer functions.
  const strings = [
    "", " ", "\\boxed", "\\boxed{", "\\boxed{}", "\\boxed{42}", "\\boxed {42}", "\\boxed\t\n\r\x0c {42}",
    "\\boxed\x0b{42}", "\\boxed\u00a0{4}", "\\boxed{\\frac{1}{2}}", "\\boxed{a{b}c", "\\boxed{1} \\boxed{2",
    "\\boxed{1} \\boxed{2}", "\\boxed{a}}", "\\boxed{{}}", "\\boxed{\\boxed{3}}", "\\boxed{\\boxed{3}",
    "\\boxedd{1}", "\\\\boxed{5}", "\\fbox{5}", "\\boxed{😀}", "😀\\boxed{1}😀", "\\boxed{5}\\boxed",
    "x\\boxed{\ud800}", "\\boxed{ -1,234 }", "\\boxed{\u22127}", "\\boxed{3.0}", "\\boxed{+5}", "\\boxed{--5}",
    "\\boxed{\\text{Neutral}}", "\\boxed{\\textbf{CONTRADICTION}}", "Entailment", " neutral. ",
    "not entailment, so neutral", "\\boxed{neutral\u0345}", "\\boxed{ent ail ment}", "\\boxed{e}",
    "\\boxed{neutral} \\boxed{wrong", "\\boxed{ENTAİLMENT}", "\\boxed{\u212aneutral}", "\\mathrm{neutral}",
    "\x1c a \u2003", "a\x1fb c\u00a0d", "\u3000\u2029\x85", "\ufeff x \ufeff", "a\u200bb", "𝟘𝟙", "1𝟘2",
    "\ud83d", "\ude00x", "e", "E", " N ", "c\u3000", "ç", "ent", "İ", "\u212a", "contradiction ",
    "9223372036854775807", "-9223372036854775808", "9223372036854775808", "-9223372036854775809",
    "9007199254740991", "9007199254740992", "-9007199254740993", "1,000,000", "$1,234.00", "+-3", "+",
    "-", "\u2212", "1e5", "0x1f", "٣", "１２", "00000000000000000000000000000042",
  ];
  for (let i = 0; i < 400; i++) strings.push(randomString());
  for (let i = 0; i < 200; i++) strings.push(randomIntegerText());

  for (const s of strings) {
    for (const fn of ["text.trim", "text.split_whitespace", "answers.last_boxed", "answers.numeric_chars",
      "answers.parse_integer", "answers.strip_latex_commands", "answers.nli_label", "answers.nli_reference"]) {
      add(fn, [s]);
    }
    add("text.is_whitespace", [s]);
    const cps = Array.from(s);
    const positions = new Set([0, R.int(-cps.length - 8, cps.length + 8)]);
    for (let i = 0; i < cps.length; i++) if (cps.slice(i, i + 6).join("") === "\\boxed") positions.add(i);
    for (const p of positions) add("answers.box_at", [s, p]);
  }
  for (const c of TOKENS) add("text.is_whitespace", [c]);
  for (let cp = 0; cp < 0x3010; cp++) {
    const c = String.fromCodePoint(cp);
    if (text.WHITE_SPACE.includes(c) || cp < 0x100 || (cp >= 0x2000 && cp < 0x2070) || cp === 0x3000) add("text.is_whitespace", [c]);
  }
  for (let i = -8; i < 8; i++) add("answers.box_at", ["ab \\boxed{x}", i]);
  add("answers.box_at", ["ab", -20]);
  add("answers.box_at", ["ab", 0.5]);
  add("answers.box_at", ["a😀\\boxed {😀}", 2]);

  // Floats: Python's repr and fixed formats, score notes, f32.
  const floats = [...SPECIAL_FLOATS];
  for (let i = 0; i < 400; i++) floats.push(randomFloat());
  for (const x of floats) {
    add("builtin.repr_float", [x]);
    add("builtin.format_fixed", [x, 3]);
    add("builtin.format_fixed", [x, R.pick([0, 1, 2, 6, 17])]);
    add("prompts.score_note", [x]);
    if (!overflows(x)) add("reward.f32", [x]);
  }

  // Rewards.
  const f32Safe = () => {
    const x = randomFloat();
    return Number.isFinite(x) && Math.abs(x) > 1e38 ? 1 : x;
  };
  for (let i = 0; i < 120; i++) {
    const parts = [];
    const n = R.int(0, 4);
    for (let j = 0; j < n; j++) parts.push([R.pick(["bonus", "verifier", "", "ü", "😀"]), R.chance(0.1) ? -0 : f32Safe()]);
    add("reward.reward", [R.int(1, 5), R.int(0, 3), parts]);
  }
  add("reward.reward", [1, 0, [["a", 3.4e38], ["b", -3.4e38]]]);
  add("reward.reward", [1, 0, [["a", -0], ["b", -0]]]);
  add("reward.reward", [1, 0, [["a", NaN], ["b", 1]]]);
  add("reward.reward", [1, 0, [["a", Infinity], ["b", -Infinity]]]);

  // Transcripts.
  const transcripts = [
    tr(0, 1),
    tr(1, 1),
    tr(2, 1, [utterance(0, 0, "x")]),
    tr(2, 1, [utterance(1, 2, "x")]),
    tr(2, 2, [utterance(1, 1, "x"), utterance(2, 1, "y"), utterance(1, 1, "z")]),
    tr(2, 2, [utterance(1, 5, "x"), utterance(0, 0, "y")]),
    tr(3, 2, [utterance(2, 0, "x", "1", 0.1), utterance(2, 1, "y", "2", 0.2), utterance(2, 2, "z", undefined, 0.3)]),
  ];
  for (let i = 0; i < 150; i++) transcripts.push(randomTranscript());
  for (const t of transcripts) {
    add("transcript.check", ["plug", t]);
    const turn = R.int(0, 5);
    const agent = R.int(0, 4);
    add("transcript.find", [t, turn, agent]);
    add("transcript.at_turn", [t, turn]);
    add("transcript.last_turn", [t]);
    add("transcript.latest", [t, agent, turn]);
    for (let k = 0; k <= t.turns; k++) add("transcript.mean_score", [t, k]);
  }
  for (const turn of [0, 1, 2, 7]) add("transcript.check_turn", ["my-plugin", turn]);

  // Votes.
  const votes = [
    [], [null], ["7", null, "8", "7"], [null, null, "7"], [null, "3"], ["9", "10"], ["8", "7"],
    ["😀", "\uff01"], ["\ud800", "😀", "\ue000"], ["b", "a", "b", "a", null, null], ["", null],
    ["é", "e\u0301"], ["Z", "a", "A", "z"],
  ];
  for (let i = 0; i < 150; i++) {
    const v = [];
    const n = R.int(0, 7);
    for (let j = 0; j < n; j++) v.push(R.chance(0.25) ? null : R.pick(["1", "2", "10", "😀", "\uff01", "\ud800", "a", "A", "", "ß"]));
    votes.push(v);
  }
  for (const v of votes) add("transcript.majority", [v]);

  // Prompts.
  const tasks = [
    task("t1", "gsm8k", " What is 2+2? "),
    task("t2", "anli", "Does it?", "e", [["premise", " A cat. "], ["hypothesis", "An animal."]]),
    task("t3", "anli", "fallback question ", "n", [["premise", "P"], ["hypothesis", "  "]]),
    task("t4", "ANLI", "", "", [["premise", "p1"], ["premise", "p2"], ["hypothesis", "h"]]),
    task("t5", "gsm8\u212a", "q"),
    task("t6", "trivia", "\u3000Who?\u2003"),
  ];
  for (let i = 0; i < 60; i++) tasks.push(randomTask());
  for (const t of tasks) {
    add("prompts.task_kind", [t]);
    for (const name of FIELD_NAMES) add("prompts.field", [t, name]);
    add("prompts.question_block", [t]);
    add("prompts.first_turn_prompt", [t]);
  }
  for (const a of [0, 1, 9, 41]) add("prompts.agent_label", [a]);
  for (let i = 0; i < 60; i++) {
    const shown = [];
    const n = R.int(0, 3);
    for (let j = 0; j < n; j++) shown.push([`Agent ${j + 1}`, randomString(5), R.chance(0.5) ? null : randomFloat()]);
    add("prompts.render_shown", [shown]);
    add("prompts.followup_message", [R.pick(tasks), shown]);
  }
  for (const s of [null, "", "  ", "\u3000\n", "\x1c", "You are helpful.", " sys "]) add("prompts.system_message", [s]);
  for (let i = 0; i < 80; i++) {
    const n = R.int(0, 5);
    const participants = [];
    for (let j = 0; j < n; j++) participants.push(R.int(0, 6));
    add("prompts.peers_of", [participants, R.int(0, 6), R.pick([null, 0, 1, 2, 3, 10, -1])]);
  }
  const debates = [debateTranscript(), debateTranscript(), tr(3, 3, [
    utterance(1, 0, "a0 \\boxed{1}", "1", 1), utterance(1, 1, "a1", "2", 0.0625), utterance(1, 2, "a2 ", undefined, 0.5),
    utterance(2, 0, "b0", "1", 0.4995), utterance(2, 2, "b2", "3", -0),
  ])];
  for (let i = 0; i < 40; i++) debates.push(debateTranscript());
  for (const d of debates) {
    add("transcript.check", ["debate", d]);
    add("transcript.last_turn", [d]);
    for (let k = 0; k <= d.turns + 1; k++) add("transcript.mean_score", [d, k]);
    for (let a = 0; a < d.agents; a++) add("transcript.latest", [d, a, R.int(0, d.turns + 1)]);
  }
  const systems = [null, "", " \n", "You are a careful solver.", " \u3000sys\u2003"];
  for (let i = 0; i < 400; i++) {
    const d = R.pick(debates);
    const all = Array.from({ length: d.agents }, (_, a) => a);
    const participants = R.chance(0.7) ? all : all.filter(() => R.chance(0.7)).reverse();
    const kwargs = {};
    if (R.chance(0.6)) kwargs.peers = R.pick([null, 0, 1, 2, 5]);
    if (R.chance(0.6)) kwargs.show_scores = R.chance(0.5);
    if (R.chance(0.5)) kwargs.system = R.pick(systems);
    add("prompts.debate_messages", [R.pick(["debate", "p"]), R.pick(tasks), d, R.int(-1, d.agents), R.int(0, d.turns + 1), participants], kwargs);
  }
  return cases;
}

// Values as the oracle writes them: numbers as {$n: hex bits | "nan" | "big:digits"},
// records as objects, undefined as null.
function numberKey(x) {
  if (Number.isNaN(x)) return "nan";
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, x);
  let hex = "";
  for (let i = 0; i < 8; i++) hex += view.getUint8(i).toString(16).padStart(2, "0");
  return hex;
}

function encode(v) {
  if (v === undefined || v === null) return null;
  if (typeof v === "boolean" || typeof v === "string") return v;
  if (typeof v === "number") return { $n: numberKey(v) };
  if (typeof v === "bigint") return { $n: `big:${v}` };
  if (Array.isArray(v)) return v.map(encode);
  if (v instanceof Error) return { $error: [v.name, v.message] };
  if (typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, encode(x)]));
  throw new TypeError(`cannot encode ${typeof v}`);
}

// Arguments as the oracle reads them.
function wire(v) {
  if (v === undefined || v === null) return null;
  if (typeof v === "number") {
    if (Number.isNaN(v)) return { $float: "nan" };
    if (v === Infinity) return { $float: "inf" };
    if (v === -Infinity) return { $float: "-inf" };
    if (Object.is(v, -0)) return { $float: "-0.0" };
    return v;
  }
  if (Array.isArray(v)) return v.map(wire);
  if (typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, wire(x)]));
  return v;
}

// Python exception names for the JavaScript errors that stand for them.
const ERROR_NAMES = { RangeError: "IndexError" };

function runJs(c) {
  const f = JS[c.fn];
  if (typeof f !== "function") return encode(f);
  try {
    return encode(c.kwargs === undefined ? f(...c.args) : f(...c.args, c.kwargs));
  } catch (e) {
    if (!(e instanceof Error)) throw e;
    return { $error: [ERROR_NAMES[e.name] ?? e.name, e.message] };
  }
}

function runPython(calls) {
  const oracle = join(HERE, "python_oracle.py");
  const r = spawnSync("python3", [oracle], {
    input: JSON.stringify(calls.map(wire)),
    encoding: "utf8",
    maxBuffer: 1 << 30,
  });
  if (r.error && r.error.code === "ENOENT") {
    throw new Error("python3 is not on PATH: the differential test needs it to run the Python SDK (test/python_oracle.py)");
  }
  if (r.error) throw r.error;
  if (r.status !== 0) throw new Error(`python_oracle.py exited with ${r.status}:\n${r.stderr}`);
  return JSON.parse(r.stdout);
}

// Differences from the Python SDK on purpose: the JavaScript helpers give the Rust SDK's
// result where CPython raises or (3.12+) sums differently. Such a case passes when the
// results are equal or when Python gives the named error.
const KNOWN = [
  // int() refuses more than 4300 digits (CPython's int_max_str_digits); Rust reads them.
  { fn: "answers.parse_integer", args: [`${"0".repeat(4400)}17`], pythonError: "ValueError" },
  { fn: "answers.parse_integer", args: ["9".repeat(5000)], pythonError: "ValueError" },
  // struct.pack("<f") refuses what rounds beyond f32; Rust's `as f32` gives infinity.
  { fn: "reward.f32", args: [1e39], pythonError: "OverflowError" },
  { fn: "reward.f32", args: [3.4028235677973366e38], pythonError: "OverflowError" },
  { fn: "reward.f32", args: [-1.7976931348623157e308], pythonError: "OverflowError" },
  { fn: "reward.reward", args: [1, 0, [["a", 3.4e38], ["b", 3.4e38]]], pythonError: "OverflowError" },
];

// CPython 3.12 made `sum` of floats compensated (Neumaier), which the Python SDK's
// `mean_score` inherits; the Rust SDK and this one add in order, as CPython 3.11 does.
function newerSum(version) {
  const [major, minor] = version.split(".").map(Number);
  return major > 3 || (major === 3 && minor >= 12);
}

describe("differential: the Python SDK gives the same results", () => {
  const cases = buildCases();
  const known = KNOWN.map((k) => ({ fn: k.fn, args: k.args }));
  // The oracle runs once, at the first test that needs it; without python3 every such test
  // fails with the reason.
  let results;
  const oracle = () => {
    if (results === undefined) {
      try {
        const out = runPython([{ fn: "builtin.python_version", args: [] }, ...cases, ...known]);
        assert.equal(out.length, 1 + cases.length + known.length);
        results = {
          pythonVersion: out[0],
          expected: out.slice(1, 1 + cases.length),
          knownExpected: out.slice(1 + cases.length),
        };
      } catch (e) {
        results = { error: e };
      }
    }
    if (results.error) throw results.error;
    return results;
  };

  it("covers every exported function and constant", () => {
    const used = new Set(cases.map((c) => c.fn));
    const byValue = new Map(Object.entries(JS).map(([k, v]) => [v, k]));
    const modules = { text, answers, transcript, prompts, reward, types };
    for (const [mod, ns] of Object.entries(modules)) {
      for (const [name, value] of Object.entries(ns)) {
        if (JS_ONLY.has(`${mod}.${name}`)) continue;
        const py = ADAPTED[`${mod}.${name}`] ?? byValue.get(value);
        assert.ok(py !== undefined, `${mod}.${name} has no Python counterpart in the differential test`);
        assert.ok(used.has(py), `${mod}.${name} (${py}) has no differential case`);
      }
    }
    assert.ok(cases.length > 5000, `only ${cases.length} cases`);
    assert.ok(new Set(cases.map((c) => c.fn)).size >= 50);
  });

  const groups = [...new Set(cases.map((c) => c.fn))];
  for (const fn of groups) {
    it(fn, () => {
      const { expected, pythonVersion } = oracle();
      let checked = 0;
      cases.forEach((c, i) => {
        if (c.fn !== fn) return;
        const got = runJs(c);
        if (fn === "transcript.mean_score" && newerSum(pythonVersion)) {
          // CPython 3.12+ adds floats with compensation; Rust (and this SDK) adds in order.
          const [t, turn] = c.args;
          const scores = t.utterances.filter((u) => u.turn === turn).map((u) => u.score);
          const plain = scores.length ? scores.reduce((s, x) => s + x, 0) / scores.length : undefined;
          assert.deepEqual(got, encode(plain));
          checked++;
          return;
        }
        assert.deepEqual(got, expected[i], `${fn}(${JSON.stringify(wire(c.args))}${c.kwargs ? `, ${JSON.stringify(wire(c.kwargs))}` : ""})`);
        checked++;
      });
      assert.ok(checked > 0);
    });
  }

  it("known differences: Rust's result where CPython raises", () => {
    const { knownExpected } = oracle();
    KNOWN.forEach((k, i) => {
      const py = knownExpected[i];
      const got = runJs(k);
      if (py && py.$error) assert.equal(py.$error[0], k.pythonError, JSON.stringify(py));
      else assert.deepEqual(got, py);
      assert.ok(!(got && got.$error), `JavaScript raised ${JSON.stringify(got)}`);
    });
  });
});
