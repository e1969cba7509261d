// Write maporl plugins in JavaScript.
//
// A plugin is a class extending `Protocol`, `Verifier` or `RewardShaper`, exported with
// `exportPlugin` under its world's name, and built into a WebAssembly component with
// `node maporl-plugin/build.mjs` (componentize-js on SpiderMonkey, or QuickJS with
// `--engine quickjs`):
//
//     import { Verifier, exportPlugin, answers } from "./maporl-plugin/index.js";
//
//     class Exact extends Verifier {
//       static NAME = "exact";
//       static SETTINGS = {};
//       extract(task, text) { return answers.lastBoxed(text); }
//       score(task, responses) { ... }
//     }
//     export const verification = exportPlugin(Exact);
//
// Helpers, with the Rust SDK's meaning to the byte: `answers` (boxed answers, integers, NLI
// labels), `transcript` (look-ups, checks, `majority`), `prompts` (the debate's messages),
// `reward` (rewards from named parts, rounded as the host keeps them), `host` (`log`,
// `judge`, `limits`). No timers, no `await` of anything but the plugin's own promises: a
// call runs to its end synchronously.

export * as answers from "./answers.js";
export * as host from "./host.js";
export * as prompts from "./prompts.js";
export * as reward from "./reward.js";
export * as text from "./text.js";
export * as transcript from "./transcript.js";
export * as types from "./types.js";
export { PluginError } from "./transcript.js";
export { ASSISTANT, SYSTEM, USER } from "./types.js";
export {
  EXPORTS,
  Plugin,
  PluginFailure,
  Protocol,
  RewardShaper,
  Verifier,
  exportPlugin,
  parseSettings,
  reason,
  worldOf,
} from "./worlds.js";
