// TEST FIXTURE, not a plugin to use: a JavaScript verifier that misbehaves on request, read
// from the task's question (tests/js_plugins.rs):
//
// - `print`: two `console.log` lines (they must reach the plugin log), then behaves;
// - `throw`: reads a property of null (the error must name the TypeError and the line);
// - `throw-value`: throws a plain object, not an Error (the error must show it);
// - `wrong-shape`: returns a verdict whose score is a string (the error must name the field);
// - `random`: the answer is 8 random bytes in hex from `crypto.getRandomValues`, or from
//   `Math.random` where the engine has no `crypto` (the host seeds WASI randomness from the
//   run seed and the plugin's source);
// - anything else: the answer is the trimmed response, right when it equals the reference.

import { Verifier, exportPlugin } from "../../sdk-js/maporl-plugin/index.js";

const NAME = "hostile-js";

function randomHex(n) {
  const bytes = new Uint8Array(n);
  if (globalThis.crypto?.getRandomValues) globalThis.crypto.getRandomValues(bytes);
  else for (let i = 0; i < n; i++) bytes[i] = Math.floor(Math.random() * 256);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

class Hostile extends Verifier {
  static NAME = NAME;
  static SETTINGS = {};

  extract(task, text) {
    return text.trim() || undefined;
  }

  score(task, responses) {
    const q = task.question.trim();
    if (q === "print") {
      console.log("hello from JavaScript");
      console.log("a second line", responses.length);
    } else if (q === "throw") {
      const missing = null;
      return [{ answer: missing.answer, score: 1, correct: false }];
    } else if (q === "throw-value") {
      throw { code: 7 };
    } else if (q === "wrong-shape") {
      return responses.map(() => ({ answer: undefined, score: "1", correct: false }));
    } else if (q === "random") {
      return responses.map(() => ({ answer: randomHex(8), score: 0, correct: false }));
    }
    return responses.map((r) => {
      const right = r.trim() === task.reference;
      return { answer: this.extract(task, r), score: right ? 1 : 0, correct: right };
    });
  }
}

export const verification = exportPlugin(Hostile);
