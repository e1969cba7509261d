#!/usr/bin/env node
// `node maporl-plugin/build.mjs APP.js --world WORLD -o OUT.wasm [--engine quickjs]`: builds
// a JavaScript plugin into a WebAssembly component, against the contract this SDK ships
// (`wit/maporl.wit`) or `--wit DIR`.
//
// The app and everything it imports (this SDK, pure-JavaScript npm packages) is bundled
// into one module by rolldown, with a line table so that an error names the source file and
// line; the bundle is then componentized by componentize-js (SpiderMonkey, the default:
// built without `wasi:http`, which a plugin cannot use) or componentize-qjs (QuickJS,
// `--engine quickjs`: 8x smaller, faster to load and to call).
//
// Neither tool builds the same bytes twice, so the build records in the component, as a
// custom section `maporl:source`, the sha256 of what it was built from: the bundle, the
// contract, the world, the engine and its version. maporl seeds the plugin from that hash
// and resumes a run whose plugin was rebuilt from the same source.

import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const SOURCE_SECTION = "maporl:source";
export const WORLDS = { protocol: "collaboration", verifier: "verification", "reward-shaper": "rewardShaping" };
export const ENGINES = {
  spidermonkey: { package: "@bytecodealliance/componentize-js", bin: "componentize-js" },
  quickjs: { package: "componentize-qjs", bin: "componentize-qjs" },
};
const HERE = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
// The bundle's file name inside the component, which its stack traces show.
const BUNDLE = "maporl-plugin-bundle.js";

class BuildError extends Error {}

function fail(message) {
  throw new BuildError(`maporl-plugin build: ${message}`);
}

/** A package this build needs, with what to do when it is missing. */
function tool(name) {
  // Node's resolution from this file, by directory: a package's `exports` may hide its
  // package.json from `require.resolve`.
  for (const dir of require.resolve.paths(name) ?? []) {
    const manifest = path.join(dir, name, "package.json");
    if (fs.existsSync(manifest)) {
      return { dir: path.dirname(manifest), manifest: JSON.parse(fs.readFileSync(manifest, "utf8")) };
    }
  }
  {
    fail(
      `${name} is not installed beside this SDK (${HERE}): run \`npm install\` in the ` +
        `directory holding its package.json (in maporl's repository: \`npm ci --prefix plugins/sdk-js\`)`,
    );
  }
}

/** The files under `root` ending in `suffix`, as sorted `/`-separated relative paths. */
function files(root, suffix) {
  const found = [];
  const walk = (dir) => {
    for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
      if (entry.name.startsWith(".") || entry.name === "node_modules") continue;
      const full = path.join(dir, entry.name);
      if (entry.isDirectory()) walk(full);
      else if (entry.isFile() && entry.name.endsWith(suffix)) found.push(path.relative(root, full).split(path.sep).join("/"));
    }
  };
  walk(root);
  return found.sort();
}

/**
 * The sha256 of what a build reads: the world, the engine and its version, the contract's
 * `.wit` files and the bundle (every module the app imports, as rolldown prints it), each
 * as its label, length and bytes.
 */
export function sourceSha256({ world, engine, version, wit, bundle }) {
  const h = createHash("sha256");
  h.update(`maporl-plugin-js source 1\0world ${world}\0engine ${engine} ${version}\0`);
  const add = (label, data) => {
    h.update(`${label}\0${Buffer.byteLength(data)}\0`);
    h.update(data);
  };
  for (const rel of files(wit, ".wit")) add(`wit/${rel}`, fs.readFileSync(path.join(wit, rel)));
  add("bundle", bundle);
  return h.digest("hex");
}

function leb128(n) {
  const out = [];
  do {
    let b = n & 0x7f;
    n = Math.floor(n / 128);
    if (n) b |= 0x80;
    out.push(b);
  } while (n);
  return Buffer.from(out);
}

/** `component` with a custom section appended at its top level. */
export function withSection(component, name, contents) {
  if (!component.subarray(0, 4).equals(Buffer.from("\0asm", "latin1"))) {
    fail("the output is not a WebAssembly file");
  }
  const nameBytes = Buffer.from(name, "utf8");
  const payload = Buffer.concat([leb128(nameBytes.length), nameBytes, Buffer.from(contents)]);
  return Buffer.concat([component, Buffer.from([0]), leb128(payload.length), payload]);
}

const B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/**
 * A source map's mappings as one entry per generated line: the line's segments as a flat
 * array [column (0-based), source index, source line (1-based), ...].
 */
export function lineTable(mappings) {
  const lines = [];
  let source = 0;
  let line = 0;
  for (const row of mappings.split(";")) {
    const segments = [];
    let column = 0;
    for (const segment of row.split(",")) {
      if (!segment) continue;
      const fields = [];
      let value = 0;
      let shift = 0;
      for (const ch of segment) {
        const digit = B64.indexOf(ch);
        if (digit < 0) fail(`rolldown wrote a source map this build cannot read (\`${ch}\`)`);
        value += (digit & 31) * 2 ** shift;
        if (digit & 32) {
          shift += 5;
        } else {
          fields.push(value % 2 ? -(value - 1) / 2 : value / 2);
          value = 0;
          shift = 0;
        }
      }
      column += fields[0];
      if (fields.length >= 4) {
        source += fields[1];
        line += fields[2];
        segments.push(column, source, line + 1);
      }
    }
    lines.push(segments);
  }
  return lines;
}

/** Bundles `app` (with the SDK's component module first) into one module. */
async function bundle(app, world) {
  tool("rolldown");
  const { rolldown } = await import("rolldown");
  const name = WORLDS[world];
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "maporl-plugin-"));
  try {
    const entry = path.join(tmp, "entry.js");
    fs.writeFileSync(
      entry,
      `import ${JSON.stringify(path.join(HERE, "component.js"))};\n` +
        `export { ${name} } from ${JSON.stringify(path.resolve(app))};\n`,
    );
    const problems = [];
    let built;
    try {
      built = await rolldown({
        input: entry,
        cwd: path.dirname(path.resolve(app)),
        external: [/^maporl:/],
        platform: "neutral",
        logLevel: "warn",
        onLog: (level, log) => problems.push(`${level}: ${log.message}`),
      });
    } catch (e) {
      const text = String(e.message ?? e);
      if (/MISSING_EXPORT|is not exported|not exported by/i.test(text)) {
        fail(`${app} exports no \`${name}\`: a ${world} plugin ends with \`export const ${name} = exportPlugin(YourPlugin);\``);
      }
      fail(`bundling ${app} failed:\n${text}`);
    }
    const { output } = await built.generate({ format: "esm", sourcemap: true });
    await built.close();
    const chunk = output.find((o) => o.type === "chunk");
    if (!new RegExp(`export \\{[^}]*\\b${name}\\b`).test(chunk.code)) {
      fail(`${app} exports no \`${name}\`: a ${world} plugin ends with \`export const ${name} = exportPlugin(YourPlugin);\``);
    }
    const sources = chunk.map.sources.map((s) => s.slice(s.lastIndexOf("/") + 1));
    return { code: chunk.code, sources, lines: lineTable(chunk.map.mappings), problems };
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

/**
 * Builds `app` into `out` for `world` with `engine`; returns the source sha256 recorded in
 * the component.
 */
export async function build({ app, world, out, engine = "spidermonkey", wit = path.join(HERE, "wit") }) {
  if (!WORLDS[world]) fail(`unknown world \`${world}\`; the worlds are ${Object.keys(WORLDS).join(", ")}`);
  if (!ENGINES[engine]) fail(`unknown engine \`${engine}\`; the engines are ${Object.keys(ENGINES).join(", ")}`);
  if (!fs.existsSync(app) || !fs.statSync(app).isFile() || !/\.m?js$/.test(app)) fail(`${app} is not a JavaScript file`);
  if (!fs.existsSync(wit) || !fs.statSync(wit).isDirectory()) fail(`--wit ${wit} is not a directory`);
  const { code, sources, lines, problems } = await bundle(app, world);
  const { manifest, dir } = tool(ENGINES[engine].package);
  const version = manifest.version;
  const source = sourceSha256({ world, engine, version, wit, bundle: code });
  const table = JSON.stringify({ bundle: BUNDLE, sources, lines });
  // The table goes last, so that the bundle's line numbers are the source map's.
  // QuickJS's Math.random is seeded from the source (host.js says why).
  const seed = engine === "quickjs" ? `globalThis.__maporlRandomSeed = "${source}";\n` : "";
  const text = `${code}\nglobalThis.__maporlLines = ${table};\n${seed}`;
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "maporl-plugin-"));
  try {
    const js = path.join(tmp, BUNDLE);
    fs.writeFileSync(js, text);
    const bin = path.join(dir, typeof manifest.bin === "string" ? manifest.bin : manifest.bin[ENGINES[engine].bin]);
    const target = path.resolve(out);
    fs.mkdirSync(path.dirname(target), { recursive: true });
    const args =
      engine === "spidermonkey"
        ? [js, "--wit", wit, "--world-name", world, "--disable", "http", "fetch-event", "--out", target]
        : ["--sync", "--wit", wit, "--world", world, "--js", js, "--output", target];
    // componentize-js is a node script; componentize-qjs a native binary behind a node shim.
    const done = spawnSync(process.execPath, [bin, ...args], { cwd: tmp, encoding: "utf8" });
    if (done.status !== 0) {
      const output = `${done.stderr || ""}${done.stdout || ""}`;
      if (/during Wizer initialization/.test(output) && /wasi:random|wasi:clocks/.test(output)) {
        fail(
          `${ENGINES[engine].bin} ${version} failed: the app draws randomness or reads a clock ` +
            "while its module loads (at the top level: `Math.random()`, `crypto`, `Date.now()`); " +
            "a build snapshots the loaded module, where the host's randomness and clocks do not " +
            "exist yet: do it inside a method instead",
        );
      }
      fail(
        `${ENGINES[engine].bin} ${version} failed (${done.status ?? done.signal}):\n` +
          `${(done.stderr || "").trim()}\n${(done.stdout || "").trim()}`.trim(),
      );
    }
    fs.writeFileSync(target, withSection(fs.readFileSync(target), SOURCE_SECTION, source));
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  return { source, problems };
}

const USAGE =
  "usage: node maporl-plugin/build.mjs APP.js --world protocol|verifier|reward-shaper -o OUT.wasm " +
  "[--engine spidermonkey|quickjs] [--wit DIR]";

export function parseArgs(argv) {
  const args = { engine: "spidermonkey" };
  const rest = [...argv];
  if (rest[0] === "build") rest.shift();
  while (rest.length) {
    const a = rest.shift();
    const value = () => {
      if (!rest.length || rest[0].startsWith("-")) fail(`${a} needs a value\n${USAGE}`);
      return rest.shift();
    };
    if (a === "--world") args.world = value();
    else if (a === "-o" || a === "--out") args.out = value();
    else if (a === "--engine") args.engine = value();
    else if (a === "--wit") args.wit = value();
    else if (a === "-h" || a === "--help") {
      console.log(USAGE);
      process.exit(0);
    } else if (a.startsWith("-")) fail(`unknown option ${a}\n${USAGE}`);
    else if (args.app === undefined) args.app = a;
    else fail(`one app at a time (got ${args.app} and ${a})\n${USAGE}`);
  }
  if (!args.app || !args.world || !args.out) fail(`missing ${!args.app ? "APP.js" : !args.world ? "--world" : "-o OUT.wasm"}\n${USAGE}`);
  return args;
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  try {
    const args = parseArgs(process.argv.slice(2));
    const { source, problems } = await build(args);
    for (const p of problems) console.error(`rolldown ${p}`);
    console.log(`built ${args.out} (${args.world}, ${args.engine}), from source sha256 ${source}`);
  } catch (e) {
    console.error(e instanceof BuildError ? e.message : e);
    process.exit(1);
  }
}
