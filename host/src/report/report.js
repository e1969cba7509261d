"use strict";
// The transcript browser. Every piece of run text reaches the page through textContent,
// never as markup. State lives in the URL fragment:
// #task=ID-PART&outcome=wrong&turn=2&set=after&open=KEY (KEY: the task id, or SET/ID)
(function () {
  var dataEl = document.getElementById("transcript-data");
  if (!dataEl) return;
  var data = JSON.parse(dataEl.textContent);
  var tasks = data.tasks;
  var byId = function (id) { return document.getElementById(id); };
  var el = function (tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  };
  var list = byId("debates");
  var fTask = byId("filter-task");
  var fOutcome = byId("filter-outcome");
  var fTurn = byId("filter-turn");
  var fSet = byId("filter-set");
  // A training run's held-out evaluations, before and after training: a select of them.
  (data.sets || []).forEach(function (name) {
    var o = el("option", null, name + " training");
    o.value = name;
    fSet.appendChild(o);
  });
  if ((data.sets || []).length) byId("filter-set-label").hidden = false;
  for (var t = 1; t <= data.turns; t++) {
    var o = el("option", null, "turn " + t);
    o.value = String(t);
    fTurn.appendChild(o);
  }
  fTurn.value = String(data.turns);
  var params = new URLSearchParams(location.hash.slice(1));
  if (params.has("task")) fTask.value = params.get("task");
  if (params.has("outcome")) fOutcome.value = params.get("outcome");
  if (params.has("turn")) fTurn.value = params.get("turn");
  if (params.has("set")) fSet.value = params.get("set");
  var opened = new Set(params.getAll("open"));
  var PAGE = 200;
  var limit = PAGE;

  function outcomeAt(task, turn) {
    var n = task.outcome.length;
    if (n === 0) return "none";
    return task.outcome[Math.min(turn, n) - 1];
  }

  function matches(task, turn) {
    var want = fOutcome.value;
    var part = fTask.value.trim();
    if (part && task.id.indexOf(part) < 0) return false;
    if (fSet.value !== "all" && task.set !== fSet.value) return false;
    return want === "all" || outcomeAt(task, turn) === want;
  }

  function answers(list) {
    return list && list.length ? list.join(" / ") : "(none)";
  }

  function utterance(u) {
    var box = el("div", "utterance");
    box.dataset.agent = String(u.agent);
    var head = el("div", "meta");
    head.appendChild(el("strong", null, "agent " + u.agent));
    head.appendChild(document.createTextNode(" answer: "));
    head.appendChild(el("span", "badge " + (u.correct ? "right" : "wrong"),
      u.answer === null ? "(invalid)" : u.answer));
    var facts = " score " + u.score;
    if (u.reward) {
      facts += "; reward " + u.reward.total.toFixed(3);
      if (u.reward.parts.length) {
        facts += " (" + u.reward.parts.map(function (p) {
          return p[0] + " " + Number(p[1]).toFixed(3);
        }).join(", ") + ")";
      }
    }
    if (u.response_tokens !== null) facts += "; " + u.response_tokens + " tokens";
    head.appendChild(document.createTextNode(facts));
    box.appendChild(head);
    box.appendChild(el("pre", "response", u.text));
    if (u.prompt.length) {
      var p = el("details", "prompt");
      p.appendChild(el("summary", null, "prompt: " + u.prompt.length + (u.prompt.length === 1 ? " message" : " messages") +
        (u.prompt_tokens !== null ? ", " + u.prompt_tokens + " tokens" : "")));
      u.prompt.forEach(function (m) {
        p.appendChild(el("div", "role", m.role));
        p.appendChild(el("pre", "message", m.content));
      });
      box.appendChild(p);
    }
    return box;
  }

  function body(task, box) {
    box.appendChild(el("pre", "question", task.question));
    task.fields.forEach(function (f) {
      box.appendChild(el("div", "meta", f[0] + ": " + f[1]));
    });
    if (task.error) box.appendChild(el("p", "absent", "dropped: " + task.error));
    var turns = [];
    task.turns.forEach(function (turn) {
      var d = el("details", "turn");
      d.dataset.turn = String(turn.turn);
      var outcome = outcomeAt(task, turn.turn);
      var s = el("summary", null, "turn " + turn.turn + ": team answer " +
        answers(task.decisions[turn.turn - 1]) + " ");
      s.appendChild(el("span", "badge " + outcome, outcome));
      d.appendChild(s);
      turn.said.forEach(function (u) { d.appendChild(utterance(u)); });
      box.appendChild(d);
      turns.push(d);
    });
    // The first turn opens with the debate; the button opens the next, one at a time.
    if (turns.length) turns[0].open = true;
    else box.appendChild(el("p", "absent", "No utterances."));
    var next = el("button", "next-turn", "open the next turn");
    next.type = "button";
    next.addEventListener("click", function () {
      var closed = turns.filter(function (d) { return !d.open; });
      if (closed.length) closed[0].open = true;
    });
    box.appendChild(next);
    var all = el("button", "all-turns", "open all turns");
    all.type = "button";
    all.addEventListener("click", function () { turns.forEach(function (d) { d.open = true; }); });
    box.appendChild(all);
  }

  function row(task, turn) {
    var d = el("details", "debate");
    d.dataset.task = task.id;
    d.dataset.set = task.set;
    var s = el("summary");
    if (task.set) s.appendChild(el("span", "badge set", task.set));
    s.appendChild(el("span", "task-id", task.id));
    task.outcome.forEach(function (o, i) {
      s.appendChild(el("span", "badge " + o, "t" + (i + 1) + " " + o));
    });
    s.appendChild(el("span", "meta", " gold " + task.reference +
      (task.kind ? " (" + task.kind + ")" : "")));
    d.appendChild(s);
    var box = el("div", "debate-body");
    d.appendChild(box);
    var filled = false;
    var fill = function () {
      if (!filled && d.open) { filled = true; body(task, box); }
      if (d.open) opened.add(task.key); else opened.delete(task.key);
      remember();
    };
    d.addEventListener("toggle", fill);
    if (opened.has(task.key)) { d.open = true; filled = true; body(task, box); }
    return d;
  }

  function remember() {
    var p = new URLSearchParams();
    if (fTask.value.trim()) p.set("task", fTask.value.trim());
    if (fOutcome.value !== "all") p.set("outcome", fOutcome.value);
    if (fTurn.value !== String(data.turns)) p.set("turn", fTurn.value);
    if (fSet.value !== "all") p.set("set", fSet.value);
    opened.forEach(function (id) { p.append("open", id); });
    try { history.replaceState(null, "", "#" + p.toString()); } catch (e) { /* file: URLs may refuse */ }
  }

  function render() {
    var turn = Number(fTurn.value) || data.turns;
    var hits = tasks.filter(function (task) { return matches(task, turn); });
    list.replaceChildren();
    hits.slice(0, limit).forEach(function (task) { list.appendChild(row(task, turn)); });
    if (hits.length > limit) {
      var more = el("button", "more", "show " + Math.min(PAGE, hits.length - limit) + " more");
      more.type = "button";
      more.addEventListener("click", function () { limit += PAGE; render(); });
      list.appendChild(more);
    }
    var shown = Math.min(hits.length, limit);
    var count = byId("count");
    count.textContent = hits.length + " of " + tasks.length + " debates match" +
      (shown < hits.length ? "; showing the first " + shown : "");
    count.dataset.matching = String(hits.length);
    count.dataset.shown = String(shown);
    list.dataset.rendered = "yes";
  }

  var again = function () { limit = PAGE; render(); remember(); };
  fTask.addEventListener("input", again);
  fOutcome.addEventListener("change", again);
  fTurn.addEventListener("change", again);
  fSet.addEventListener("change", again);
  render();
})();
