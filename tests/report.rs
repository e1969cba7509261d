//! `maporl report`: the page's plots carry the run's numbers, every transcript is on it and
//! escaped, a directory that is not a run (or a malformed file) is a clear error, and in
//! headless Chromium the transcript browser renders, filters and expands debates while no
//! script from a transcript runs.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use maporl::debate::{Debate, Speech};
use maporl::transcript::{ChatMessage, Reward, Role, Task, Transcript, Utterance};
use serde_json::json;
use support::*;

/// Model output that tries to break out of every context the page has: a script element,
/// an HTML comment, a textarea, an attribute, an event handler.
const EVIL: &str = "</script><script>document.title='pwned';document.documentElement.setAttribute('data-pwned','1')</script></textarea><img src=x onerror=\"document.title='pwned'\"><!-- \"' --> &amp;";

// ---- a fake run, written with the crate's own types ----------------------------------------

fn said(turn: u32, agent: u32, text: &str, answer: &str, reference: &str) -> Utterance {
    Utterance {
        turn,
        agent,
        text: text.into(),
        answer: Some(answer.into()),
        score: if answer == reference { 0.9 } else { 0.1 },
        correct: answer == reference,
    }
}

/// A two-agent, two-turn debate; `answers[turn][agent]`, team answers `decisions`.
fn debate(
    id: &str,
    question: &str,
    reference: &str,
    answers: [[&str; 2]; 2],
    decisions: Vec<Vec<&str>>,
    text: &str,
) -> Debate {
    let mut utterances = Vec::new();
    let mut speeches = Vec::new();
    let mut rewards = Vec::new();
    for (t, row) in answers.iter().enumerate() {
        for (a, answer) in row.iter().enumerate() {
            let (turn, agent) = (t as u32 + 1, a as u32);
            utterances.push(said(
                turn,
                agent,
                &format!("{text} turn {turn} agent {agent}: {answer}"),
                answer,
                reference,
            ));
            speeches.push(Speech {
                messages: vec![
                    ChatMessage {
                        role: Role::System,
                        content: "Solve it.".into(),
                    },
                    ChatMessage {
                        role: Role::User,
                        content: format!("{question} (prompt of turn {turn})"),
                    },
                ],
                prompt_tokens: 20 + turn as usize,
                response_tokens: 7,
                ids: Default::default(),
            });
            rewards.push(Reward {
                turn,
                agent,
                total: 0.5,
                parts: vec![("correct".into(), 0.25), ("influence".into(), 0.25)],
            });
        }
    }
    Debate {
        task: Task {
            id: id.into(),
            kind: "arith".into(),
            question: question.into(),
            reference: reference.into(),
            fields: vec![],
        },
        transcript: Transcript {
            agents: 2,
            turns: 2,
            utterances,
        },
        speeches,
        decisions: decisions
            .into_iter()
            .map(|d| d.into_iter().map(String::from).collect())
            .collect(),
        rewards,
        error: None,
    }
}

fn debates() -> Vec<Debate> {
    vec![
        debate(
            "t-right",
            "What is 2 + 3?",
            "5",
            [["5", "4"], ["5", "5"]],
            vec![vec!["5"], vec!["5"]],
            "Adding.",
        ),
        debate(
            "t-wrong",
            "What is 3 + 4?",
            "7",
            [["7", "8"], ["8", "8"]],
            vec![vec!["7", "8"], vec!["8"]],
            "Persuaded.",
        ),
        debate(
            "t-evil",
            &format!("Q {EVIL}"),
            "9",
            [["4", "9"], [EVIL, "9"]],
            vec![vec!["4", "9"], vec!["9"]],
            EVIL,
        ),
    ]
}

/// An evaluation run: eval.json from the crate's evaluation, transcripts.jsonl as
/// `write_transcripts` lays it out (the debate, flattened, plus the plugin hashes).
fn eval_run(dir: &Path) -> Vec<Debate> {
    std::fs::create_dir_all(dir).unwrap();
    let debates = debates();
    let report = maporl::eval::evaluate(&debates);
    std::fs::write(
        dir.join("eval.json"),
        serde_json::to_string_pretty(&report).unwrap(),
    )
    .unwrap();
    let mut lines = String::new();
    for d in &debates {
        let mut record = serde_json::to_value(d).unwrap();
        record["plugins"] = json!({"protocol": "aa", "verifier": "bb", "shaper": "cc"});
        lines.push_str(&record.to_string());
        lines.push('\n');
    }
    std::fs::write(dir.join("transcripts.jsonl"), lines).unwrap();
    std::fs::write(dir.join("config.toml"), "seed = 0\n# <b>not markup</b>\n").unwrap();
    debates
}

/// A training run's metrics: `steps` lines as `maporl train` writes them.
fn metrics(steps: usize) -> Vec<serde_json::Value> {
    (1..=steps)
        .map(|step| {
            let s = step as f64;
            json!({
                "step": step, "learning_rate": 1e-4, "tasks": 8,
                "accuracy": [0.1 * s, 0.2 * s - 0.05],
                "reward_parts": {"correct": 0.3 + 0.01 * s, "in<b>fluence": -0.5 * s},
                "trained_turns": [1, 2],
                "agents": {
                    "0": {"reward_mean": 0.1, "kl": 0.5 * s, "kl_coef": 0.05, "policy_loss": -0.1,
                          "value_loss": 0.2, "approx_kl": 0.01, "clip_fraction": 0.1,
                          "entropy": 2.0, "grad_norm": 1.0, "tokens": 100},
                    "1": {"reward_mean": 0.1, "kl": 0.25 * s * s, "kl_coef": 0.05, "policy_loss": -0.1,
                          "value_loss": 0.2, "approx_kl": 0.01, "clip_fraction": 0.1,
                          "entropy": 2.0, "grad_norm": 1.0, "tokens": 100}
                },
                "rollout_seconds": 1.5, "update_seconds": 2.5,
                "generated_tokens_per_second": 40.0, "update_tokens_per_second": 80.0
            })
        })
        .collect()
}

fn training_run(dir: &Path, lines: &[serde_json::Value]) {
    std::fs::create_dir_all(dir.join("checkpoints/step-000002")).unwrap();
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.join("metrics.jsonl"), text).unwrap();
    std::fs::write(dir.join("config.toml"), "seed = 0\n").unwrap();
}

// ---- running the command ------------------------------------------------------------------

fn report(args: &[&Path]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_maporl"))
        .arg("report")
        .args(args)
        .output()
        .unwrap()
}

/// `maporl report DIR`; asserts success; returns the page (DIR/report.html).
fn page(dir: &Path) -> String {
    let out = report(&[dir]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(dir.join("report.html")).unwrap()
}

// ---- reading the page ---------------------------------------------------------------------

/// The `<svg>` of chart `id`.
fn chart<'a>(html: &'a str, id: &str) -> &'a str {
    let at = html
        .find(&format!(r#"data-chart="{id}""#))
        .unwrap_or_else(|| panic!("no chart {id}"));
    let start = html[..at].rfind("<svg").unwrap();
    let end = at + html[at..].find("</svg>").unwrap();
    &html[start..end]
}

/// The opening tags `<name ...>` in `html`.
fn tags<'a>(html: &'a str, name: &str) -> Vec<&'a str> {
    let open = format!("<{name} ");
    html.match_indices(&open)
        .map(|(i, _)| &html[i..i + html[i..].find('>').unwrap()])
        .collect()
}

fn attr(tag: &str, name: &str) -> String {
    let key = format!(" {name}=\"");
    let at = tag
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {tag}"))
        + key.len();
    tag[at..at + tag[at..].find('"').unwrap()].to_string()
}

fn num(tag: &str, name: &str) -> f64 {
    attr(tag, name).parse().unwrap()
}

/// The pixel position of data point (x, y) in a chart, from the mapping the chart states.
fn pixel(svg: &str, x: f64, y: f64) -> (f64, f64) {
    let s = tags(svg, "svg")[0];
    let (x0, x1, y0, y1) = (
        num(s, "data-x0"),
        num(s, "data-x1"),
        num(s, "data-y0"),
        num(s, "data-y1"),
    );
    let (l, r, t, b) = (
        num(s, "data-left"),
        num(s, "data-right"),
        num(s, "data-top"),
        num(s, "data-bottom"),
    );
    (
        l + (x - x0) / (x1 - x0) * (r - l),
        b - (y - y0) / (y1 - y0) * (b - t),
    )
}

/// The points of the one polyline of `series` in a chart.
fn polyline(svg: &str, series: &str) -> Vec<(f64, f64)> {
    let lines: Vec<&str> = tags(svg, "polyline")
        .into_iter()
        .filter(|t| attr(t, "data-series") == series)
        .collect();
    assert_eq!(lines.len(), 1, "one polyline for {series} in {svg}");
    attr(lines[0], "points")
        .split(' ')
        .map(|p| {
            let (x, y) = p.split_once(',').unwrap();
            (x.parse().unwrap(), y.parse().unwrap())
        })
        .collect()
}

/// Asserts that `series` draws exactly `values` (one point per (x, y), in order).
fn assert_series(svg: &str, series: &str, values: &[(f64, f64)]) {
    let points = polyline(svg, series);
    assert_eq!(points.len(), values.len(), "{series}: {points:?}");
    for (&(px, py), &(x, y)) in points.iter().zip(values) {
        let (ex, ey) = pixel(svg, x, y);
        assert!(
            (px - ex).abs() < 0.01 && (py - ey).abs() < 0.01,
            "{series}: ({x}, {y}) should be at ({ex:.2}, {ey:.2}), is at ({px}, {py})"
        );
    }
}

/// The transcripts the page embeds for its script.
fn embedded(html: &str) -> serde_json::Value {
    let open = r#"<script type="application/json" id="transcript-data">"#;
    let at = html.find(open).expect("no transcript data") + open.len();
    let end = at + html[at..].find("</script>").unwrap();
    serde_json::from_str(&html[at..end]).unwrap()
}

// ---- tests ----------------------------------------------------------------------------------

#[test]
fn training_plots_carry_the_metrics_and_absent_parts_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("train-run");
    let lines = metrics(5);
    training_run(&run, &lines);
    let html = page(&run);

    let accuracy = chart(&html, "accuracy");
    for (t, name) in ["turn 1", "turn 2"].iter().enumerate() {
        let values: Vec<(f64, f64)> = lines
            .iter()
            .map(|l| {
                (
                    l["step"].as_f64().unwrap(),
                    l["accuracy"][t].as_f64().unwrap(),
                )
            })
            .collect();
        assert_series(accuracy, name, &values);
    }
    // Accuracy keeps its [0, 1] axis whatever the data.
    let svg = tags(accuracy, "svg")[0];
    assert_eq!((num(svg, "data-y0"), num(svg, "data-y1")), (0.0, 1.0));

    let parts = chart(&html, "reward-parts");
    for (key, shown) in [
        ("correct", "correct"),
        ("in<b>fluence", "in&lt;b&gt;fluence"),
    ] {
        let values: Vec<(f64, f64)> = lines
            .iter()
            .map(|l| {
                (
                    l["step"].as_f64().unwrap(),
                    l["reward_parts"][key].as_f64().unwrap(),
                )
            })
            .collect();
        assert_series(parts, shown, &values);
    }
    assert!(
        !html.contains("in<b>fluence"),
        "a reward part's name is escaped"
    );

    let kl = chart(&html, "kl");
    for agent in ["0", "1"] {
        let values: Vec<(f64, f64)> = lines
            .iter()
            .map(|l| {
                (
                    l["step"].as_f64().unwrap(),
                    l["agents"][agent]["kl"].as_f64().unwrap(),
                )
            })
            .collect();
        assert_series(kl, &format!("agent {agent}"), &values);
    }

    // What a training run lacks is said, not left blank.
    assert!(
        html.contains("No eval.json (`maporl eval`) and no held-out"),
        "{html}"
    );
    assert!(html.contains("no transitions between turns"));
    assert!(html.contains("No transcripts in this run directory"));
    assert!(!html.contains(r#"id="transcript-data""#));
    assert!(html.contains("Checkpoints: step-000002"));
    assert!(html.contains("5 steps, 8 debates per step, 2 turns"));
}

#[test]
fn a_missing_value_breaks_the_line_rather_than_drawing_zero() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut lines = metrics(5);
    // NaN is written as null by serde_json.
    lines[2]["agents"]["0"]["kl"] = serde_json::Value::Null;
    training_run(&run, &lines);
    let html = page(&run);
    let kl = chart(&html, "kl");
    let agent0: Vec<&str> = tags(kl, "polyline")
        .into_iter()
        .filter(|t| attr(t, "data-series") == "agent 0")
        .collect();
    let counts: Vec<usize> = agent0
        .iter()
        .map(|t| attr(t, "points").split(' ').count())
        .collect();
    assert_eq!(counts, vec![2, 2], "steps 1-2 and 4-5");
}

#[test]
fn evaluation_shows_table_transitions_and_every_transcript_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("eval-run");
    let debates = eval_run(&run);
    let report = maporl::eval::evaluate(&debates);
    let html = page(&run);

    // Transitions: one group per turn change, one bar per kind, heights from eval.json.
    let transitions = chart(&html, "transitions");
    let t = report.turns[1].transitions.unwrap();
    let bars = tags(transitions, "rect");
    assert_eq!(bars.len(), 4, "{transitions}");
    for (series, count) in [
        ("right → right", t.rr),
        ("wrong → right", t.wr),
        ("right → wrong", t.rw),
        ("wrong → wrong", t.ww),
    ] {
        let bar = bars
            .iter()
            .find(|b| attr(b, "data-series") == series)
            .unwrap();
        assert_eq!(num(bar, "data-value"), count as f64, "{series}");
        let (_, top) = pixel(transitions, 0.0, count as f64);
        let (_, base) = pixel(transitions, 0.0, 0.0);
        assert!(
            (num(bar, "y") - top).abs() < 0.01 && (num(bar, "height") - (base - top)).abs() < 0.01,
            "{bar}"
        );
    }
    assert_eq!(
        (t.rr, t.wr, t.rw, t.ww),
        (2, 1, 1, 2),
        "the fixture's moves"
    );
    let majority: Vec<(f64, f64)> = report
        .turns
        .iter()
        .map(|t| (t.turn as f64, t.majority_accuracy))
        .collect();
    assert_series(chart(&html, "eval-accuracy"), "majority", &majority);
    assert!(
        html.contains("<tr><th>transitions RR/WR/RW/WW</th><td>-</td><td>2/1/1/2</td></tr>"),
        "{html}"
    );
    assert!(html.contains("No metrics.jsonl in this run directory"));

    // Every transcript, every utterance, verbatim (after JSON decoding).
    let data = embedded(&html);
    let tasks = data["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), debates.len());
    for (view, d) in tasks.iter().zip(&debates) {
        assert_eq!(view["id"], d.task.id.as_str());
        assert_eq!(view["question"], d.task.question.as_str());
        let said: Vec<&serde_json::Value> = view["turns"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|t| t["said"].as_array().unwrap())
            .collect();
        assert_eq!(said.len(), d.transcript.utterances.len());
        for (s, (u, sp)) in said
            .iter()
            .zip(d.transcript.utterances.iter().zip(&d.speeches))
        {
            assert_eq!(s["text"], u.text.as_str());
            assert_eq!(s["answer"], u.answer.as_deref().unwrap());
            assert_eq!(s["prompt"][1]["content"], sp.messages[1].content.as_str());
            assert_eq!(s["reward"]["total"], 0.5);
        }
    }
    assert_eq!(tasks[1]["outcome"], json!(["tie", "wrong"]));
    assert_eq!(tasks[2]["outcome"], json!(["tie", "right"]));

    // Nothing from a transcript is markup: the page has exactly its own two scripts, and
    // no part of the hostile text appears unescaped.
    assert_eq!(
        html.matches("<script").count(),
        2,
        "only the data block and the page's script"
    );
    assert_eq!(html.matches("</script>").count(), 2);
    for raw in [
        "</textarea>",
        "<img",
        "<!--",
        "<script>document",
        "onerror=\"",
    ] {
        assert!(!html.contains(raw), "{raw} appears unescaped");
    }
    assert!(
        html.contains("# &lt;b&gt;not markup&lt;/b&gt;"),
        "config.toml is shown escaped"
    );
    // And nothing can load from the network: the policy allows no source at all.
    assert!(html.contains("default-src 'none'"));
    assert!(!html.contains("src=\"http") && !html.contains("href=\"http"));
}

/// A training run with held-out tasks (what `maporl train` writes with data.held_out > 0):
/// eval-before.json and eval-after.json with their transcripts.
fn held_out_run(dir: &Path) -> (Vec<Debate>, Vec<Debate>) {
    training_run(dir, &metrics(3));
    let before = debates();
    // After training the wrong debate ends right: the same tasks, other answers.
    let mut after = debates();
    after[1] = debate(
        "t-wrong",
        "What is 3 + 4?",
        "7",
        [["7", "8"], ["7", "7"]],
        vec![vec!["7", "8"], vec!["7"]],
        "Corrected.",
    );
    for (name, set) in [("before", &before), ("after", &after)] {
        let report = maporl::eval::evaluate(set);
        std::fs::write(
            dir.join(format!("eval-{name}.json")),
            serde_json::to_string_pretty(&report).unwrap(),
        )
        .unwrap();
        let lines: String = set
            .iter()
            .map(|d| format!("{}\n", serde_json::to_value(d).unwrap()))
            .collect();
        std::fs::write(dir.join(format!("transcripts-{name}.jsonl")), lines).unwrap();
    }
    (before, after)
}

/// The report of a training run shows its held-out evaluations: the paired table `maporl
/// train` prints (the same numbers), each evaluation's table with the conditional rates and
/// its charts, and both evaluations' transcripts, told apart.
#[test]
fn held_out_evaluations_are_shown_paired_with_both_transcripts() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("train-run");
    let (before, after) = held_out_run(&run);
    let html = page(&run);

    let paired = maporl::eval::paired(&before, &after, 10_000, 0).unwrap();
    let table = &html[html.find(r#"id="paired-table""#).expect("no paired table")..];
    let table = &table[..table.find("</table>").unwrap()];
    for t in &paired.turns {
        let row = format!(
            "<tr><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{:+.3} [{:+.3}, {:+.3}]</td>",
            t.turn, t.first, t.second, t.difference, t.low, t.high
        );
        assert!(table.contains(&row), "{row}\n{table}");
    }
    assert!(
        paired.turns[1].difference > 0.0,
        "the fixture improves at turn 2"
    );

    for (name, set) in [("before", &before), ("after", &after)] {
        let report = maporl::eval::evaluate(set);
        assert!(html.contains(&format!("Held-out tasks, {name} training")));
        let majority: Vec<(f64, f64)> = report
            .turns
            .iter()
            .map(|t| (t.turn as f64, t.majority_accuracy))
            .collect();
        assert_series(
            chart(&html, &format!("eval-accuracy-{name}")),
            "majority",
            &majority,
        );
        let transitions = chart(&html, &format!("transitions-{name}"));
        assert_eq!(tags(transitions, "rect").len(), 4);
    }
    // The conditional rates the command line prints are rows of the tables too.
    assert!(html.contains("<th>P(W→R | wrong, a peer right)</th><td>-</td>"));
    assert!(html.contains("<th>P(R→W | right, a peer wrong)</th><td>-</td>"));
    // A move to a right answer is green, to a wrong one red, in the bars and the legend.
    let transitions = chart(&html, "transitions-after");
    for (series, colour) in [("wrong → right", "#2ca02c"), ("right → wrong", "#d62728")] {
        let bar = tags(transitions, "rect")
            .into_iter()
            .find(|b| attr(b, "data-series") == series)
            .unwrap();
        assert_eq!(attr(bar, "fill"), colour, "{series}");
    }

    // Both evaluations' transcripts, each debate tagged with its evaluation.
    let data = embedded(&html);
    assert_eq!(data["sets"], json!(["before", "after"]));
    let tasks = data["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), before.len() + after.len());
    let keys: Vec<&str> = tasks.iter().map(|t| t["key"].as_str().unwrap()).collect();
    assert_eq!(
        keys,
        [
            "before/t-right",
            "before/t-wrong",
            "before/t-evil",
            "after/t-right",
            "after/t-wrong",
            "after/t-evil"
        ]
    );
    assert_eq!(tasks[1]["outcome"], json!(["tie", "wrong"]));
    assert_eq!(tasks[4]["outcome"], json!(["tie", "right"]));
    assert!(html.contains("held-out evaluation before training: 3 tasks"));
}

#[test]
fn not_a_run_and_malformed_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let err = |out: std::process::Output| {
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };

    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let e = err(report(&[&empty]));
    assert!(
        e.contains("is not a run directory")
            && e.contains("metrics.jsonl")
            && e.contains("eval.json"),
        "{e}"
    );
    assert!(!empty.join("report.html").exists());

    let e = err(report(&[&dir.path().join("nowhere")]));
    assert!(e.contains("nowhere is not a directory"), "{e}");

    let run = dir.path().join("bad-metrics");
    training_run(&run, &metrics(3));
    let mut text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    text = text.replacen("\n", "\n{\"step\": 2, \"accuracy\": [0.5,\n", 1);
    std::fs::write(run.join("metrics.jsonl"), text).unwrap();
    let e = err(report(&[&run]));
    assert!(
        e.contains(&format!(
            "{} line 2 is malformed",
            run.join("metrics.jsonl").display()
        )),
        "{e}"
    );

    let run = dir.path().join("bad-transcripts");
    eval_run(&run);
    let mut text = std::fs::read_to_string(run.join("transcripts.jsonl")).unwrap();
    text.push_str("{\"task\": {\"id\": \"x\"}}\n");
    std::fs::write(run.join("transcripts.jsonl"), text).unwrap();
    let e = err(report(&[&run]));
    assert!(
        e.contains(&format!(
            "{} line 4 is malformed",
            run.join("transcripts.jsonl").display()
        )),
        "{e}"
    );

    // --out puts the page elsewhere.
    let run = dir.path().join("ok");
    eval_run(&run);
    let out_file = dir.path().join("pages/ok.html");
    let out = Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args([
            "report",
            run.to_str().unwrap(),
            "--out",
            out_file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out_file.is_file() && !run.join("report.html").exists());
}

// ---- headless Chromium ----------------------------------------------------------------------

/// Debian's `chromium` (or MAPORL_CHROMIUM); fails loudly when it is missing.
fn chromium() -> PathBuf {
    let bin = std::env::var_os("MAPORL_CHROMIUM")
        .map_or_else(|| PathBuf::from("chromium"), PathBuf::from);
    match Command::new(&bin).arg("--version").output() {
        Ok(o) if o.status.success() => bin,
        other => panic!(
            "headless Chromium is needed for the report test, and `{}` does not run ({other:?}): \
             install Debian's chromium (`sudo apt-get install chromium`; `cargo xtask test` does \
             it when run as root) or set MAPORL_CHROMIUM to a Chromium binary",
            bin.display()
        ),
    }
}

/// The DOM of `page` (with URL fragment `fragment`) after its script ran.
fn dump_dom(page: &Path, fragment: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(chromium())
        .args([
            "--headless",
            // Wait for what the page left pending (an image's error handler, say).
            "--virtual-time-budget=2000",
            "--disable-gpu",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(format!("file://{}{fragment}", page.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && dom.contains("</html>"),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dom
}

fn count(dom: &str) -> String {
    let at = dom.find(r#"<span id="count""#).expect("no count");
    let text = &dom[at + dom[at..].find('>').unwrap() + 1..];
    text[..text.find("</span>").unwrap()].to_string()
}

fn shown_debates(dom: &str) -> Vec<String> {
    tags(dom, "details")
        .into_iter()
        .filter(|t| attr(t, "class") == "debate")
        .map(|t| attr(t, "data-task"))
        .collect()
}

#[test]
fn chromium_renders_filters_and_expands_transcripts_and_runs_none_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("eval-run");
    eval_run(&run);
    page(&run);
    let file = run.join("report.html");

    let dom = dump_dom(&file, "");
    // The script ran: it listed every debate and counted them.
    assert_eq!(count(&dom), "3 of 3 debates match", "{dom}");
    assert_eq!(shown_debates(&dom), ["t-right", "t-wrong", "t-evil"]);
    assert!(dom.contains(r#"<option value="2">turn 2</option>"#));
    // No transcript's script ran: the title and the root element are the page's own.
    assert!(
        dom.contains("<title>maporl report: eval-run</title>"),
        "{dom}"
    );
    assert!(dom.contains(r#"<html lang="en"><head>"#), "{dom}");
    // The hostile text is in the data, untouched, and the page has no element made from it.
    assert!(!dom.contains("<img") && !dom.contains("<textarea"), "{dom}");

    // Filters from the fragment: team answer wrong after turn 2.
    let dom = dump_dom(&file, "#outcome=wrong&turn=2");
    assert_eq!(count(&dom), "1 of 3 debates match");
    assert_eq!(shown_debates(&dom), ["t-wrong"]);
    // Ties with the gold answer after turn 1; task id part.
    let dom = dump_dom(&file, "#outcome=tie&turn=1&task=t-");
    assert_eq!(shown_debates(&dom), ["t-wrong", "t-evil"]);
    let dom = dump_dom(&file, "#task=evil");
    assert_eq!(shown_debates(&dom), ["t-evil"]);

    // A training run's page: the paired table, and the transcripts of either evaluation.
    let trained = dir.path().join("train-run");
    held_out_run(&trained);
    page(&trained);
    let trained = trained.join("report.html");
    let dom = dump_dom(&trained, "");
    assert_eq!(count(&dom), "6 of 6 debates match", "{dom}");
    assert!(dom.contains(r#"id="paired-table""#), "{dom}");
    assert!(
        !dom.contains(r#"id="filter-set-label" hidden"#),
        "the filter shows: {dom}"
    );
    // After training every debate ends right at turn 2; before, one ends wrong.
    let dom = dump_dom(&trained, "#set=after&outcome=right&turn=2");
    assert_eq!(count(&dom), "3 of 6 debates match", "{dom}");
    assert_eq!(shown_debates(&dom), ["t-right", "t-wrong", "t-evil"]);
    let dom = dump_dom(&trained, "#set=before&outcome=wrong&turn=2");
    assert_eq!(shown_debates(&dom), ["t-wrong"]);
    let dom = dump_dom(&trained, "#set=before&open=before/t-wrong");
    assert_eq!(dom.matches(r#"<div class="utterance""#).count(), 4, "{dom}");

    // Expanding the hostile debate renders its turns, utterances and prompts as text.
    let dom = dump_dom(&file, "#open=t-evil");
    let turns: Vec<String> = tags(&dom, "details")
        .into_iter()
        .filter(|t| attr(t, "class") == "turn")
        .map(|t| attr(t, "data-turn"))
        .collect();
    assert_eq!(turns, ["1", "2"], "{dom}");
    assert_eq!(dom.matches(r#"<div class="utterance""#).count(), 4);
    let shown = "&lt;/script&gt;&lt;script&gt;document.title='pwned';";
    // In the question, in every response, in the answer badge and in every prompt.
    assert!(dom.matches(shown).count() >= 1 + 4 + 1 + 4, "{dom}");
    assert!(dom.contains("team answer 4 / 9 "), "{dom}");
    assert!(
        dom.contains("<title>maporl report: eval-run</title>")
            && dom.contains(r#"<html lang="en"><head>"#),
        "a transcript's script ran: {dom}"
    );
    assert!(!dom.contains("<img") && !dom.contains("<textarea"), "{dom}");
}

// ---- a real run -----------------------------------------------------------------------------

/// `maporl train` (2 steps) and `maporl eval` (2 tasks) on a tiny model: the report reads
/// what they really write.
#[test]
fn reports_real_training_and_evaluation_runs() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-qwen2");
    std::fs::create_dir(&model).unwrap();
    write_tiny_qwen2(&model);
    let config = repo().join("configs/smollm2-arith.toml");
    for (command, run) in [("train", "train-run"), ("eval", "eval-run")] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_maporl"));
        cmd.args([command, "--config", config.to_str().unwrap()]);
        for set in [
            format!("model.path={}", model.display()),
            format!("run_dir={}", dir.path().join(run).display()),
            "train.steps=2".into(),
            // Training holds one task out, evaluated before and after.
            format!("data.count={}", if command == "train" { 3 } else { 2 }),
            format!("data.held_out={}", if command == "train" { 1 } else { 0 }),
            "debate.batch_size=2".into(),
            "debate.turns=2".into(),
            "generation.max_new_tokens=6".into(),
            "train.ppo.minibatches=1".into(),
            "train.ppo.epochs=1".into(),
        ] {
            cmd.args(["--set", &set]);
        }
        let out = cmd.env("MAPORL_PLUGINS", plugins_dir()).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if command == "train" {
            // Off a terminal (here, a pipe) there is no bar: a line a step, with what it
            // measured and an estimate of what is left.
            let printed = String::from_utf8_lossy(&out.stdout);
            for step in ["step 1/2: reward ", "step 2/2: reward "] {
                let line = printed
                    .lines()
                    .find(|l| l.starts_with(step))
                    .unwrap_or_else(|| panic!("no `{step}` line in:\n{printed}"));
                for part in [
                    "accuracy by turn",
                    "KL ",
                    "(agent 0)",
                    "(agent 1)",
                    " s, ETA ",
                ] {
                    assert!(line.contains(part), "{part}: {line}");
                }
            }
        }
    }
    let html = page(&dir.path().join("train-run"));
    let accuracy = chart(&html, "accuracy");
    assert_eq!(polyline(accuracy, "turn 1").len(), 2);
    assert_eq!(polyline(accuracy, "turn 2").len(), 2);
    assert_eq!(polyline(chart(&html, "kl"), "agent 1").len(), 2);
    // What `maporl train` writes of its held-out task is on the page: both evaluations,
    // paired, and their transcripts.
    assert!(html.contains(r#"id="paired-table""#), "{html}");
    assert!(
        html.contains("held-out evaluation before training: 1 tasks"),
        "{html}"
    );
    assert!(
        html.contains("held-out evaluation after training: 1 tasks"),
        "{html}"
    );
    assert_eq!(embedded(&html)["sets"], json!(["before", "after"]));
    assert_eq!(embedded(&html)["tasks"].as_array().unwrap().len(), 2);

    let html = page(&dir.path().join("eval-run"));
    assert_eq!(embedded(&html)["tasks"].as_array().unwrap().len(), 2);
    assert_eq!(tags(chart(&html, "transitions"), "rect").len(), 4);
    let file = dir.path().join("eval-run/report.html");
    assert_eq!(count(&dump_dom(&file, "")), "2 of 2 debates match");
}

#[test]
fn sft_runs_plot_loss_per_agent_and_list_their_transcripts() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("sft-run");
    eval_run(&run);
    std::fs::remove_file(run.join("eval.json")).unwrap();
    let lines: Vec<serde_json::Value> = (0..3)
        .flat_map(|epoch| {
            (0..2).map(move |agent| {
                json!({"agent": agent, "epoch": epoch, "loss": 2.0 - 0.5 * epoch as f64 + agent as f64,
                       "grad_norm": 1.0, "samples": 4, "tokens": 40})
            })
        })
        .collect();
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(run.join("metrics.jsonl"), text).unwrap();
    let html = page(&run);
    let loss = chart(&html, "sft-loss");
    for agent in [0u64, 1] {
        let values: Vec<(f64, f64)> = lines
            .iter()
            .filter(|l| l["agent"] == agent)
            .map(|l| (l["epoch"].as_f64().unwrap(), l["loss"].as_f64().unwrap()))
            .collect();
        assert_series(loss, &format!("agent {agent}"), &values);
    }
    assert_eq!(embedded(&html)["tasks"].as_array().unwrap().len(), 3);
    assert!(html.contains("No eval.json (`maporl eval`)"));
    assert!(
        !html.contains(r#"data-chart="accuracy""#),
        "no PPO steps, no PPO plots"
    );
}
