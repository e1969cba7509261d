//! Every reference plugin, through wasmtime as a run uses it: protocols' plans and decisions,
//! verifiers' extraction and scores, reward shapers' numbers (the paper's worked example
//! exactly), and the fuel they use against the default budget.

mod support;

use maporl::debate::{self, Plugins, ScriptedTeam};
use maporl::plugin::{Limits, Protocol, RewardShaper, Verifier};
use maporl::transcript::{Role, Transcript};
use serde_json::{json, Value};
use support::*;

fn protocol(name: &str, settings: Value) -> Protocol {
    let (rt, _, _c) = runtime();
    Protocol::load(&rt, &plugin(name), &settings, &Limits::default()).expect("loads")
}

fn verifier(name: &str, settings: Value) -> Verifier {
    let (rt, _, _c) = runtime();
    Verifier::load(&rt, &plugin(name), &settings, &Limits::default()).expect("loads")
}

fn shaper(name: &str, settings: Value) -> RewardShaper {
    let (rt, _, _c) = runtime();
    RewardShaper::load(&rt, &plugin(name), &settings, &Limits::default()).expect("loads")
}

fn two_turns() -> Transcript {
    transcript(
        2,
        3,
        vec![
            utterance(1, 0, Some("12"), 1.0, true),
            utterance(1, 1, Some("13"), 0.0, false),
        ],
    )
}

#[test]
fn debate_turn_one_asks_everyone_and_later_turns_show_peers_and_own_history() {
    let mut p = protocol("debate", json!({}));
    let t = task("q1", "gsm8k", "What is 5 + 7?", "12");
    let plan = p.plan_turn(&t, 1, &transcript(2, 3, vec![])).unwrap();
    assert_eq!(plan.iter().map(|p| p.agent).collect::<Vec<_>>(), vec![0, 1]);
    let first = &plan[0].messages;
    assert_eq!(first.len(), 1);
    assert!(
        first[0].content.contains("Question: What is 5 + 7?"),
        "{}",
        first[0].content
    );
    assert!(first[0].content.contains("\\boxed{N}"));

    let plan = p.plan_turn(&t, 2, &two_turns()).unwrap();
    let agent0 = &plan[0].messages;
    // Own history as a chat: user turn-1 prompt, its own answer, then the follow-up.
    assert_eq!(
        agent0.iter().map(|m| m.role).collect::<Vec<_>>(),
        vec![Role::User, Role::Assistant, Role::User]
    );
    assert!(
        agent0[1].content.contains("\\boxed{12}"),
        "own answer: {}",
        agent0[1].content
    );
    let follow = &agent0[2].content;
    assert!(
        follow.contains("Agent 2: ") && follow.contains("\\boxed{13}"),
        "peer shown: {follow}"
    );
    assert!(
        !follow.contains("\\boxed{12}"),
        "its own answer is not shown as a peer's: {follow}"
    );
    assert!(!follow.contains("Reward:"), "scores are off by default");
    assert!(follow.contains("What is 5 + 7?"), "the question again");
}

#[test]
fn the_protocol_never_sees_the_gold_answer() {
    let mut p = protocol("debate", json!({}));
    let t = task("q1", "gsm8k", "What is 5 + 7?", "987654321");
    for turn in [1, 2] {
        let history = if turn == 1 {
            transcript(2, 3, vec![])
        } else {
            two_turns()
        };
        for prompt in p.plan_turn(&t, turn, &history).unwrap() {
            assert!(prompt
                .messages
                .iter()
                .all(|m| !m.content.contains("987654321")));
        }
    }
}

#[test]
fn debate_options_scores_early_stop_and_peers() {
    let t = task("q1", "gsm8k", "What is 5 + 7?", "12");
    let mut p = protocol("debate", json!({"show_scores": true}));
    let follow = p.plan_turn(&t, 2, &two_turns()).unwrap()[0].messages[2]
        .content
        .clone();
    assert!(follow.contains("Reward: 0.000 out of 1.0"), "{follow}");

    let mut p = protocol("debate", json!({"early_stop": true}));
    let agree = transcript(
        2,
        3,
        vec![
            utterance(1, 0, Some("12"), 1.0, true),
            utterance(1, 1, Some("12"), 1.0, true),
        ],
    );
    assert!(
        p.plan_turn(&t, 2, &agree).unwrap().is_empty(),
        "consensus ends the debate"
    );
    assert_eq!(
        p.plan_turn(&t, 2, &two_turns()).unwrap().len(),
        2,
        "disagreement goes on"
    );

    let mut p = protocol("debate", json!({"peers": 1}));
    let three = transcript(
        3,
        3,
        vec![
            utterance(1, 0, Some("1"), 0.0, false),
            utterance(1, 1, Some("2"), 0.0, false),
            utterance(1, 2, Some("3"), 0.0, false),
        ],
    );
    let plan = p.plan_turn(&t, 2, &three).unwrap();
    let shown = &plan[0].messages.last().unwrap().content;
    assert!(
        shown.contains("Agent 2") && !shown.contains("Agent 3"),
        "one peer, the next one: {shown}"
    );
}

#[test]
fn decide_is_a_majority_vote_with_the_papers_tie_rule() {
    let mut p = protocol("debate", json!({}));
    let t = task("q1", "gsm8k", "q", "12");
    let decide = |p: &mut Protocol, answers: &[Option<&str>]| {
        let us = answers
            .iter()
            .enumerate()
            .map(|(a, ans)| utterance(1, a as u32, *ans, 0.0, false))
            .collect();
        p.decide(&t, 1, &transcript(answers.len() as u32, 3, us))
            .unwrap()
    };
    assert_eq!(
        decide(&mut p, &[Some("12"), Some("12"), Some("13")]),
        vec!["12"]
    );
    assert_eq!(
        decide(&mut p, &[Some("12"), Some("13")]),
        vec!["12", "13"],
        "a tie"
    );
    assert_eq!(
        decide(&mut p, &[Some("12"), None]),
        vec!["12"],
        "invalid never wins a tie"
    );
    assert!(
        decide(&mut p, &[None, None, Some("12")]).is_empty(),
        "invalid has the most votes"
    );
}

#[test]
fn round_robin_lets_one_agent_speak_per_turn_seeing_everything_before() {
    let mut p = protocol("round_robin", json!({}));
    let t = task("q1", "gsm8k", "What is 5 + 7?", "12");
    let plan = p.plan_turn(&t, 1, &transcript(2, 3, vec![])).unwrap();
    assert_eq!(plan.iter().map(|p| p.agent).collect::<Vec<_>>(), vec![0]);
    let history = transcript(2, 3, vec![utterance(1, 0, Some("12"), 1.0, true)]);
    let plan = p.plan_turn(&t, 2, &history).unwrap();
    assert_eq!(plan.iter().map(|p| p.agent).collect::<Vec<_>>(), vec![1]);
    let seen: String = plan[0]
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect();
    assert!(
        seen.contains("\\boxed{12}"),
        "agent 1 sees agent 0's answer: {seen}"
    );
}

#[test]
fn judge_protocol_lets_the_designated_agent_answer_last() {
    let mut p = protocol("judge", json!({"judge": 2}));
    let t = task("q1", "gsm8k", "What is 5 + 7?", "12");
    let plan = p.plan_turn(&t, 1, &transcript(3, 2, vec![])).unwrap();
    assert_eq!(
        plan.iter().map(|p| p.agent).collect::<Vec<_>>(),
        vec![0, 1],
        "the judge is silent"
    );
    let debated = transcript(
        3,
        2,
        vec![
            utterance(1, 0, Some("12"), 1.0, true),
            utterance(1, 1, Some("13"), 0.0, false),
        ],
    );
    let plan = p.plan_turn(&t, 2, &debated).unwrap();
    assert_eq!(plan.iter().map(|p| p.agent).collect::<Vec<_>>(), vec![2]);
    let mut judged = debated.clone();
    judged
        .utterances
        .push(utterance(2, 2, Some("13"), 0.0, false));
    assert_eq!(
        p.decide(&t, 2, &judged).unwrap(),
        vec!["13"],
        "the judge's answer is final"
    );
    let mut bad = protocol("judge", json!({"judge": 5}));
    let err = bad.plan_turn(&t, 1, &transcript(3, 2, vec![])).unwrap_err();
    assert!(err.to_string().contains('5'), "{err}");
}

#[test]
fn gsm8k_reads_the_last_boxed_integer_with_optional_fallbacks() {
    let t = task("q1", "gsm8k", "q", "1,234");
    let mut v = verifier("gsm8k", json!({}));
    let texts = [
        "first \\boxed{7} then \\boxed{1,234}",
        "Answer: \\boxed{12.5}",
        "#### 1234",
        "the answer is 1234",
    ]
    .map(String::from);
    let verdicts = v.score(&t, &texts).unwrap();
    let got: Vec<_> = verdicts
        .iter()
        .map(|v| (v.answer.clone(), v.score, v.correct))
        .collect();
    assert_eq!(
        got,
        vec![
            (Some("1234".into()), 1.0, true),
            (None, 0.0, false),
            (None, 0.0, false),
            (None, 0.0, false)
        ]
    );
    let mut v = verifier(
        "gsm8k",
        json!({"hash_fallback": true, "last_number_fallback": true}),
    );
    let verdicts = v.score(&t, &texts).unwrap();
    assert!(verdicts[2].correct && verdicts[3].correct, "{verdicts:?}");
    assert_eq!(
        v.extract(&t, "so \\boxed{-3}").unwrap().as_deref(),
        Some("-3")
    );
}

#[test]
fn anli_reads_labels() {
    let t = task("a1", "anli", "premise / hypothesis", "n");
    let mut v = verifier("anli", json!({}));
    let texts = [
        "Answer: \\boxed{Neutral}",
        "It is entailment, no wait, contradiction",
        "Contradiction.",
        "Answer: \\boxed{maybe}",
    ]
    .map(String::from);
    let verdicts = v.score(&t, &texts).unwrap();
    assert_eq!(verdicts[0].answer.as_deref(), Some("neutral"));
    assert!(verdicts[0].correct);
    // Without a box the whole answer must be a label (arXiv 2502.18439).
    assert_eq!(verdicts[1].answer, None);
    assert_eq!(verdicts[2].answer.as_deref(), Some("contradiction"));
    assert_eq!(verdicts[3].answer, None);
}

#[test]
fn exact_match_normalises() {
    let t = task("x", "qa", "Capital of France?", "Paris");
    let mut v = verifier("exact_match", json!({}));
    let verdicts = v
        .score(
            &t,
            &["It is \\boxed{  paris. }".into(), "\\boxed{Lyon}".into()],
        )
        .unwrap();
    assert!(verdicts[0].correct && !verdicts[1].correct, "{verdicts:?}");
    let mut v = verifier(
        "exact_match",
        json!({"extract": "whole", "strip_articles": true}),
    );
    let t = task("x", "qa", "q", "the Eiffel Tower");
    assert!(v.score(&t, &["An Eiffel  tower".into()]).unwrap()[0].correct);
}

/// The paper's worked example (arXiv 2502.18439, Definition 1), T = 3, gamma = 0.3, two agents.
#[test]
#[allow(clippy::needless_range_loop)] // indexes the score table by agent and turn
fn influence_reward_reproduces_the_worked_example() {
    let scores = [[0.2f32, 0.6], [0.5, 0.9], [1.0, 0.8]];
    let us = (0..3u32)
        .flat_map(|t| (0..2u32).map(move |a| (t, a)))
        .map(|(t, a)| {
            let s = scores[t as usize][a as usize];
            utterance(t + 1, a, Some("1"), s, s >= 0.5)
        })
        .collect();
    let tr = transcript(2, 3, us);
    let mut s = shaper("influence", json!({"gamma": 0.3}));
    let rewards = s.shape(&task("w", "gsm8k", "q", "1"), &tr).unwrap();
    let mean = |t: usize| (scores[t][0] + scores[t][1]) as f64 / 2.0;
    for a in 0..2usize {
        let r1 = (scores[0][a] as f64 + 0.3 * mean(1) + 0.09 * mean(2)) / 1.39;
        let r2 = (scores[1][a] as f64 + 0.3 * mean(2)) / 1.3;
        let r3 = scores[2][a] as f64;
        for (turn, want) in [(1, r1), (2, r2), (3, r3)] {
            let got = rewards
                .iter()
                .find(|r| r.turn == turn && r.agent == a as u32)
                .unwrap();
            assert!(
                (got.total as f64 - want).abs() < 1e-6,
                "turn {turn} agent {a}: {} vs {want}",
                got.total
            );
            assert_eq!(got.parts.len(), 1);
            assert_eq!(got.parts[0].0, "influence");
        }
    }
    // Agent 0, turn 1: (0.2 + 0.3 * 0.7 + 0.09 * 0.9) / 1.39 = 0.35323741...
    let r = rewards
        .iter()
        .find(|r| r.turn == 1 && r.agent == 0)
        .unwrap();
    assert!((r.total - 0.353_237_4).abs() < 1e-6, "{}", r.total);
}

#[test]
fn influence_incentives_are_named_parts_with_the_papers_signs() {
    // Agent 0 goes wrong -> right while agent 1 was right: correctly persuaded (+alpha_1).
    let tr = transcript(
        2,
        2,
        vec![
            utterance(1, 0, Some("3"), 0.0, false),
            utterance(1, 1, Some("5"), 1.0, true),
            utterance(2, 0, Some("5"), 1.0, true),
            utterance(2, 1, Some("5"), 1.0, true),
        ],
    );
    let mut s = shaper("influence", json!({"alpha_1": 2.0, "beta_1": 1.0}));
    let rewards = s.shape(&task("w", "gsm8k", "q", "5"), &tr).unwrap();
    let part = |turn: u32, agent: u32, name: &str| {
        let r = rewards
            .iter()
            .find(|r| r.turn == turn && r.agent == agent)
            .unwrap();
        r.parts.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    };
    assert_eq!(part(2, 0, "alpha-1"), Some(2.0));
    assert_eq!(part(2, 1, "alpha-1"), Some(0.0), "agent 1 did not switch");
    // Agent 1 was right at turn 1 and agent 0 then moved wrong -> right: persuasion (+beta_1).
    assert_eq!(part(1, 1, "beta-1"), Some(1.0));
    let mut code = shaper("influence", json!({"beta_1": 1.0, "beta_sign": "code"}));
    let rewards = code.shape(&task("w", "gsm8k", "q", "5"), &tr).unwrap();
    let r = rewards
        .iter()
        .find(|r| r.turn == 1 && r.agent == 1)
        .unwrap();
    assert_eq!(
        r.parts.iter().find(|(n, _)| n == "beta-1").unwrap().1,
        -1.0,
        "the released code's sign"
    );
    for r in &rewards {
        let sum: f32 = r.parts.iter().map(|(_, v)| v).sum();
        assert!(
            (r.total - sum).abs() < 1e-6,
            "total is the sum of its parts"
        );
    }
}

#[test]
fn final_only_rewards_every_utterance_with_the_final_score() {
    let tr = transcript(
        2,
        2,
        vec![
            utterance(1, 0, Some("3"), 0.0, false),
            utterance(1, 1, Some("5"), 1.0, true),
            utterance(2, 0, Some("5"), 1.0, true),
            utterance(2, 1, Some("4"), 0.0, false),
        ],
    );
    let mut s = shaper("final_only", json!({}));
    let rewards = s.shape(&task("w", "gsm8k", "q", "5"), &tr).unwrap();
    let total = |turn, agent| {
        rewards
            .iter()
            .find(|r| r.turn == turn && r.agent == agent)
            .unwrap()
            .total
    };
    assert_eq!(
        (total(1, 0), total(2, 0), total(1, 1), total(2, 1)),
        (1.0, 1.0, 0.0, 0.0)
    );
    let mut s = shaper(
        "final_only",
        json!({"share": "all", "last_turn_only": true}),
    );
    let rewards = s.shape(&task("w", "gsm8k", "q", "5"), &tr).unwrap();
    assert_eq!(rewards.len(), 2);
    assert!(rewards.iter().all(|r| r.turn == 2 && r.total == 0.5));
}

/// The reference plugins use under 1% of the default fuel budget per call on GSM8K-sized
/// debates (3 agents, 3 turns, ~1 KB responses).
#[test]
fn reference_plugins_use_under_one_percent_of_the_fuel_budget() {
    let (rt, _, _c) = runtime();
    let limits = Limits::default();
    let budget = limits.fuel / 100;
    let mut plugins = Plugins {
        protocol: Protocol::load(
            &rt,
            &plugin("debate"),
            &json!({"show_scores": true}),
            &limits,
        )
        .unwrap(),
        verifier: Verifier::load(&rt, &plugin("gsm8k"), &json!({}), &limits).unwrap(),
        shaper: RewardShaper::load(
            &rt,
            &plugin("influence"),
            &json!({"alpha_1": 1.0, "beta_0": 1.0}),
            &limits,
        )
        .unwrap(),
    };
    let gsm8k =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/gsm8k/test.jsonl");
    let tasks: Vec<_> = maporl::data::gsm8k(&gsm8k)
        .unwrap()
        .into_iter()
        .take(4)
        .collect();
    /// A scripted team with long, GSM8K-like responses.
    struct Verbose(ScriptedTeam);
    impl debate::Team for Verbose {
        fn respond(
            &mut self,
            turn: u32,
            requests: &[debate::Request<'_>],
        ) -> anyhow::Result<Vec<debate::Response>> {
            let padding = "Let me reason step by step about the quantities involved. ".repeat(16);
            let mut out = self.0.respond(turn, requests)?;
            for r in &mut out {
                r.text = format!("{padding}{}", r.text);
            }
            Ok(out)
        }
    }
    let mut team = Verbose(ScriptedTeam::new(&tasks, vec![0.5, 0.6, 0.7], 0.5, 1));
    let mut worst = 0;
    // Then replay every kind of call on the finished debates, reading the fuel of each.
    let debates = debate::run(
        &mut plugins,
        &mut team,
        &tasks,
        3,
        3,
        debate::OnPluginError::Stop,
    )
    .unwrap()
    .debates;
    for d in &debates {
        assert!(d.transcript.utterances.iter().all(|u| u.text.len() > 900));
        for turn in 1..=3 {
            plugins
                .protocol
                .plan_turn(&d.task, turn, &d.transcript)
                .unwrap();
            worst = worst.max(plugins.protocol.fuel_used());
            plugins
                .protocol
                .decide(&d.task, turn, &d.transcript)
                .unwrap();
            worst = worst.max(plugins.protocol.fuel_used());
        }
        let texts: Vec<String> = d
            .transcript
            .utterances
            .iter()
            .map(|u| u.text.clone())
            .collect();
        plugins.verifier.score(&d.task, &texts).unwrap();
        worst = worst.max(plugins.verifier.fuel_used());
        plugins.shaper.shape(&d.task, &d.transcript).unwrap();
        worst = worst.max(plugins.shaper.fuel_used());
    }
    eprintln!(
        "most fuel used by one call: {worst} (budget {})",
        limits.fuel
    );
    assert!(worst > 0, "fuel is metered");
    assert!(
        worst < budget,
        "a call used {worst} fuel, 1% of the budget is {budget}"
    );
}
