//! Plugin-call benchmark (not a test): the per-call latency (median and p99) of every
//! reference plugin on a 3-agent, 3-turn debate with ~1,200-character (~300-token) answers,
//! called three ways on the same payloads:
//!
//! - **wasm**: the built component (plugins/target/wasm32-wasip2/release/*.wasm) loaded with
//!   the host's API (`Protocol::load`, `Verifier::load`, `RewardShaper::load` on a `Runtime`)
//!   and called as a run calls it (conversion to the WIT records, fuel and deadline arming,
//!   the call, lifting and validating the result);
//! - **native**: the same plugin source compiled into this binary (each plugin's `lib.rs` is a
//!   module below) and called through the SDK trait on records built beforehand. (Not the
//!   plugin crates as path dependencies: they inherit `publish` from plugins/Cargo.toml, and
//!   cargo resolves that in this workspace's root, which has none. The SDK crate inherits
//!   nothing and is a dev-dependency.)
//! - **python**: `scripts/bench_plugins.py`, a port of the same logic, reads the payloads and
//!   the native outputs this bench writes, checks it computes the same outputs, and times it.
//!
//! Also timed: `restart(epoch)` of each plugin (a fresh instance, configured; once per
//! training step in a run), and a gsm8k `extract` of a 16-byte text (the fixed cost of a
//! call through the host). The learned verifier calls the host's `judge`: the runtime gets a
//! stub judge that returns 0.75 for every response (the native and Python sides get the same
//! stub), so its numbers leave out any model.
//!
//!   scripts/bench-plugins.sh                    # builds the plugins, runs this, then Python
//!   cargo bench -p maporl --bench plugins --features test-hooks
//!
//! Environment: MAPORL_BENCH_CALLS (timed calls per row, 2000), MAPORL_BENCH_WARMUP (untimed
//! calls first, 200), MAPORL_BENCH_SEED (the payloads' seed, 0), MAPORL_BENCH_PLUGINS (the
//! directory of built components), MAPORL_BENCH_ONLY (a comma-separated list of plugins,
//! e.g. "debate,gsm8k", for profiling; the JSON then has only their rows), MAPORL_BENCH_JSON
//! (a file to write the payloads, the native outputs and every number to, for
//! scripts/bench_plugins.py), MAPORL_BENCH_RESTARTS (timed restarts per plugin, a tenth of
//! the calls but at least 20; set it low when profiling the calls), MAPORL_BENCH_TEXTLESS
//! (set: every utterance's text is emptied, a projection of what the calls would cost if
//! the transcript carried no texts; the verifiers' rows then score empty responses),
//! MAPORL_BENCH_PYTHON (a directory with the Python SDK's builds of plugins/python's debate,
//! gsm8k and influence: their calls are timed beside the Rust components', on the same
//! payloads with the outputs checked equal, with a restart and a load that compiles and one
//! from the cache: a second table, and `ports.python` in the JSON), MAPORL_BENCH_JS (the
//! same for the JavaScript SDK's builds of plugins/js's, a directory holding `spidermonkey/`
//! and `quickjs/`, as tests/js_plugins.rs builds them into plugins/target/js: a table per
//! engine, `ports.js-spidermonkey` and `ports.js-quickjs`).

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use maporl::plugin::{Judge, Limits, Protocol, RewardShaper, Runtime, RuntimeOptions, Verifier};
use maporl::transcript as ht;
use maporl_plugin as sdk;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

// The reference plugins' own sources, compiled natively (their export macros expand to
// nothing outside wasm32). Bench targets build with cfg(test), so their unit tests' imports
// are compiled too, unused.
#[allow(dead_code, unused_imports)]
#[path = "../../plugins/verifiers/anli/src/lib.rs"]
mod anli;
#[allow(dead_code, unused_imports)]
#[path = "../../plugins/protocols/debate/src/lib.rs"]
mod debate;
#[allow(dead_code, unused_imports)]
#[path = "../../plugins/verifiers/exact-match/src/lib.rs"]
mod exact_match;
#[allow(dead_code, unused_imports)]
#[path = "../../plugins/shapers/final-only/src/lib.rs"]
mod final_only;
#[allow(dead_code, unused_imports)]
#[path = "../../plugins/verifiers/gsm8k/src/lib.rs"]
mod gsm8k;
#[allow(dead_code, unused_imports)]
#[path = "../../plugins/shapers/influence/src/lib.rs"]
mod influence;
#[allow(dead_code, unused_imports)]
#[path = "../../plugins/protocols/judge/src/lib.rs"]
mod judge;
#[allow(dead_code, unused_imports)]
#[path = "../../plugins/verifiers/learned/src/lib.rs"]
mod learned;
#[allow(dead_code, unused_imports)]
#[path = "../../plugins/protocols/round-robin/src/lib.rs"]
mod round_robin;

/// The learned verifier's stand-in: the same probability for every response.
const STUB_PROBABILITY: f32 = 0.75;

struct StubJudge;

impl Judge for StubJudge {
    fn judge(&self, _question: &str, responses: &[String]) -> Result<Vec<f32>, String> {
        Ok(vec![STUB_PROBABILITY; responses.len()])
    }
}

fn stub_judge(_question: &str, responses: &[String]) -> Result<Vec<f32>, String> {
    Ok(vec![STUB_PROBABILITY; responses.len()])
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------
// Payloads

/// Sentences of step-by-step reasoning, drawn to pad an answer to its length.
const FILLER: &[&str] = &[
    "Let me re-read the question to make sure I have every quantity right.",
    "I will write down each intermediate result before combining them.",
    "It helps to keep the units in mind: everything here is counted in whole items.",
    "Checking the multiplication once more by splitting it into tens and ones gives the same value.",
    "Nothing in the question says any items were returned or lost, so no subtraction is needed there.",
    "The word \"more\" refers to the difference from the first day, not a total.",
    "Half of an even number is a whole number, so the division comes out exactly.",
    "Adding the parts in a different order is a good way to catch a slip.",
    "I should be careful not to count the same day twice.",
    "A quick estimate: a few dozen boxes of a dozen muffins or so is several hundred muffins a day, so the total is in the hundreds or low thousands.",
    "Each step only uses numbers given in the question or computed above.",
    "So far the reasoning is consistent with the story in the problem.",
];

/// A GSM8K-like word problem with its integer answer.
struct Problem {
    question: String,
    a: i64,
    b: i64,
    c: i64,
    gold: i64,
}

fn problem(rng: &mut rand_chacha::ChaCha8Rng) -> Problem {
    let a = rng.random_range(12..40i64);
    let b = rng.random_range(3..15i64);
    let c = 2 * rng.random_range(3..9i64);
    let two_days = (a + (a + b)) * c;
    let gold = two_days + two_days / 2;
    let question = format!(
        "A bakery sells {a} boxes of muffins on Monday and {b} more boxes on Tuesday than on \
         Monday. Each box holds {c} muffins. On Wednesday the bakery sells half as many muffins \
         as on Monday and Tuesday combined. How many muffins does the bakery sell over the \
         three days?"
    );
    Problem {
        question,
        a,
        b,
        c,
        gold,
    }
}

/// Pads `steps` with filler sentences to about `target` characters, then the final line.
fn pad(rng: &mut rand_chacha::ChaCha8Rng, steps: Vec<String>, last: &str, target: usize) -> String {
    let mut text = steps.join(" ");
    while text.len() + last.len() + 2 < target {
        let s = FILLER[rng.random_range(0..FILLER.len())];
        // Insert between the steps' sentences, keeping the conclusion last.
        text.push(' ');
        text.push_str(s);
    }
    format!("{text}\n\n{last}")
}

/// One agent's answer to the problem; `mistake` forgets Wednesday.
fn gsm8k_answer(
    rng: &mut rand_chacha::ChaCha8Rng,
    p: &Problem,
    turn: u32,
    mistake: bool,
) -> String {
    let (a, b, c) = (p.a, p.b, p.c);
    let tuesday = a + b;
    let boxes = a + tuesday;
    let two_days = boxes * c;
    let wednesday = two_days / 2;
    let mut steps = Vec::new();
    if turn > 1 {
        steps.push(
            "I looked at the other agents' solutions and compared each step with mine.".into(),
        );
    }
    steps.push(format!(
        "On Monday the bakery sells {a} boxes. On Tuesday it sells {b} more than that, so {a} + {b} = {tuesday} boxes."
    ));
    steps.push(format!(
        "Together Monday and Tuesday come to {a} + {tuesday} = {boxes} boxes."
    ));
    steps.push(format!(
        "Each box holds {c} muffins, so those two days are {boxes} * {c} = {two_days} muffins."
    ));
    let answer = if mistake {
        steps.push(format!(
            "The question asks about the muffins sold, and I have {two_days} of them for the days with boxes, so that is the total."
        ));
        two_days
    } else {
        steps.push(format!(
            "On Wednesday it sells half of that, {two_days} / 2 = {wednesday} muffins."
        ));
        steps.push(format!(
            "Over the three days: {two_days} + {wednesday} = {} muffins.",
            two_days + wednesday
        ));
        two_days + wednesday
    };
    pad(rng, steps, &format!("Answer: \\boxed{{{answer}}}"), 1200)
}

fn anli_answer(rng: &mut rand_chacha::ChaCha8Rng, turn: u32, label: &str) -> String {
    let mut steps = vec![
        "The premise describes a man in a blue jacket repairing a bicycle on a busy sidewalk while two children watch.".to_string(),
        "The hypothesis says that someone is fixing a bike outdoors.".to_string(),
        "Repairing a bicycle is fixing a bike, and a sidewalk is outdoors, so every part of the hypothesis is covered.".to_string(),
    ];
    if turn > 1 {
        steps.insert(
            0,
            "I compared my reading with the other agents' answers.".into(),
        );
    }
    if label != "entailment" {
        steps.push("But the premise might describe a picture, and we cannot be sure the repair is real, so the hypothesis does not strictly follow.".into());
    }
    let filler = [
        "An entailment needs the hypothesis to be true whenever the premise is.",
        "A contradiction would need the two to be impossible together, which is not the case here.",
        "Neutral means the premise neither supports nor rules out the hypothesis.",
        "The children watching do not matter for the hypothesis.",
        "The colour of the jacket is also irrelevant.",
        "I should not assume facts that the premise does not state.",
    ];
    let last = format!("Answer: \\boxed{{{label}}}");
    let mut text = steps.join(" ");
    while text.len() + last.len() + 2 < 1200 {
        text.push(' ');
        text.push_str(filler[rng.random_range(0..filler.len())]);
    }
    format!("{text}\n\n{last}")
}

fn utterance(turn: u32, agent: u32, text: String, verdict: &ht::Verdict) -> ht::Utterance {
    ht::Utterance {
        turn,
        agent,
        text,
        answer: verdict.answer.clone(),
        score: verdict.score,
        correct: verdict.correct,
    }
}

/// Everything the rows are made of.
struct Payloads {
    gsm8k: ht::Task,
    anli: ht::Task,
    /// debate: every agent at every turn.
    debate: ht::Transcript,
    /// round-robin: agent t-1 at turn t.
    round_robin: ht::Transcript,
    /// judge: agents 0 and 1 debate at turns 1 and 2, agent 2 judges at turn 3.
    judged: ht::Transcript,
    anli_texts: Vec<String>,
}

fn payloads(seed: u64) -> Payloads {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let p = problem(&mut rng);
    let gsm8k = ht::Task {
        id: "gsm8k-bench-0".into(),
        kind: "gsm8k".into(),
        question: p.question.clone(),
        reference: p.gold.to_string(),
        fields: vec![],
    };
    let score = |text: &str| {
        let v = gsm8k::score(
            &Default::default(),
            &to_sdk_task(&gsm8k),
            &[text.to_string()],
        )
        .unwrap()
        .remove(0);
        from_sdk_verdict(v)
    };
    // Who slips at which turn: one agent at turns 1 and 2, nobody at turn 3.
    let mistakes = [[false, true, false], [false, false, true], [false; 3]];
    let mut utterances = Vec::new();
    for turn in 1..=3u32 {
        for agent in 0..3u32 {
            let text = gsm8k_answer(
                &mut rng,
                &p,
                turn,
                mistakes[turn as usize - 1][agent as usize],
            );
            let v = score(&text);
            utterances.push(utterance(turn, agent, text, &v));
        }
    }
    let debate = ht::Transcript {
        agents: 3,
        turns: 3,
        utterances: utterances.clone(),
    };
    let round_robin = ht::Transcript {
        agents: 3,
        turns: 3,
        utterances: utterances
            .iter()
            .filter(|u| u.agent == u.turn - 1)
            .cloned()
            .collect(),
    };
    let judged = ht::Transcript {
        agents: 3,
        turns: 3,
        utterances: utterances
            .iter()
            .filter(|u| {
                if u.turn < 3 {
                    u.agent < 2
                } else {
                    u.agent == 2
                }
            })
            .cloned()
            .collect(),
    };
    let premise = "A man in a blue jacket is repairing a bicycle on a busy sidewalk while two children watch.";
    let hypothesis = "Someone is fixing a bike outdoors.";
    let anli = ht::Task {
        id: "anli-bench-0".into(),
        kind: "anli".into(),
        question: format!("{premise} / {hypothesis}"),
        reference: "e".into(),
        fields: vec![
            ("premise".into(), premise.into()),
            ("hypothesis".into(), hypothesis.into()),
        ],
    };
    let anli_texts = ["entailment", "neutral", "entailment"]
        .iter()
        .map(|l| anli_answer(&mut rng, 1, l))
        .collect();
    Payloads {
        gsm8k,
        anli,
        debate,
        round_robin,
        judged,
        anli_texts,
    }
}

/// The utterances before `turn`: what the host passes to `plan-turn`.
fn before(t: &ht::Transcript, turn: u32) -> ht::Transcript {
    ht::Transcript {
        utterances: t
            .utterances
            .iter()
            .filter(|u| u.turn < turn)
            .cloned()
            .collect(),
        ..t.clone()
    }
}

/// The texts of one turn: what the host passes to `score`.
fn texts_at(t: &ht::Transcript, turn: u32) -> Vec<String> {
    t.utterances
        .iter()
        .filter(|u| u.turn == turn)
        .map(|u| u.text.clone())
        .collect()
}

// ---------------------------------------------------------------------------------------
// The host's records and the SDK's (plain structs natively)

fn to_sdk_task(t: &ht::Task) -> sdk::Task {
    sdk::Task {
        id: t.id.clone(),
        kind: t.kind.clone(),
        question: t.question.clone(),
        reference: t.reference.clone(),
        fields: t.fields.clone(),
    }
}

fn to_sdk_transcript(t: &ht::Transcript) -> sdk::Transcript {
    sdk::Transcript {
        agents: t.agents,
        turns: t.turns,
        utterances: t
            .utterances
            .iter()
            .map(|u| sdk::Utterance {
                turn: u.turn,
                agent: u.agent,
                text: u.text.clone(),
                answer: u.answer.clone(),
                score: u.score,
                correct: u.correct,
            })
            .collect(),
    }
}

fn from_sdk_prompts(plan: Vec<sdk::Prompt>) -> Vec<ht::Prompt> {
    plan.into_iter()
        .map(|p| ht::Prompt {
            agent: p.agent,
            messages: p
                .messages
                .into_iter()
                .map(|m| ht::ChatMessage {
                    role: match m.role {
                        sdk::Role::System => ht::Role::System,
                        sdk::Role::User => ht::Role::User,
                        sdk::Role::Assistant => ht::Role::Assistant,
                    },
                    content: m.content,
                })
                .collect(),
        })
        .collect()
}

fn from_sdk_verdict(v: sdk::Verdict) -> ht::Verdict {
    ht::Verdict {
        answer: v.answer,
        score: v.score,
        correct: v.correct,
    }
}

fn from_sdk_rewards(r: Vec<sdk::Reward>) -> Vec<ht::Reward> {
    r.into_iter()
        .map(|r| ht::Reward {
            turn: r.turn,
            agent: r.agent,
            total: r.total,
            parts: r.parts,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Timing

#[derive(Clone, Copy)]
struct Stats {
    median_ns: f64,
    p99_ns: f64,
    mean_ns: f64,
}

fn stats(mut ns: Vec<u64>) -> Stats {
    ns.sort_unstable();
    let n = ns.len();
    Stats {
        median_ns: if n % 2 == 1 {
            ns[n / 2] as f64
        } else {
            (ns[n / 2 - 1] + ns[n / 2]) as f64 / 2.0
        },
        p99_ns: ns[((n * 99).div_ceil(100)).max(1) - 1] as f64,
        mean_ns: ns.iter().sum::<u64>() as f64 / n as f64,
    }
}

fn stats_json(s: &Stats) -> Value {
    json!({"median_ns": s.median_ns, "p99_ns": s.p99_ns, "mean_ns": s.mean_ns})
}

struct Timer {
    warmup: usize,
    calls: usize,
}

impl Timer {
    /// Times every call of `f` on its own (its result dropped inside the timed span).
    fn time<R>(&self, mut f: impl FnMut() -> R) -> Stats {
        for _ in 0..self.warmup {
            std::hint::black_box(f());
        }
        let mut ns = Vec::with_capacity(self.calls);
        for _ in 0..self.calls {
            let t = Instant::now();
            let r = f();
            drop(std::hint::black_box(r));
            ns.push(t.elapsed().as_nanos() as u64);
        }
        stats(ns)
    }
}

/// One row of the table.
struct Row {
    plugin: &'static str,
    call: String,
    wasm: Stats,
    native: Option<Stats>,
    fuel: Option<u64>,
    /// What the Python port is given, and the native output it must reproduce.
    case: Option<Value>,
}

fn fmt_us(ns: f64) -> String {
    let us = ns / 1000.0;
    if us < 10.0 {
        format!("{us:.2}")
    } else if us < 100.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.0}")
    }
}

// ---------------------------------------------------------------------------------------

fn main() -> anyhow::Result<()> {
    let timer = Timer {
        warmup: env_usize("MAPORL_BENCH_WARMUP", 200),
        calls: env_usize("MAPORL_BENCH_CALLS", 2000).max(1),
    };
    let seed = env_usize("MAPORL_BENCH_SEED", 0) as u64;
    let only = std::env::var("MAPORL_BENCH_ONLY").unwrap_or_default();
    let wanted = |name: &str| only.is_empty() || only.split(',').any(|o| o.trim() == name);
    let dir = std::env::var_os("MAPORL_BENCH_PLUGINS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../plugins/target/wasm32-wasip2/release")
        });
    let path = |name: &str| {
        let p = dir.join(format!("{name}.wasm"));
        assert!(
            p.is_file(),
            "{} is missing: build the plugins first (cargo build --release --target \
             wasm32-wasip2 --manifest-path plugins/Cargo.toml --target-dir plugins/target)",
            p.display()
        );
        p
    };
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: None,
        seed: 0,
        log: Arc::new(|_, _, _| {}),
        judge: Some(Arc::new(StubJudge)),
    })?;
    let limits = Limits::default();
    let mut p = payloads(seed);
    // A projection, not a payload: see MAPORL_BENCH_TEXTLESS above.
    if std::env::var_os("MAPORL_BENCH_TEXTLESS").is_some() {
        for t in [&mut p.debate, &mut p.round_robin, &mut p.judged] {
            for u in &mut t.utterances {
                u.text.clear();
            }
        }
    }
    let chars: Vec<usize> = p.debate.utterances.iter().map(|u| u.text.len()).collect();
    eprintln!(
        "payload: 3 agents x 3 turns, answers of {}..{} bytes; gold {}; {} timed calls per row \
         after {} warm-up calls",
        chars.iter().min().unwrap(),
        chars.iter().max().unwrap(),
        p.gsm8k.reference,
        timer.calls,
        timer.warmup
    );

    // The timer's own cost (two reads of the clock), for reading the native numbers.
    let clock = timer.time(|| ());

    let mut rows: Vec<Row> = Vec::new();
    let mut restarts: Vec<(&'static str, Stats)> = Vec::new();
    let restart_calls = env_usize("MAPORL_BENCH_RESTARTS", (timer.calls / 10).max(20)).max(1);
    let restart_timer = Timer {
        warmup: 5,
        calls: restart_calls,
    };

    // --- protocols ----------------------------------------------------------------------
    let gtask = to_sdk_task(&p.gsm8k);
    type Plan = Box<dyn Fn(&sdk::Task, u32, &sdk::Transcript) -> Vec<sdk::Prompt>>;
    type Decide = Box<dyn Fn(&sdk::Task, u32, &sdk::Transcript) -> Vec<String>>;
    /// The SDK trait's calls on one instance built beforehand, as the wasm export makes them.
    fn protocol<P: sdk::Protocol>(settings: P::Settings) -> (Plan, Decide) {
        let plugin = Rc::new(P::new(settings).unwrap());
        let planner = plugin.clone();
        (
            Box::new(move |t, turn, tr| planner.plan_turn(t, turn, tr).unwrap()),
            Box::new(move |t, turn, tr| plugin.decide(t, turn, tr).unwrap()),
        )
    }
    let protocols: [(&'static str, &ht::Transcript, (Plan, Decide)); 3] = [
        (
            "debate",
            &p.debate,
            protocol::<debate::Debate>(Default::default()),
        ),
        (
            "round_robin",
            &p.round_robin,
            protocol::<round_robin::RoundRobin>(Default::default()),
        ),
        (
            "judge",
            &p.judged,
            protocol::<judge::Judge>(Default::default()),
        ),
    ];
    for (name, full, (plan, decide)) in protocols {
        if !wanted(name) {
            continue;
        }
        let mut plugin = Protocol::load(&runtime, &path(name), &json!({}), &limits)?;
        for turn in 1..=3u32 {
            let seen = before(full, turn);
            let (stask, sseen) = (to_sdk_task(&p.gsm8k), to_sdk_transcript(&seen));
            let native_out = from_sdk_prompts(plan(&stask, turn, &sseen));
            let wasm_out = plugin.plan_turn(&p.gsm8k, turn, &seen)?;
            assert_eq!(
                wasm_out, native_out,
                "{name} plan-turn {turn}: wasm != native"
            );
            let wasm = timer.time(|| plugin.plan_turn(&p.gsm8k, turn, &seen).unwrap());
            let fuel = plugin.fuel_used();
            let native = timer.time(|| plan(&gtask, turn, &sseen));
            rows.push(Row {
                plugin: name,
                call: format!("plan_turn t={turn}"),
                wasm,
                native: Some(native),
                fuel: Some(fuel),
                case: Some(json!({
                    "kind": "plan", "protocol": name, "task": p.gsm8k, "turn": turn,
                    "transcript": seen, "output": native_out,
                })),
            });
        }
        let sfull = to_sdk_transcript(full);
        let native_out = decide(&gtask, 3, &sfull);
        assert_eq!(
            plugin.decide(&p.gsm8k, 3, full)?,
            native_out,
            "{name} decide"
        );
        let wasm = timer.time(|| plugin.decide(&p.gsm8k, 3, full).unwrap());
        let fuel = plugin.fuel_used();
        let native = timer.time(|| decide(&gtask, 3, &sfull));
        rows.push(Row {
            plugin: name,
            call: "decide t=3".into(),
            wasm,
            native: Some(native),
            fuel: Some(fuel),
            case: Some(json!({
                "kind": "decide", "protocol": name, "task": p.gsm8k, "turn": 3,
                "transcript": full, "output": native_out,
            })),
        });
        let mut epoch = 0;
        restarts.push((
            name,
            restart_timer.time(|| {
                epoch += 1;
                plugin.restart(epoch).unwrap()
            }),
        ));
    }

    // --- verifiers ----------------------------------------------------------------------
    type Score = Box<dyn Fn(&sdk::Task, &[String]) -> Vec<sdk::Verdict>>;
    type Extract = Box<dyn Fn(&sdk::Task, &str) -> Option<String>>;
    let gsm8k_texts = texts_at(&p.debate, 1);
    /// The SDK trait's calls on one instance built beforehand.
    fn verifier<V: sdk::Verifier>(settings: V::Settings) -> (Score, Extract) {
        let plugin = Rc::new(V::new(settings).unwrap());
        let scorer = plugin.clone();
        (
            Box::new(move |t, r| scorer.score(t, r).unwrap()),
            Box::new(move |t, x| plugin.extract(t, x).unwrap()),
        )
    }
    // `Learned::new` asks the host whether a judge exists, which natively is a stub that
    // panics: its rows call the crate's functions, with the stub judge passed in.
    let learned_settings = Rc::new(learned::Settings::default());
    let learned_extract = learned_settings.clone();
    let learned: (Score, Extract) = (
        Box::new(move |t, r| learned::score(&learned_settings, t, r, stub_judge).unwrap()),
        Box::new(move |t, x| learned::extract(&learned_extract, t, x)),
    );
    type VerifierRow<'a> = (&'static str, &'a ht::Task, &'a [String], (Score, Extract));
    let verifiers: Vec<VerifierRow> = vec![
        (
            "gsm8k",
            &p.gsm8k,
            &gsm8k_texts,
            verifier::<gsm8k::Gsm8k>(Default::default()),
        ),
        (
            "anli",
            &p.anli,
            &p.anli_texts,
            verifier::<anli::Anli>(Default::default()),
        ),
        (
            "exact_match",
            &p.gsm8k,
            &gsm8k_texts,
            verifier::<exact_match::ExactMatch>(Default::default()),
        ),
        ("learned", &p.gsm8k, &gsm8k_texts, learned),
    ];
    for (name, task, texts, (score, extract)) in verifiers {
        if !wanted(name) {
            continue;
        }
        let mut plugin = Verifier::load(&runtime, &path(name), &json!({}), &limits)?;
        let stask = to_sdk_task(task);
        let native_out: Vec<ht::Verdict> = score(&stask, texts)
            .into_iter()
            .map(from_sdk_verdict)
            .collect();
        assert_eq!(plugin.score(task, texts)?, native_out, "{name} score");
        // The host bounds how many responses one debate (task) may have judged between
        // restarts; the learned verifier restarts (untimed) every 1000 calls, as a run
        // restarts plugins every step.
        let wasm = if name == "learned" {
            let mut ns = Vec::new();
            let mut epoch = 0;
            while ns.len() < timer.calls {
                epoch += 1;
                plugin.restart(epoch)?;
                for _ in 0..2 {
                    std::hint::black_box(plugin.score(task, texts).unwrap());
                }
                for _ in 0..1000.min(timer.calls - ns.len()) {
                    let t = Instant::now();
                    let r = plugin.score(task, texts).unwrap();
                    drop(std::hint::black_box(r));
                    ns.push(t.elapsed().as_nanos() as u64);
                }
            }
            stats(ns)
        } else {
            timer.time(|| plugin.score(task, texts).unwrap())
        };
        let fuel = plugin.fuel_used();
        let native = timer.time(|| score(&stask, texts));
        rows.push(Row {
            plugin: name,
            call: "score 3".into(),
            wasm,
            native: Some(native),
            fuel: Some(fuel),
            case: Some(json!({
                "kind": "score", "verifier": name, "task": task, "responses": texts,
                "output": native_out,
            })),
        });
        let text = &texts[0];
        let native_out = extract(&stask, text);
        assert_eq!(plugin.extract(task, text)?, native_out, "{name} extract");
        let wasm = timer.time(|| plugin.extract(task, text).unwrap());
        let fuel = plugin.fuel_used();
        let native = timer.time(|| extract(&stask, text));
        rows.push(Row {
            plugin: name,
            call: "extract".into(),
            wasm,
            native: Some(native),
            fuel: Some(fuel),
            case: Some(json!({
                "kind": "extract", "verifier": name, "task": task, "text": text,
                "output": native_out,
            })),
        });
        if name == "gsm8k" {
            // The fixed cost of one call through the host: a 16-byte text.
            let short = "so \\boxed{1234}.";
            let native_out = extract(&stask, short);
            let wasm = timer.time(|| plugin.extract(task, short).unwrap());
            let fuel = plugin.fuel_used();
            let native = timer.time(|| extract(&stask, short));
            rows.push(Row {
                plugin: name,
                call: "extract 16 B".into(),
                wasm,
                native: Some(native),
                fuel: Some(fuel),
                case: Some(json!({
                    "kind": "extract", "verifier": name, "task": task, "text": short,
                    "output": native_out,
                })),
            });
        }
        let mut epoch = 0;
        restarts.push((
            name,
            restart_timer.time(|| {
                epoch += 1;
                plugin.restart(epoch).unwrap()
            }),
        ));
    }

    // --- reward shapers -----------------------------------------------------------------
    type Shape = Box<dyn Fn(&sdk::Task, &sdk::Transcript) -> Vec<sdk::Reward>>;
    fn shaper<S: sdk::RewardShaper>(settings: S::Settings) -> Shape {
        let plugin = S::new(settings).unwrap();
        Box::new(move |t, tr| plugin.shape(t, tr).unwrap())
    }
    let shapers: [(&'static str, Shape); 2] = [
        (
            "influence",
            shaper::<influence::Influence>(Default::default()),
        ),
        (
            "final_only",
            shaper::<final_only::FinalOnly>(Default::default()),
        ),
    ];
    let sdebate = to_sdk_transcript(&p.debate);
    for (name, shape) in shapers {
        if !wanted(name) {
            continue;
        }
        let mut plugin = RewardShaper::load(&runtime, &path(name), &json!({}), &limits)?;
        let native_out = from_sdk_rewards(shape(&gtask, &sdebate));
        assert_eq!(
            plugin.shape(&p.gsm8k, &p.debate)?,
            native_out,
            "{name} shape"
        );
        let wasm = timer.time(|| plugin.shape(&p.gsm8k, &p.debate).unwrap());
        let fuel = plugin.fuel_used();
        let native = timer.time(|| shape(&gtask, &sdebate));
        rows.push(Row {
            plugin: name,
            call: "shape 3x3".into(),
            wasm,
            native: Some(native),
            fuel: Some(fuel),
            case: Some(json!({
                "kind": "shape", "shaper": name, "task": p.gsm8k, "transcript": p.debate,
                "output": native_out,
            })),
        });
        let mut epoch = 0;
        restarts.push((
            name,
            restart_timer.time(|| {
                epoch += 1;
                plugin.restart(epoch).unwrap()
            }),
        ));
    }
    for (name, s) in restarts {
        rows.push(Row {
            plugin: name,
            call: "restart".into(),
            wasm: s,
            native: None,
            fuel: None,
            case: None,
        });
    }

    // Ports of the reference plugins to other languages: (key, column label, directory).
    let mut port_dirs = Vec::new();
    if let Some(dir) = std::env::var_os("MAPORL_BENCH_PYTHON") {
        port_dirs.push(("python", "Python", PathBuf::from(dir)));
    }
    if let Some(dir) = std::env::var_os("MAPORL_BENCH_JS") {
        let dir = PathBuf::from(dir);
        port_dirs.push(("js-spidermonkey", "JS-SM", dir.join("spidermonkey")));
        port_dirs.push(("js-quickjs", "JS-QJS", dir.join("quickjs")));
    }
    let mut ports = Vec::new();
    for (key, label, dir) in port_dirs {
        let rows = port_rows(label, &dir, &path, &p, &timer, &restart_timer)?;
        ports.push((key, label, rows));
    }

    // --- output -------------------------------------------------------------------------
    println!(
        "{:<12} {:<14} {:>17} {:>17} {:>9} {:>10}",
        "plugin", "call", "wasm med/p99 us", "native med/p99 us", "wasm/nat", "fuel"
    );
    for r in &rows {
        let native = r.native.map_or("-".into(), |n| {
            format!("{} / {}", fmt_us(n.median_ns), fmt_us(n.p99_ns))
        });
        let ratio = r.native.map_or("-".into(), |n| {
            format!("{:.1}x", r.wasm.median_ns / n.median_ns)
        });
        println!(
            "{:<12} {:<14} {:>17} {:>17} {:>9} {:>10}",
            r.plugin,
            r.call,
            format!("{} / {}", fmt_us(r.wasm.median_ns), fmt_us(r.wasm.p99_ns)),
            native,
            ratio,
            r.fuel.map_or("-".into(), |f| f.to_string())
        );
    }
    for (_, label, rows) in &ports {
        println!(
            "\n{:<10} {:<16} {:>17} {:>17} {:>8} {:>11} {:>11}",
            "plugin",
            "call",
            "Rust med/p99 us",
            format!("{label} med/p99 us"),
            "x Rust",
            "Rust fuel",
            format!("{label} fuel"),
        );
        for r in rows {
            let both = |s: &Stats| format!("{} / {}", fmt_us(s.median_ns), fmt_us(s.p99_ns));
            println!(
                "{:<10} {:<16} {:>17} {:>17} {:>7.1}x {:>11} {:>11}",
                r.plugin,
                r.call,
                both(&r.rust),
                both(&r.port),
                r.port.median_ns / r.rust.median_ns,
                r.fuel.0.map_or("-".into(), |f| f.to_string()),
                r.fuel.1.map_or("-".into(), |f| f.to_string()),
            );
        }
    }
    println!(
        "clock: {:.0} ns per timed span (median; included in every number above)",
        clock.median_ns
    );
    if let Some(out) = std::env::var_os("MAPORL_BENCH_JSON") {
        let doc = json!({
            "calls": timer.calls,
            "warmup": timer.warmup,
            "restart_calls": restart_calls,
            "seed": seed,
            "stub_probability": STUB_PROBABILITY,
            "clock_ns": clock.median_ns,
            "rows": rows.iter().map(|r| json!({
                "plugin": r.plugin,
                "call": r.call,
                "wasm": stats_json(&r.wasm),
                "native": r.native.as_ref().map(stats_json),
                "fuel": r.fuel,
                "case": r.case,
            })).collect::<Vec<_>>(),
            "ports": ports.iter().map(|(key, _, rows)| (key.to_string(), rows.iter().map(|r| json!({
                "plugin": r.plugin,
                "call": r.call,
                "rust": stats_json(&r.rust),
                "port": stats_json(&r.port),
                "fuel": [r.fuel.0, r.fuel.1],
            })).collect::<Value>())).collect::<serde_json::Map<_, _>>(),
        });
        std::fs::write(&out, serde_json::to_string(&doc)?)?;
        eprintln!("wrote {}", PathBuf::from(out).display());
    }
    Ok(())
}

/// One call timed on the Rust component and on its port to another language.
struct PortRow {
    plugin: &'static str,
    call: &'static str,
    rust: Stats,
    port: Stats,
    /// Fuel of the last call: Rust, the port.
    fuel: (Option<u64>, Option<u64>),
}

/// The ports' components in `dir` (debate, gsm8k and influence, in Python or JavaScript)
/// beside the Rust ones (`rust(name)`): each call on the same payloads (the outputs must be
/// equal), a restart, and a load that compiles and one that reads the compiled-component
/// cache (one sample each).
fn port_rows(
    label: &str,
    dir: &Path,
    rust: &dyn Fn(&str) -> PathBuf,
    p: &Payloads,
    timer: &Timer,
    restart_timer: &Timer,
) -> anyhow::Result<Vec<PortRow>> {
    let port = |name: &str| {
        let f = dir.join(format!("{name}.wasm"));
        assert!(
            f.is_file(),
            "{label}: {} is missing: the tests build it (tests/python_plugins.rs into \
             plugins/target/python, tests/js_plugins.rs into plugins/target/js/ENGINE)",
            f.display(),
        );
        f
    };
    let runtime = |cache_dir: Option<PathBuf>| {
        Runtime::new(RuntimeOptions {
            cache_dir,
            seed: 0,
            log: Arc::new(|_, _, _| {}),
            judge: None,
        })
    };
    let rt = runtime(None)?;
    let limits = Limits::default();
    let mut rows = Vec::new();
    let once = |f: &mut dyn FnMut() -> anyhow::Result<()>| -> anyhow::Result<Stats> {
        let t = Instant::now();
        f()?;
        Ok(stats(vec![t.elapsed().as_nanos() as u64]))
    };
    // Loads of the verifier: compiling (no cache), then from a fresh cache's second load.
    let mut loads = Vec::new();
    for file in [rust("gsm8k"), port("gsm8k")] {
        let compiled = once(&mut || {
            Verifier::load(&rt, &file, &json!({}), &limits)?;
            Ok(())
        })?;
        let cache = tempfile::tempdir()?;
        let cached_rt = runtime(Some(cache.path().to_path_buf()))?;
        Verifier::load(&cached_rt, &file, &json!({}), &limits)?;
        let cached = once(&mut || {
            Verifier::load(&cached_rt, &file, &json!({}), &limits)?;
            Ok(())
        })?;
        loads.push((compiled, cached));
    }
    let (rust_loads, port_loads) = (loads.remove(0), loads.remove(0));
    rows.push(PortRow {
        plugin: "gsm8k",
        call: "load, compiling",
        rust: rust_loads.0,
        port: port_loads.0,
        fuel: (None, None),
    });
    rows.push(PortRow {
        plugin: "gsm8k",
        call: "load, cached",
        rust: rust_loads.1,
        port: port_loads.1,
        fuel: (None, None),
    });

    let seen = before(&p.debate, 3);
    let mut protocols =
        [rust("debate"), port("debate")].map(|f| Protocol::load(&rt, &f, &json!({}), &limits));
    let [Ok(rs), Ok(other)] = &mut protocols else {
        anyhow::bail!("loading the debate protocols failed");
    };
    assert_eq!(
        rs.plan_turn(&p.gsm8k, 3, &seen)?,
        other.plan_turn(&p.gsm8k, 3, &seen)?,
        "{label}: debate plan-turn differs from Rust's"
    );
    assert_eq!(
        rs.decide(&p.gsm8k, 3, &p.debate)?,
        other.decide(&p.gsm8k, 3, &p.debate)?
    );
    let mut both = |call, f: &mut dyn FnMut(&mut Protocol)| {
        let rust = timer.time(|| f(rs));
        let rust_fuel = rs.fuel_used();
        let theirs = timer.time(|| f(other));
        rows.push(PortRow {
            plugin: "debate",
            call,
            rust,
            port: theirs,
            fuel: (Some(rust_fuel), Some(other.fuel_used())),
        });
    };
    both("plan_turn t=3", &mut |x| {
        x.plan_turn(&p.gsm8k, 3, &seen).unwrap();
    });
    both("decide t=3", &mut |x| {
        x.decide(&p.gsm8k, 3, &p.debate).unwrap();
    });
    both("restart", &mut |x| {
        x.restart(7).unwrap();
    });

    let texts = texts_at(&p.debate, 1);
    let mut verifiers =
        [rust("gsm8k"), port("gsm8k")].map(|f| Verifier::load(&rt, &f, &json!({}), &limits));
    let [Ok(rs), Ok(other)] = &mut verifiers else {
        anyhow::bail!("loading the gsm8k verifiers failed");
    };
    assert_eq!(rs.score(&p.gsm8k, &texts)?, other.score(&p.gsm8k, &texts)?);
    let mut both = |call, f: &mut dyn FnMut(&mut Verifier)| {
        let rust = timer.time(|| f(rs));
        let rust_fuel = rs.fuel_used();
        let theirs = timer.time(|| f(other));
        rows.push(PortRow {
            plugin: "gsm8k",
            call,
            rust,
            port: theirs,
            fuel: (Some(rust_fuel), Some(other.fuel_used())),
        });
    };
    both("score 3", &mut |x| {
        x.score(&p.gsm8k, &texts).unwrap();
    });
    both("extract", &mut |x| {
        x.extract(&p.gsm8k, &texts[0]).unwrap();
    });

    let mut shapers = [rust("influence"), port("influence")]
        .map(|f| RewardShaper::load(&rt, &f, &json!({}), &limits));
    let [Ok(rs), Ok(other)] = &mut shapers else {
        anyhow::bail!("loading the influence shapers failed");
    };
    assert_eq!(
        rs.shape(&p.gsm8k, &p.debate)?,
        other.shape(&p.gsm8k, &p.debate)?
    );
    let rust = timer.time(|| rs.shape(&p.gsm8k, &p.debate).unwrap());
    let rust_fuel = rs.fuel_used();
    let theirs = timer.time(|| other.shape(&p.gsm8k, &p.debate).unwrap());
    rows.push(PortRow {
        plugin: "influence",
        call: "shape 3x3",
        rust,
        port: theirs,
        fuel: (Some(rust_fuel), Some(other.fuel_used())),
    });
    let mut epoch = 0;
    let rust = restart_timer.time(|| {
        epoch += 1;
        rs.restart(epoch).unwrap()
    });
    let theirs = restart_timer.time(|| {
        epoch += 1;
        other.restart(epoch).unwrap()
    });
    rows.push(PortRow {
        plugin: "influence",
        call: "restart",
        rust,
        port: theirs,
        fuel: (None, None),
    });
    Ok(rows)
}
