// Text operations with Rust's meaning, so that a JavaScript plugin gives the bytes the Rust
// SDK gives: Rust trims and splits on Unicode `White_Space`, which is neither JavaScript's
// `String.prototype.trim` set (that also takes U+FEFF and not U+0085) nor Python's
// `str.isspace` (that also takes U+001C..U+001F).
//
// Also Python's float formatting (`repr(x)`, `format(x, ".Nf")`), so that text that the
// Python SDK formats from a number reads the same here.

export const WHITE_SPACE =
  "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008" +
  "\u2009\u200a\u2028\u2029\u202f\u205f\u3000";
const WS = new Set(WHITE_SPACE);

// Every White_Space character is in the BMP and none is a surrogate, so scanning UTF-16 code
// units below finds the same boundaries as scanning code points.

/** Rust's `str::trim`. */
export function trim(s) {
  let start = 0;
  let end = s.length;
  while (start < end && WS.has(s[start])) start++;
  while (end > start && WS.has(s[end - 1])) end--;
  return s.slice(start, end);
}

/** Rust's `char::is_whitespace` (false for anything but one White_Space character). */
export function isWhitespace(c) {
  return WS.has(c);
}

/** Rust's `str::split_whitespace`. */
export function splitWhitespace(s) {
  const words = [];
  let start = -1;
  for (let i = 0; i < s.length; i++) {
    if (WS.has(s[i])) {
      if (start >= 0) {
        words.push(s.slice(start, i));
        start = -1;
      }
    } else if (start < 0) {
      start = i;
    }
  }
  if (start >= 0) words.push(s.slice(start));
  return words;
}

// ---------------------------------------------------------------------------------------------
// Python's float formatting (no counterpart in text.py: these are Python built-ins).

/** `x` (a finite Number) as `[negative, mantissa, exponent]`: |x| = mantissa * 2**exponent. */
function decompose(x) {
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, x);
  const hi = view.getUint32(0);
  const lo = view.getUint32(4);
  const negative = hi >>> 31 === 1;
  const biased = (hi >>> 20) & 0x7ff;
  const fraction = (BigInt(hi & 0xfffff) << 32n) | BigInt(lo);
  if (biased === 0) return [negative, fraction, -1074];
  return [negative, fraction | (1n << 52n), biased - 1075];
}

/**
 * Python's `format(x, f".{digits}f")` (also `f"{x:.3f}"`): the exact binary value rounded
 * half to even, a sign kept for negative zero, `nan` / `inf` / `-inf`.
 */
export function pyFormatFixed(x, digits) {
  x = Number(x);
  if (Number.isNaN(x)) return "nan";
  if (x === Infinity) return "inf";
  if (x === -Infinity) return "-inf";
  const [negative, mantissa, exponent] = decompose(x);
  const scale = 10n ** BigInt(digits);
  let q;
  if (exponent >= 0) {
    q = (mantissa * scale) << BigInt(exponent);
  } else {
    const num = mantissa * scale;
    const den = 1n << BigInt(-exponent);
    q = num / den;
    const twice = 2n * (num - q * den);
    if (twice > den || (twice === den && (q & 1n) === 1n)) q += 1n;
  }
  let s = q.toString();
  if (digits > 0) {
    if (s.length <= digits) s = "0".repeat(digits + 1 - s.length) + s;
    s = `${s.slice(0, s.length - digits)}.${s.slice(s.length - digits)}`;
  }
  return negative ? `-${s}` : s;
}

/** The shortest round-trip digits of |x| (finite, non-zero) and its decimal point position. */
function shortestDigits(x) {
  const s = String(Math.abs(x));
  let mantissa = s;
  let exp = 0;
  const e = s.indexOf("e");
  if (e >= 0) {
    mantissa = s.slice(0, e);
    exp = Number(s.slice(e + 1));
  }
  const dot = mantissa.indexOf(".");
  const intDigits = dot >= 0 ? dot : mantissa.length;
  let digits = mantissa.replace(".", "");
  const lead = digits.length - digits.replace(/^0+/, "").length;
  digits = digits.slice(lead).replace(/0+$/, "");
  // value = 0.DIGITS * 10**point
  return [digits, intDigits - lead + exp];
}

/**
 * Python's `repr(x)` (and `str(x)`) of a float: `1.0`, `0.1`, `1e-05`, `1e+16`,
 * `0.30000000000000004`, `-0.0`, `nan`, `inf`. (Python formats an `int` as its digits; pass
 * a Number that Python holds as a float.)
 */
export function pyFloatRepr(x) {
  x = Number(x);
  if (Number.isNaN(x)) return "nan";
  if (x === Infinity) return "inf";
  if (x === -Infinity) return "-inf";
  const sign = x < 0 || Object.is(x, -0) ? "-" : "";
  if (x === 0) return `${sign}0.0`;
  const [digits, point] = shortestDigits(x);
  let body;
  if (point > -4 && point <= 16) {
    if (point <= 0) body = `0.${"0".repeat(-point)}${digits}`;
    else if (point >= digits.length) body = `${digits}${"0".repeat(point - digits.length)}.0`;
    else body = `${digits.slice(0, point)}.${digits.slice(point)}`;
  } else {
    const exp = point - 1;
    const mant = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    const mag = String(Math.abs(exp)).padStart(2, "0");
    body = `${mant}e${exp < 0 ? "-" : "+"}${mag}`;
  }
  return sign + body;
}
