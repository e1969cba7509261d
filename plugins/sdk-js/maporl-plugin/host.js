// The host's functions (`maporl:plugin/host`). Inside a component the build binds them to
// the host (`install`, called before the app module runs); run natively (a plugin's own
// tests) `log` writes to stderr, `judge` fails as a run without a learned verifier does,
// and `limits` gives the host's defaults.

let bound = null;

export const DEBUG = "debug";
export const INFO = "info";
export const WARN = "warn";
export const ERROR = "error";
const LEVELS = [DEBUG, INFO, WARN, ERROR];

/** True inside a component, false when run natively. */
export function inComponent() {
  return bound !== null;
}

/** Writes a line to the run's plugin log (bounded and escaped by the host). */
export function log(level, message) {
  if (!LEVELS.includes(level)) {
    throw new TypeError(`log level \`${level}\` is not one of ${LEVELS.join(", ")}`);
  }
  if (bound !== null) {
    bound.log(level, String(message));
  } else {
    nativeConsole.error(`[${level}] ${message}`);
  }
}

export const debug = (message) => log(DEBUG, message);
export const info = (message) => log(INFO, message);
export const warn = (message) => log(WARN, message);
export const error = (message) => log(ERROR, message);

export const NO_VERIFIER = "no verifier model configured";

/** The host's refusal of a `judge` call; its message is the host's. */
export class JudgeError extends Error {
  constructor(message) {
    super(message);
    this.name = "JudgeError";
  }
}

/**
 * The run's learned verifier: the probability that each response answers `question`
 * correctly. Throws `JudgeError` with the host's reason when it refuses or has none.
 */
export function judge(question, responses) {
  if (bound === null) {
    throw new JudgeError(`${NO_VERIFIER} (run natively, outside a component)`);
  }
  try {
    return Array.from(bound.judge(String(question), responses.map(String)), Number);
  } catch (e) {
    throw new JudgeError(e && e.payload !== undefined ? String(e.payload) : String(e));
  }
}

/** The bounds this plugin runs under in this run (contract 0.2.0); u64s as Numbers. */
export function limits() {
  if (bound === null) {
    return {
      fuel: 2_000_000_000,
      deadlineMs: 5_000,
      memoryBytes: 64 * 2 ** 20,
      maxResultBytes: 4096 * 2 ** 10,
      maxPromptBytes: 256 * 2 ** 10,
      maxAnswerBytes: 1024,
      maxAbsReward: 1000,
      maxRewardParts: 32,
      maxPartNameBytes: 64,
      judgeResponsesLeft: 1024,
    };
  }
  const l = bound.limits();
  const out = {};
  for (const [key, value] of Object.entries(l)) out[key] = Number(value);
  return out;
}

/** One `console.*` call's arguments as one line of text, as Node prints simple values. */
export function formatArgs(args) {
  return args
    .map((a) => {
      if (typeof a === "string") return a;
      if (a instanceof Error) return a.stack ? `${a.name}: ${a.message}\n${a.stack}` : `${a.name}: ${a.message}`;
      if (a === undefined || typeof a === "function" || typeof a === "symbol" || typeof a === "bigint") {
        return String(a);
      }
      try {
        return JSON.stringify(a) ?? String(a);
      } catch {
        return String(a);
      }
    })
    .join(" ");
}

const nativeConsole = globalThis.console;

/**
 * Binds the host's interface (the component's import of `maporl:plugin/host`) and routes
 * `console.*` to the plugin log: `debug` at debug, `log` and `info` at info, `warn` at
 * warn, `error` at error, one log line per line of text. Called by the build's entry
 * module, before the app's module runs.
 */
export function install(host) {
  bound = host;
  const to = (level) => (...args) => {
    for (const line of formatArgs(args).split("\n")) bound.log(level, line);
  };
  if (globalThis.crypto === undefined) seedMathRandom();
  globalThis.console = {
    debug: to(DEBUG),
    log: to(INFO),
    info: to(INFO),
    warn: to(WARN),
    error: to(ERROR),
    trace: to(DEBUG),
  };
}

/**
 * QuickJS has no source of randomness from the host: its `Math.random` state is whatever
 * the build's snapshot holds, different at every build. There the SDK's build writes a
 * seed (the source's sha256) into the bundle, and `Math.random` becomes a generator
 * (sfc32) started from it at an instance's first draw: the same sequence in every fresh
 * instance of the same source, whichever build. (SpiderMonkey draws from WASI randomness,
 * which the host seeds from the run seed and the plugin's source.)
 */
function seedMathRandom() {
  const unseeded = Math.random;
  let next = null;
  Math.random = () => {
    if (next === null) {
      const hex = globalThis.__maporlRandomSeed;
      if (typeof hex !== "string") return unseeded();
      next = sfc32(...[0, 8, 16, 24].map((i) => parseInt(hex.slice(i, i + 8), 16) >>> 0));
      for (let i = 0; i < 16; i++) next();
    }
    // 53 random bits, as a number in [0, 1).
    return ((next() >>> 5) * 67108864 + (next() >>> 6)) / 9007199254740992;
  };
}

function sfc32(a, b, c, d) {
  return () => {
    const t = (((a + b) >>> 0) + d) >>> 0;
    d = (d + 1) >>> 0;
    a = b ^ (b >>> 9);
    b = (c + (c << 3)) >>> 0;
    c = (c << 21) | (c >>> 11);
    c = (c + t) >>> 0;
    return t;
  };
}
