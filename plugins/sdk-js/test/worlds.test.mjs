// The JavaScript SDK's glue natively (no component): settings, errors and where they were
// thrown, the checks on what a plugin returns, and the build's pure parts.
//
//     cd plugins/sdk-js && node --test test/

import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import test from "node:test";

import { lineTable, parseArgs, sourceSha256, withSection } from "../maporl-plugin/build.mjs";
import * as host from "../maporl-plugin/host.js";
import {
  PluginError,
  Protocol,
  RewardShaper,
  Verifier,
  exportPlugin,
  parseSettings,
  reason,
  worldOf,
} from "../maporl-plugin/index.js";
import { whereThrown } from "../maporl-plugin/worlds.js";

class Demo extends Verifier {
  static NAME = "demo";
  static SETTINGS = { strict: false, gamma: 0.5, name: "x", list: [], map: {}, anything: null };
  extract(task, text) {
    if (text === "0") return null.x;
    if (text === "plugin-error") throw new PluginError("demo: as it is");
    if (text === "number") return 7;
    return text;
  }
  score(task, responses) {
    return responses.map((r) => ({ answer: r || undefined, score: r.length, correct: r === "ok" }));
  }
}

test("settings: defaults, overrides, and refusals by name", () => {
  const s = parseSettings(Demo, '{"gamma": 1, "anything": [1], "list": [2]}');
  assert.deepEqual(s, { strict: false, gamma: 1, name: "x", list: [2], map: {}, anything: [1] });
  assert.equal(parseSettings(Demo, "").gamma, 0.5);
  assert.equal(parseSettings(Demo, '{"name": null}').name, null);
  for (const [doc, says] of [
    ['{"strictt": true}', "demo: unknown setting `strictt` (the settings: anything, gamma, list, map, name, strict)"],
    ['{"strict": 1}', "demo: setting `strict` must be true or false, got 1"],
    ['{"gamma": "1"}', 'demo: setting `gamma` must be a number, got "1"'],
    ['{"name": 3}', "demo: setting `name` must be a string, got 3"],
    ['{"list": {}}', "demo: setting `list` must be an array, got {}"],
    ['{"map": []}', "demo: setting `map` must be an object, got []"],
    ["[1]", "demo: settings must be a JSON object, not array"],
    ["7", "demo: settings must be a JSON object, not number"],
  ]) {
    assert.throws(() => parseSettings(Demo, doc), { message: says }, doc);
  }
  assert.throws(() => parseSettings(Demo, "{nope"), /^Error: demo: settings are not JSON: |demo: settings are not JSON: /);
  // Settings are read-only: a plugin cannot change them between calls.
  assert.throws(() => {
    "use strict";
    parseSettings(Demo, "{}").gamma = 2;
  }, TypeError);
});

test("where an error was thrown, as each engine writes its stack", () => {
  const at = (stack) => whereThrown({ stack });
  assert.equal(at("extract@app.js:8:33\nexport@/tmp/x/initializer.js:312:28\n"), "app.js:8");
  assert.equal(at("    at extract (/src/app.js:12:5)\n    at call (/x.js:1:1)"), "app.js:12");
  assert.equal(at("TypeError: x\n    at file:///a/b/app.js:3:9"), "app.js:3");
  assert.equal(at("no frames here"), undefined);
  // In a component: the bundle's line and column through the build's table.
  globalThis.__maporlLines = {
    bundle: "maporl-plugin-bundle.js",
    sources: ["worlds.js", "app.js"],
    lines: [[0, 0, 10], [0, 1, 37, 10, 1, 39]],
  };
  try {
    assert.equal(at("f@maporl-plugin-bundle.js:1:4"), "worlds.js:10");
    assert.equal(at("    at f (/maporl-plugin-bundle.js:2:3)"), "app.js:37");
    assert.equal(at("    at f (/maporl-plugin-bundle.js:2:12)"), "app.js:39");
    // A frame on a line the table does not cover is skipped for the next one.
    assert.equal(at("f@maporl-plugin-bundle.js:9:1\ng@maporl-plugin-bundle.js:1:1"), "worlds.js:10");
  } finally {
    delete globalThis.__maporlLines;
  }
});

test("errors become the world's error: the plugin, the error and where", () => {
  const v = exportPlugin(Demo);
  const task = { id: "t", kind: "qa", question: "q", reference: "", fields: [] };
  const fails = (fn) => {
    try {
      fn();
    } catch (e) {
      return e.payload;
    }
    assert.fail("no error");
  };
  assert.equal(fails(() => v.extract(task, "x")), "demo: called before `configure`");
  assert.equal(fails(() => v.configure('{"strict": "yes"}')), 'demo: setting `strict` must be true or false, got "yes"');
  v.configure("{}");
  assert.match(fails(() => v.extract(task, "0")), /^demo: TypeError: .*null.* \(at worlds\.test\.mjs:\d+\)$/);
  assert.equal(fails(() => v.extract(task, "plugin-error")), "demo: as it is");
  assert.equal(fails(() => v.extract(task, "number")), "demo: the extracted answer must be a string, got 7");
  assert.equal(v.extract(task, "a"), "a");
  assert.deepEqual(v.score(task, ["ok", ""]), [
    { answer: "ok", score: 2, correct: true },
    { answer: undefined, score: 0, correct: false },
  ]);
  assert.equal(reason(Demo, "a string"), "demo: threw a string");
  assert.equal(reason(Demo, { code: 7 }), 'demo: threw {"code":7}');
});

test("what a plugin returns is checked field by field", () => {
  const task = { id: "t", kind: "qa", question: "q", reference: "", fields: [] };
  const tr = { agents: 1, turns: 1, utterances: [] };
  const returning = (Base, method, value) => {
    class Bad extends Base {
      static NAME = "bad";
    }
    Bad.prototype[method] = () => value;
    const w = exportPlugin(Bad);
    w.configure("");
    try {
      if (method === "shape") w.shape(task, tr);
      else w[method](task, 1, tr);
    } catch (e) {
      return e.payload;
    }
    return "no error";
  };
  assert.equal(returning(Protocol, "planTurn", {}), "bad: the plan must be an array, got {}");
  assert.equal(
    returning(Protocol, "planTurn", [{ agent: -1, messages: [] }]),
    "bad: prompt 0's `agent` must be a whole number in [0, 2^32), got -1",
  );
  assert.equal(
    returning(Protocol, "planTurn", [{ agent: 0, messages: [{ role: "robot", content: "" }] }]),
    "bad: prompt 0's message 0's `role` must be one of system, user, assistant, got \"robot\"",
  );
  assert.equal(returning(Protocol, "decide", ["a", 3]), "bad: decided answer 1 must be a string, got 3");
  assert.equal(
    returning(RewardShaper, "shape", [{ turn: 1, agent: 0, total: 1, parts: [["x", "1"]] }]),
    "bad: reward 0's part 0's value must be a number, got \"1\"",
  );
  assert.equal(
    returning(RewardShaper, "shape", [{ turn: 1.5, agent: 0, total: 1, parts: [] }]),
    "bad: reward 0's `turn` must be a whole number in [0, 2^32), got 1.5",
  );
  assert.throws(() => worldOf(class NotAPlugin {}), /does not extend Protocol, Verifier or RewardShaper/);
});

test("host functions natively: log to stderr, judge refuses, limits are the defaults", () => {
  assert.equal(host.inComponent(), false);
  assert.throws(() => host.judge("q", ["a"]), { name: "JudgeError", message: /no verifier model configured/ });
  assert.equal(host.limits().maxAbsReward, 1000);
  assert.throws(() => host.log("loud", "x"), /log level `loud`/);
  assert.equal(host.formatArgs(["a", 2, { b: [1] }, undefined]), 'a 2 {"b":[1]} undefined');
});

test("build: the source section, the line table, the source hash, the arguments", () => {
  const wasm = Buffer.from([0, 0x61, 0x73, 0x6d, 0x0d, 0, 1, 0]);
  const out = withSection(wasm, "maporl:source", "ab");
  // id 0, size 16 = 1 + 13 + 2, name length 13, name, contents.
  assert.deepEqual([...out.subarray(8, 11)], [0, 16, 13]);
  assert.equal(out.subarray(11).toString(), "maporl:sourceab");
  assert.throws(() => withSection(Buffer.from("nope"), "x", "y"), /not a WebAssembly file/);

  // "AAAA" is column 0 of source 0, line 0; ";" a new generated line; "AACA" one line on.
  assert.deepEqual(lineTable("AAAA,IAAI;;AACA"), [[0, 0, 1, 4, 0, 1], [], [0, 0, 2]]);
  assert.deepEqual(lineTable("AAAA;ACAA"), [[0, 0, 1], [0, 1, 1]]);

  const wit = fs.mkdtempSync(path.join(os.tmpdir(), "maporl-wit-"));
  try {
    fs.writeFileSync(path.join(wit, "maporl.wit"), "package a:b;");
    const base = { world: "verifier", engine: "quickjs", version: "0.4.5", wit, bundle: "code" };
    const h = sourceSha256(base);
    assert.match(h, /^[0-9a-f]{64}$/);
    assert.equal(sourceSha256({ ...base }), h);
    for (const change of [{ world: "protocol" }, { engine: "spidermonkey" }, { version: "0.4.6" }, { bundle: "code2" }]) {
      assert.notEqual(sourceSha256({ ...base, ...change }), h, JSON.stringify(change));
    }
    fs.writeFileSync(path.join(wit, "maporl.wit"), "package a:c;");
    assert.notEqual(sourceSha256(base), h);
  } finally {
    fs.rmSync(wit, { recursive: true });
  }

  assert.deepEqual(parseArgs(["build", "app.js", "--world", "verifier", "-o", "x.wasm"]), {
    engine: "spidermonkey",
    app: "app.js",
    world: "verifier",
    out: "x.wasm",
  });
  assert.throws(() => parseArgs(["app.js", "--world"]), /--world needs a value/);
  assert.throws(() => parseArgs(["app.js", "-o", "x.wasm"]), /missing --world/);
  assert.throws(() => parseArgs(["app.js", "--world", "verifier", "-o", "x", "--fast"]), /unknown option --fast/);
});
