//! The report page: one self-contained HTML document (inline CSS, inline SVG, one inline
//! script, the transcripts as an inline JSON data block), with a Content-Security-Policy that
//! lets nothing load from anywhere and runs only the page's own script.
//!
//! Everything that comes from a run (transcripts, plugin reward names, file contents) is
//! text: it goes into the HTML through [`escape`] and into the data block through
//! [`json_for_script`], and the script puts it into the DOM with `textContent` only.

use std::fmt::Write as _;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::load::{Run, EVAL, METRICS, TRANSCRIPTS};
use super::plot::{bar_chart, escape, line_chart, num, Chart, Series};
use crate::debate::Debate;
use crate::eval::Report;
use crate::transcript::{ChatMessage, Reward};

const SCRIPT: &str = include_str!("report.js");
const STYLE: &str = include_str!("report.css");

/// JSON that is safe inside `<script type="application/json">`: `<`, `>` and `&` become
/// `\u` escapes (still the same JSON), so no `</script>` or `<!--` can occur in it.
/// They can only occur inside JSON strings, so replacing them everywhere is exact.
pub fn json_for_script<T: Serialize>(value: &T) -> anyhow::Result<String> {
    Ok(serde_json::to_string(value)?
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029"))
}

/// The page's Content-Security-Policy: nothing from the network, inline styles, and only
/// the page's own script (by its hash). It holds no `"`, so it goes into the attribute as is.
fn csp() -> String {
    let hash = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(Sha256::digest(SCRIPT.as_bytes()))
    };
    format!(
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'sha256-{hash}'"
    )
}

fn absent(s: &mut String, text: &str) {
    let _ = writeln!(s, r#"<p class="absent">{}</p>"#, escape(text));
}

pub fn render(run: &Run) -> anyhow::Result<String> {
    let name = run
        .dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| run.dir.display().to_string());
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>maporl report: {}</title>
<style>{STYLE}</style></head><body>
<header><h1>maporl report: {}</h1><p class="path">{}</p><p id="summary">{}</p>
<nav><a href="#training">training</a> <a href="#evaluation">evaluation</a> <a href="#transcripts">transcripts</a> <a href="#files">run files</a></nav></header>"##,
        csp(),
        escape(&name),
        escape(&name),
        escape(&run.dir.display().to_string()),
        escape(&summary(run))
    );
    training(&mut s, run);
    evaluation(&mut s, run);
    transcripts(&mut s, run)?;
    files(&mut s, run);
    let _ = writeln!(s, "<script>{SCRIPT}</script>\n</body></html>");
    Ok(s)
}

fn summary(run: &Run) -> String {
    let mut parts = Vec::new();
    if let (Some(first), Some(last)) = (run.steps.first(), run.steps.last()) {
        parts.push(format!(
            "training run: {} steps ({} to {})",
            run.steps.len(),
            first.step,
            last.step
        ));
    }
    if !run.sft.is_empty() {
        parts.push(format!("SFT run: {} agent epochs", run.sft.len()));
    }
    for e in &run.evaluations {
        let r = &e.report;
        let what = match e.name {
            "" => "evaluation".to_string(),
            name => format!("held-out evaluation {name} training"),
        };
        parts.push(format!(
            "{what}: {} tasks, {} agents, {} turns",
            r.tasks,
            r.agents,
            r.turns.len()
        ));
    }
    let transcripts: usize = run
        .evaluations
        .iter()
        .filter_map(|e| e.debates.as_ref())
        .chain(run.debates.as_ref())
        .map(Vec::len)
        .sum();
    if transcripts > 0 {
        parts.push(format!("{transcripts} transcripts"));
    }
    if parts.is_empty() {
        parts.push("no finished training step and no evaluation yet".into());
    }
    parts.join("; ")
}

/// The series of one per-agent statistic over the steps.
fn per_agent(run: &Run, stat: impl Fn(&super::load::AgentStep) -> Option<f64>) -> Vec<Series> {
    let agents: std::collections::BTreeSet<u32> = run
        .steps
        .iter()
        .flat_map(|st| st.agents.keys().copied())
        .collect();
    agents
        .into_iter()
        .map(|a| Series {
            name: format!("agent {a}"),
            points: run
                .steps
                .iter()
                .map(|st| (st.step as f64, st.agents.get(&a).and_then(&stat)))
                .collect(),
        })
        .collect()
}

fn training(s: &mut String, run: &Run) {
    s.push_str("<section id=\"training\"><h2>Training</h2>\n");
    if run.steps.is_empty() && run.sft.is_empty() {
        if run.has_metrics {
            absent(
                s,
                &format!("{METRICS} has no lines yet: no training step has finished."),
            );
        } else {
            absent(
                s,
                &format!(
                    "No {METRICS} in this run directory: it is an evaluation, not a training run."
                ),
            );
        }
    }
    if !run.steps.is_empty() {
        let turns = run
            .steps
            .iter()
            .map(|st| st.accuracy.len())
            .max()
            .unwrap_or(0);
        let tasks: Vec<String> = run
            .steps
            .iter()
            .filter_map(|st| st.tasks)
            .map(|t| t.to_string())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut schedule: Vec<(usize, &[u32])> = Vec::new();
        for st in &run.steps {
            if schedule
                .last()
                .is_none_or(|l| l.1 != st.trained_turns.as_slice())
            {
                schedule.push((st.step, &st.trained_turns));
            }
        }
        let schedule: Vec<String> = schedule
            .iter()
            .map(|(step, turns)| {
                let t: Vec<String> = turns.iter().map(|t| t.to_string()).collect();
                format!("from step {step}: turns {}", t.join(", "))
            })
            .collect();
        let per_step = if tasks.is_empty() {
            "?".into()
        } else {
            tasks.join("/")
        };
        let _ = writeln!(
            s,
            "<p>{} steps, {per_step} debates per step, {turns} turns; majority accuracy of each \
             step's debates (the training rollouts, sampled), per turn. Trained {}.</p>",
            run.steps.len(),
            escape(&schedule.join("; "))
        );
        let accuracy: Vec<Series> = (0..turns)
            .map(|t| Series {
                name: format!("turn {}", t + 1),
                points: run
                    .steps
                    .iter()
                    .map(|st| (st.step as f64, st.accuracy.get(t).copied().flatten()))
                    .collect(),
            })
            .collect();
        s.push_str(&line_chart(
            &Chart {
                id: "accuracy",
                title: "Majority accuracy per turn over training",
                x_label: "step",
                y_label: "accuracy",
                y_range: Some((0.0, 1.0)),
            },
            &accuracy,
        ));
        let parts: std::collections::BTreeSet<&String> = run
            .steps
            .iter()
            .flat_map(|st| st.reward_parts.keys())
            .collect();
        if parts.is_empty() {
            absent(s, "No reward parts recorded in the metrics.");
        } else {
            let series: Vec<Series> = parts
                .into_iter()
                .map(|p| Series {
                    name: p.clone(),
                    points: run
                        .steps
                        .iter()
                        .map(|st| (st.step as f64, st.reward_parts.get(p).copied().flatten()))
                        .collect(),
                })
                .collect();
            s.push_str(&line_chart(
                &Chart {
                    id: "reward-parts",
                    title: "Reward parts (mean over rewarded utterances)",
                    x_label: "step",
                    y_label: "reward",
                    y_range: None,
                },
                &series,
            ));
        }
        s.push_str(&line_chart(
            &Chart {
                id: "kl",
                title: "KL to the reference model (per response, before the update)",
                x_label: "step",
                y_label: "KL",
                y_range: None,
            },
            &per_agent(run, |a| a.kl),
        ));
        s.push_str("<details class=\"more\"><summary>More PPO statistics</summary>\n");
        type Stat = fn(&super::load::AgentStep) -> Option<f64>;
        let stats: [(&str, &str, Stat); 8] = [
            ("approx-kl", "approximate KL of the update", |a| a.approx_kl),
            ("clip-fraction", "clip fraction", |a| a.clip_fraction),
            ("policy-loss", "policy loss", |a| a.policy_loss),
            ("value-loss", "value loss", |a| a.value_loss),
            ("entropy", "entropy", |a| a.entropy),
            ("grad-norm", "gradient norm", |a| a.grad_norm),
            ("reward-mean", "mean reward", |a| a.reward_mean),
            ("kl-coef", "KL coefficient", |a| a.kl_coef),
        ];
        for (id, title, stat) in stats {
            s.push_str(&line_chart(
                &Chart {
                    id,
                    title,
                    x_label: "step",
                    y_label: title,
                    y_range: None,
                },
                &per_agent(run, stat),
            ));
        }
        s.push_str(&line_chart(
            &Chart {
                id: "learning-rate",
                title: "learning rate",
                x_label: "step",
                y_label: "learning rate",
                y_range: None,
            },
            &[Series {
                name: "lr".into(),
                points: run
                    .steps
                    .iter()
                    .map(|st| (st.step as f64, st.learning_rate))
                    .collect(),
            }],
        ));
        let seconds = |f: fn(&super::load::Step) -> Option<f64>| -> Vec<(f64, Option<f64>)> {
            run.steps.iter().map(|st| (st.step as f64, f(st))).collect()
        };
        s.push_str(&line_chart(
            &Chart {
                id: "seconds",
                title: "seconds per step",
                x_label: "step",
                y_label: "seconds",
                y_range: None,
            },
            &[
                Series {
                    name: "rollout".into(),
                    points: seconds(|st| st.rollout_seconds),
                },
                Series {
                    name: "update".into(),
                    points: seconds(|st| st.update_seconds),
                },
            ],
        ));
        s.push_str(&line_chart(
            &Chart {
                id: "throughput",
                title: "tokens per second",
                x_label: "step",
                y_label: "tokens/s",
                y_range: None,
            },
            &[
                Series {
                    name: "generation".into(),
                    points: seconds(|st| st.generated_tokens_per_second),
                },
                Series {
                    name: "update".into(),
                    points: seconds(|st| st.update_tokens_per_second),
                },
            ],
        ));
        s.push_str("</details>\n");
    }
    if !run.sft.is_empty() {
        let agents: std::collections::BTreeSet<u32> = run.sft.iter().map(|e| e.agent).collect();
        let series = |stat: fn(&super::load::SftEpoch) -> Option<f64>| -> Vec<Series> {
            agents
                .iter()
                .map(|&a| Series {
                    name: format!("agent {a}"),
                    points: run
                        .sft
                        .iter()
                        .filter(|e| e.agent == a)
                        .map(|e| (e.epoch as f64, stat(e)))
                        .collect(),
                })
                .collect()
        };
        let _ = writeln!(
            s,
            "<p>Supervised fine-tuning on the best debates: {} agents.</p>",
            agents.len()
        );
        s.push_str(&line_chart(
            &Chart {
                id: "sft-loss",
                title: "SFT loss (mean NLL per response token)",
                x_label: "epoch",
                y_label: "loss",
                y_range: None,
            },
            &series(|e| e.loss),
        ));
        s.push_str(&line_chart(
            &Chart {
                id: "sft-grad-norm",
                title: "SFT gradient norm",
                x_label: "epoch",
                y_label: "gradient norm",
                y_range: None,
            },
            &series(|e| e.grad_norm),
        ));
    }
    s.push_str("</section>\n");
}

fn evaluation(s: &mut String, run: &Run) {
    s.push_str("<section id=\"evaluation\"><h2>Evaluation</h2>\n");
    if run.evaluations.is_empty() {
        absent(
            s,
            &format!(
                "No {EVAL} (`maporl eval`) and no held-out evaluation (`maporl train` with \
                 data.held_out > 0 writes eval-before.json and eval-after.json) in this run \
                 directory, so no evaluation and no transitions between turns ({METRICS} \
                 records the training debates' per-turn accuracy only)."
            ),
        );
        s.push_str("</section>\n");
        return;
    }
    if let Some(p) = &run.paired {
        paired_table(s, p);
    }
    for e in &run.evaluations {
        let report = &e.report;
        let id = |what: &str| match e.name {
            "" => what.to_string(),
            name => format!("{what}-{name}"),
        };
        if !e.name.is_empty() {
            let _ = writeln!(
                s,
                "<h3 id=\"{}\">Held-out tasks, {} training</h3>",
                id("held-out"),
                e.name
            );
        }
        let _ = writeln!(
            s,
            "<p>{} tasks scored, {} dropped after a plugin failure, {} agents.</p>",
            report.tasks, report.dropped, report.agents
        );
        table(s, report);
        let turns =
            |f: &dyn Fn(&crate::eval::TurnMetrics) -> Option<f64>| -> Vec<(f64, Option<f64>)> {
                report.turns.iter().map(|t| (t.turn as f64, f(t))).collect()
            };
        let mut series = vec![Series {
            name: "majority".into(),
            points: turns(&|t| Some(t.majority_accuracy)),
        }];
        for a in 0..report.agents as usize {
            series.push(Series {
                name: format!("agent {a}"),
                points: turns(&|t| t.agent_accuracy.get(a).copied()),
            });
        }
        let accuracy_id = id("eval-accuracy");
        s.push_str(&line_chart(
            &Chart {
                id: &accuracy_id,
                title: "Accuracy per turn",
                x_label: "turn",
                y_label: "accuracy",
                y_range: Some((0.0, 1.0)),
            },
            &series,
        ));
        transitions_chart(s, report, &id("transitions"));
    }
    s.push_str("</section>\n");
}

/// The held-out evaluations after against before training, paired task by task, as the
/// command line prints it after `maporl train`.
fn paired_table(s: &mut String, p: &crate::eval::Paired) {
    let _ = writeln!(
        s,
        "<h3 id=\"paired\">After against before training, paired</h3>\n<p>{} held-out tasks \
         scored in both evaluations, paired task by task; 95% bootstrap intervals over the \
         tasks ({} resamples).</p>",
        p.tasks, p.resamples
    );
    s.push_str(
        "<table class=\"metrics\" id=\"paired-table\"><thead><tr><th>turn</th><th>majority, \
         before</th><th>majority, after</th><th>difference [95% CI]</th><th>agents' mean \
         difference [95% CI]</th></tr></thead><tbody>\n",
    );
    for t in &p.turns {
        let _ = writeln!(
            s,
            "<tr><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{:+.3} [{:+.3}, {:+.3}]</td><td>{:+.3} \
             [{:+.3}, {:+.3}]</td></tr>",
            t.turn,
            t.first,
            t.second,
            t.difference,
            t.low,
            t.high,
            t.agent_difference,
            t.agent_low,
            t.agent_high
        );
    }
    s.push_str("</tbody></table>\n");
}

/// The moves between consecutive turns, summed over agents: a move to a right answer in
/// green, to a wrong one in red.
fn transitions_chart(s: &mut String, report: &Report, id: &str) {
    let moves: Vec<&crate::eval::TurnMetrics> = report
        .turns
        .iter()
        .filter(|t| t.transitions.is_some())
        .collect();
    if moves.is_empty() {
        absent(s, "No transitions: the evaluation has a single turn.");
        return;
    }
    let groups: Vec<String> = moves
        .iter()
        .map(|t| format!("turn {} → {}", t.turn - 1, t.turn))
        .collect();
    let count = |f: fn(&crate::eval::Transitions) -> usize| -> Vec<f64> {
        moves
            .iter()
            .map(|t| t.transitions.as_ref().map_or(0, f) as f64)
            .collect()
    };
    let series = vec![
        ("right → right".to_string(), count(|x| x.rr), RIGHT_KEPT),
        ("wrong → right".to_string(), count(|x| x.wr), TO_RIGHT),
        ("right → wrong".to_string(), count(|x| x.rw), TO_WRONG),
        ("wrong → wrong".to_string(), count(|x| x.ww), WRONG_KEPT),
    ];
    s.push_str(&bar_chart(
        &Chart {
            id,
            title: "Transitions between turns (agents' answers, summed over agents)",
            x_label: "turns",
            y_label: "utterances",
            y_range: None,
        },
        &groups,
        &series,
    ));
}

/// The transitions' colours: kept right blue, moved to right green, moved to wrong red,
/// kept wrong grey.
const RIGHT_KEPT: &str = "#1f77b4";
const TO_RIGHT: &str = "#2ca02c";
const TO_WRONG: &str = "#d62728";
const WRONG_KEPT: &str = "#7f7f7f";

/// `eval.json` as a table: one row per metric, one column per turn.
fn table(s: &mut String, r: &Report) {
    s.push_str("<table class=\"metrics\"><thead><tr><th></th>");
    for t in &r.turns {
        let _ = write!(s, "<th>turn {}</th>", t.turn);
    }
    s.push_str("</tr></thead><tbody>\n");
    let mut row = |name: &str, cell: &dyn Fn(&crate::eval::TurnMetrics) -> String| {
        let _ = write!(s, "<tr><th>{}</th>", escape(name));
        for t in &r.turns {
            let _ = write!(s, "<td>{}</td>", escape(&cell(t)));
        }
        s.push_str("</tr>\n");
    };
    row("majority accuracy", &|t| {
        format!("{:.3}", t.majority_accuracy)
    });
    for a in 0..r.agents as usize {
        row(&format!("agent {a} accuracy"), &|t| {
            t.agent_accuracy
                .get(a)
                .map_or("-".into(), |v| format!("{v:.3}"))
        });
    }
    row("invalid rate", &|t| format!("{:.3}", t.invalid_rate));
    row("mean response chars", &|t| {
        num(t.mean_response_chars.round())
    });
    row("transitions RR/WR/RW/WW", &|t| match t.transitions {
        Some(x) => format!("{}/{}/{}/{}", x.rr, x.wr, x.rw, x.ww),
        None => "-".into(),
    });
    row("P(W→R | wrong, a peer right)", &|t| {
        t.corrected_by_peers.map_or("-".into(), |r| r.cell())
    });
    row("P(R→W | right, a peer wrong)", &|t| {
        t.misled_by_peers.map_or("-".into(), |r| r.cell())
    });
    s.push_str("</tbody></table>\n");
}

/// The transcripts as the page's script reads them.
#[derive(Serialize)]
struct Transcripts<'a> {
    turns: u32,
    /// The evaluations the debates come from ("before", "after"), when there are several.
    sets: Vec<&'a str>,
    tasks: Vec<TaskView<'a>>,
}

#[derive(Serialize)]
struct TaskView<'a> {
    /// The evaluation the debate comes from ("" when the run has one), and the debate's
    /// key in the page (set and id: a task is debated in each evaluation).
    set: &'a str,
    key: String,
    id: &'a str,
    kind: &'a str,
    question: &'a str,
    reference: &'a str,
    fields: &'a [(String, String)],
    error: Option<&'a str>,
    /// The team answer's outcome after each turn (1-based turn t at index t - 1): "right",
    /// "tie" (a tie that holds the gold answer), "wrong", "none" (no answer), "dropped".
    outcome: Vec<&'static str>,
    decisions: &'a [Vec<String>],
    turns: Vec<TurnView<'a>>,
}

#[derive(Serialize)]
struct TurnView<'a> {
    turn: u32,
    said: Vec<Said<'a>>,
}

#[derive(Serialize)]
struct Said<'a> {
    agent: u32,
    text: &'a str,
    answer: Option<&'a str>,
    score: f32,
    correct: bool,
    reward: Option<&'a Reward>,
    prompt: &'a [ChatMessage],
    prompt_tokens: Option<usize>,
    response_tokens: Option<usize>,
}

fn outcome(d: &Debate, turn: u32) -> &'static str {
    if d.error.is_some() {
        return "dropped";
    }
    // A debate that ended early keeps its last answer (as `maporl eval` scores it).
    match d
        .decisions
        .get(turn as usize - 1)
        .or_else(|| d.decisions.last())
    {
        None => "none",
        Some(x) if x.len() == 1 && x[0] == d.task.reference => "right",
        Some(x) if x.contains(&d.task.reference) => "tie",
        Some(_) => "wrong",
    }
}

fn view<'a>(set: &'a str, d: &'a Debate) -> TaskView<'a> {
    let mut turns: Vec<TurnView> = Vec::new();
    for (i, u) in d.transcript.utterances.iter().enumerate() {
        let speech = d.speeches.get(i);
        let said = Said {
            agent: u.agent,
            text: &u.text,
            answer: u.answer.as_deref(),
            score: u.score,
            correct: u.correct,
            reward: d
                .rewards
                .iter()
                .find(|r| r.turn == u.turn && r.agent == u.agent),
            prompt: speech.map_or(&[], |s| s.messages.as_slice()),
            prompt_tokens: speech.map(|s| s.prompt_tokens),
            response_tokens: speech.map(|s| s.response_tokens),
        };
        match turns.last_mut() {
            Some(t) if t.turn == u.turn => t.said.push(said),
            _ => turns.push(TurnView {
                turn: u.turn,
                said: vec![said],
            }),
        }
    }
    let played = d.transcript.turns.max(turns.last().map_or(0, |t| t.turn));
    TaskView {
        set,
        key: if set.is_empty() {
            d.task.id.clone()
        } else {
            format!("{set}/{}", d.task.id)
        },
        id: &d.task.id,
        kind: &d.task.kind,
        question: &d.task.question,
        reference: &d.task.reference,
        fields: &d.task.fields,
        error: d.error.as_deref(),
        outcome: (1..=played).map(|t| outcome(d, t)).collect(),
        decisions: &d.decisions,
        turns,
    }
}

fn transcripts(s: &mut String, run: &Run) -> anyhow::Result<()> {
    s.push_str("<section id=\"transcripts\"><h2>Transcripts</h2>\n");
    // Every evaluation's transcripts, each debate tagged with its evaluation ("before",
    // "after"; "" for a single one), then any others (an SFT run's).
    let sets: Vec<(&str, &Vec<Debate>)> = run
        .evaluations
        .iter()
        .filter_map(|e| Some((e.name, e.debates.as_ref()?)))
        .chain(run.debates.as_ref().map(|d| ("", d)))
        .collect();
    if sets.is_empty() {
        absent(
            s,
            &format!(
                "No transcripts in this run directory: `maporl eval` writes {TRANSCRIPTS}, \
                 `maporl train` with held-out tasks writes transcripts-before.jsonl and \
                 transcripts-after.jsonl, SFT writes the debates it chose from."
            ),
        );
        s.push_str("</section>\n");
        return Ok(());
    }
    let debates: Vec<(&str, &Debate)> = sets
        .iter()
        .flat_map(|(name, ds)| ds.iter().map(move |d| (*name, d)))
        .collect();
    let data = Transcripts {
        turns: debates
            .iter()
            .map(|(_, d)| d.transcript.turns)
            .max()
            .unwrap_or(0),
        sets: sets
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| !n.is_empty())
            .collect(),
        tasks: debates.iter().map(|(set, d)| view(set, d)).collect(),
    };
    let _ = writeln!(
        s,
        r#"<div class="controls">
<label>task id <input id="filter-task" type="search" placeholder="part of an id"></label>
<label>team answer <select id="filter-outcome"><option value="all">any</option><option value="right">right</option><option value="wrong">wrong</option><option value="tie">tie with the gold answer</option><option value="dropped">dropped</option></select></label>
<label>after <select id="filter-turn"></select></label>
<label id="filter-set-label" hidden>evaluation <select id="filter-set"><option value="all">any</option></select></label>
<span id="count">{} debates</span>
</div>
<noscript><p class="absent">The transcript browser needs JavaScript; the transcripts are in {TRANSCRIPTS} beside this page.</p></noscript>
<div id="debates"></div>
<script type="application/json" id="transcript-data">{}</script>"#,
        debates.len(),
        json_for_script(&data)?
    );
    s.push_str("</section>\n");
    Ok(())
}

fn files(s: &mut String, run: &Run) {
    s.push_str("<section id=\"files\"><h2>Run files</h2>\n");
    for (name, text) in [("config.toml", &run.config), ("plugins.lock", &run.lock)] {
        match text {
            Some(t) => {
                let _ = writeln!(
                    s,
                    "<details><summary>{name}</summary><pre>{}</pre></details>",
                    escape(t)
                );
            }
            None => absent(s, &format!("No {name} in this run directory.")),
        }
    }
    if run.checkpoints.is_empty() {
        absent(s, "No checkpoints in this run directory.");
    } else {
        let names: Vec<String> = run.checkpoints.iter().map(|c| escape(c)).collect();
        let _ = writeln!(s, "<p>Checkpoints: {}</p>", names.join(", "));
    }
    s.push_str("</section>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_data_cannot_close_its_element() {
        let evil = "</script><!-- <script>alert(1)</script> & \u{2028}";
        let json = json_for_script(&evil).unwrap();
        assert!(
            !json.contains('<') && !json.contains('>') && !json.contains('&'),
            "{json}"
        );
        let back: String = serde_json::from_str(&json).unwrap();
        assert_eq!(back, evil);
        assert_eq!(
            escape(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }
}
