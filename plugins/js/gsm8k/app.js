// A GSM8K verifier in JavaScript: the answer is the integer in the last `\boxed{}`; it is
// right when it equals the task's integer reference. The same verdicts as the Rust
// reference `gsm8k` with its default settings (tests/js_plugins.rs diffs them).
//
//     node ../../sdk-js/maporl-plugin/build.mjs app.js --world verifier -o gsm8k.wasm

import { PluginError, Verifier, exportPlugin } from "../../sdk-js/maporl-plugin/index.js";
import { lastBoxed, parseInteger } from "../../sdk-js/maporl-plugin/answers.js";

const NAME = "gsm8k-js";

function extract(text) {
  const boxed = lastBoxed(text);
  return boxed === undefined ? undefined : parseInteger(boxed);
}

class Gsm8k extends Verifier {
  static NAME = NAME;
  static SETTINGS = {};

  extract(task, text) {
    const n = extract(text);
    return n === undefined ? undefined : String(n);
  }

  score(task, responses) {
    const gold = parseInteger(task.reference);
    if (gold === undefined) {
      throw new PluginError(
        `${NAME}: task \`${task.id}\`: the reference \`${task.reference}\` is not an integer; ` +
          "this verifier needs integer answers (use the exact-match verifier for other tasks)",
      );
    }
    return responses.map((text) => {
      const n = extract(text);
      const right = n !== undefined && n === gold;
      return { answer: n === undefined ? undefined : String(n), score: right ? 1 : 0, correct: right };
    });
  }
}

export const verification = exportPlugin(Gsm8k);
