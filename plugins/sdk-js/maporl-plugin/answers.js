// Reading answers out of responses, as the Rust SDK's `answers` module does.
//
// Positions and lengths are in code points (Python's string indices), not UTF-16 units.

import { trim } from "./text.js";

export const ASCII_WS = " \t\n\x0c\r";

const BOXED = "\\boxed";

/**
 * The content of the box whose `\boxed` starts at code point `pos`, if it is complete
 * (`undefined` otherwise). `pos` is an integer index in code points; a negative one counts
 * from the end, as Python's indices do (and an index before the start throws a RangeError
 * where Python raises an IndexError).
 * @param {string} text
 * @param {number} pos
 * @returns {string|undefined}
 */
export function boxAt(text, pos) {
  if (typeof pos !== "number") throw new TypeError("boxAt: pos must be an integer");
  const cps = Array.from(text);
  const n = cps.length;
  const at = (k) => {
    if (!Number.isInteger(k)) throw new TypeError("string indices must be integers, not 'float'");
    const m = k < 0 ? k + n : k;
    if (m < 0 || m >= n) throw new RangeError("string index out of range");
    return cps[m];
  };
  let i = pos + 6;
  while (i < n && ASCII_WS.includes(at(i))) i++;
  if (i >= n || at(i) !== "{") return undefined;
  const start = i + 1;
  let depth = 1;
  for (let j = start; j < n; j++) {
    const c = at(j);
    if (c === "{") {
      depth++;
    } else if (c === "}") {
      depth--;
      if (depth === 0) return pySlice(cps, start, j);
    }
  }
  return undefined;
}

/** Python's `s[start:stop]` on an array of code points. */
function pySlice(cps, start, stop) {
  const n = cps.length;
  const clamp = (k) => Math.min(Math.max(k < 0 ? k + n : k, 0), n);
  const a = clamp(start);
  const b = clamp(stop);
  return a < b ? cps.slice(a, b).join("") : "";
}

// `boxAt` for a UTF-16 position of `\boxed` (what `lastBoxed` finds): braces and ASCII
// whitespace are single code units and never surrogates, so scanning units finds the same
// box as scanning code points.
function boxAtUnit(text, at) {
  const n = text.length;
  let i = at + BOXED.length;
  while (i < n && ASCII_WS.includes(text[i])) i++;
  if (i >= n || text[i] !== "{") return undefined;
  const start = i + 1;
  let depth = 1;
  for (let j = start; j < n; j++) {
    const c = text[j];
    if (c === "{") {
      depth++;
    } else if (c === "}") {
      depth--;
      if (depth === 0) return text.slice(start, j);
    }
  }
  return undefined;
}

/**
 * The content of the last complete `\boxed{...}` (nested braces kept), or `undefined`.
 * @param {string} text
 * @returns {string|undefined}
 */
export function lastBoxed(text) {
  let end = text.length;
  while (end >= BOXED.length) {
    const pos = text.lastIndexOf(BOXED, end - BOXED.length);
    if (pos < 0) return undefined;
    const content = boxAtUnit(text, pos);
    if (content !== undefined) return content;
    end = pos;
  }
  return undefined;
}

const NUMERIC = "0123456789+-.";
export const I64_MIN = -(2n ** 63n);
export const I64_MAX = 2n ** 63n - 1n;

/**
 * The characters of `s` that can be part of a number (U+2212 read as '-').
 * @param {string} s
 * @returns {string}
 */
export function numericChars(s) {
  let out = "";
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (c === "\u2212") out += "-";
    else if (NUMERIC.includes(c)) out += c;
  }
  return out;
}

/**
 * Rust's `str::parse::<i64>` on the numeric characters of `s`: the integer, or `undefined`.
 *
 * The result is a Number when it is a safe integer (|n| <= 2**53 - 1, and 0 never -0), and a
 * BigInt otherwise (up to the i64 range; beyond it the result is `undefined`). The
 * representation is canonical, so two results are equal as Python's ints are exactly when
 * they are `===`, and `String(n)` gives Python's `str(n)`. Do not mix a result with Number
 * arithmetic without checking `typeof n === "bigint"`.
 *
 * One difference from the Python SDK on purpose: Python's `int()` refuses strings of more
 * than 4300 digits (ValueError, CPython's int_max_str_digits), while this reads them as Rust
 * does (leading zeros allowed, `undefined` when out of range).
 * @param {string} s
 * @returns {number|bigint|undefined}
 */
export function parseInteger(s) {
  const t = numericChars(s);
  const negative = t[0] === "-";
  const body = t[0] === "+" || t[0] === "-" ? t.slice(1) : t;
  if (body === "" || !/^[0-9]+$/.test(body)) return undefined;
  const digits = body.replace(/^0+(?=.)/, "");
  if (digits.length > 19) return undefined;
  const magnitude = BigInt(digits);
  const n = negative ? -magnitude : magnitude;
  if (n < I64_MIN || n > I64_MAX) return undefined;
  const max = BigInt(Number.MAX_SAFE_INTEGER);
  if (n >= -max && n <= max) return Number(n);
  return n;
}

/**
 * Removes LaTeX command names (`\text`, `\mathrm`, ...) so that `\text{Neutral}` reads as
 * `{Neutral}`.
 * @param {string} s
 * @returns {string}
 */
export function stripLatexCommands(s) {
  const isAsciiAlpha = (c) => (c >= "a" && c <= "z") || (c >= "A" && c <= "Z");
  let out = "";
  let i = 0;
  const n = s.length;
  while (i < n) {
    const c = s[i];
    i++;
    if (c === "\\" && i < n && isAsciiAlpha(s[i])) {
      while (i < n && isAsciiAlpha(s[i])) i++;
    } else {
      out += c;
    }
  }
  return out;
}

export const NLI_LABELS = Object.freeze(["entailment", "neutral", "contradiction"]);

// Python's `str.isalpha` per character: general categories Lu, Ll, Lt, Lm, Lo.
const LETTER = /^\p{L}$/u;

/**
 * entailment / neutral / contradiction from the last box (or the whole text), or `undefined`.
 * @param {string} text
 * @returns {string|undefined}
 */
export function nliLabel(text) {
  let answer = lastBoxed(text);
  if (answer === undefined) answer = text;
  let letters = "";
  for (const c of stripLatexCommands(answer)) if (LETTER.test(c)) letters += c;
  letters = letters.toLowerCase();
  return NLI_LABELS.includes(letters) ? letters : undefined;
}

/**
 * Reads an NLI reference: the label itself or its initial (`e`, `n`, `c`), any case.
 * @param {string} reference
 * @returns {string|undefined}
 */
export function nliReference(reference) {
  const r = trim(reference).toLowerCase();
  const oneChar = Array.from(r).length === 1;
  for (const label of NLI_LABELS) {
    if (label === r || (oneChar && label.startsWith(r))) return label;
  }
  return undefined;
}
