//! The influence reward credits a turn-1 answer that makes the others right, and that credit
//! reaches the tokens of that answer: through the real protocol (`debate`), verifier (`gsm8k`)
//! and shaper (`influence`), then `samples_of`, `token_rewards`, GAE and whitening, and one
//! PPO update of a tiny model.
//!
//! A scripted two-agent team debates one GSM8K-style question for three turns. Agent 0 is
//! right throughout and says the same thing in every scenario; only agent 1 changes:
//! - A ("persuaded"): agent 1 is wrong at turn 1 and right at turns 2 and 3;
//! - B ("unmoved"): agent 1 is wrong at every turn;
//! - C ("already right"): agent 1 is right at every turn.
//!
//! So agent 0's turn-1 utterance is the same tokens after the same prompt in A, B and C, and
//! only in A did it precede the other agent moving wrong -> right.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use candle_core::{DType, Device};
use maporl::debate::{self, Debate, OnPluginError, Plugins, Request, Response, Team, TokenIds};
use maporl::model::{score, Agent, Lora, LoraConfig, ValueHead};
use maporl::optim::AgentOptimizer;
use maporl::plugin::{Limits, Protocol, RewardShaper, Verifier};
use maporl::train::ppo::{
    gae, ppo_step, token_rewards, whiten, Batch, KlController, PpoConfig, Sample,
};
use maporl::train::samples_of;
use maporl::transcript::ChatMessage;
use rand::{Rng, SeedableRng};
use serde_json::json;
use support::*;

const AGENTS: usize = 2;
const TURNS: usize = 3;
/// The influence shaper's turn discount (its default, the paper's 0.3).
const GAMMA: f64 = 0.3;
/// The paper's "persuading others with correct answers" incentive.
const BETA_1: f64 = 2.0;
/// GAE inside each response, as in the paper (arXiv 2502.18439).
const GAE_GAMMA: f32 = 1.0;
const GAE_LAMBDA: f32 = 0.95;

/// Which agent is right at which turn: `right[agent][turn - 1]`.
type Script = [[bool; TURNS]; AGENTS];

const PERSUADED: Script = [[true, true, true], [false, true, true]];
const UNMOVED: Script = [[true, true, true], [false, false, false]];
const ALREADY_RIGHT: Script = [[true, true, true], [true, true, true]];

const QUESTION: &str = "Ann has 40 apples and buys 2 more. How many apples does she have?";
const REFERENCE: &str = "42";

/// The tiny model's vocabulary: prompts use ids 1..64, responses 64..160.
const V: usize = 160;
const H: usize = 32;

/// A team that answers by a script, with synthetic token ids: the prompt ids are a hash of
/// the conversation the agent was shown (the same conversation gives the same ids), and each
/// utterance's response ids are its own (agent, turn, right or wrong) and nobody else's.
struct Scripted(Script);

/// Response ids of one utterance: 3 + turn + agent tokens (agent 0: 4, 5, 6 at turns 1, 2, 3).
fn response_ids(agent: u32, turn: u32, right: bool) -> Vec<u32> {
    let start = 64 + 48 * agent + 16 * (turn - 1) + if right { 0 } else { 8 };
    (0..3 + turn + agent).map(|k| start + k).collect()
}

/// `[1, h0, h1, h2, h3]`, the h's in 2..64 from an FNV-1a hash of the conversation.
fn prompt_ids(messages: &[ChatMessage]) -> Vec<u32> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for m in messages {
        for b in format!("{:?}\n{}\n", m.role, m.content).bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    let mut ids = vec![1];
    ids.extend((0..4).map(|i| 2 + ((h >> (16 * i)) % 62) as u32));
    ids
}

impl Team for Scripted {
    fn respond(&mut self, turn: u32, requests: &[Request<'_>]) -> anyhow::Result<Vec<Response>> {
        Ok(requests
            .iter()
            .map(
                |&Request {
                     agent, messages, ..
                 }| {
                    let right = self.0[agent as usize][turn as usize - 1];
                    let answer = if right { REFERENCE } else { "40" };
                    let text = format!(
                        "Agent {} at turn {turn}: I count the apples. Answer: \\boxed{{{answer}}}",
                        agent + 1
                    );
                    let ids = TokenIds {
                        prompt: prompt_ids(messages),
                        response: response_ids(agent, turn, right),
                        policy: None,
                    };
                    Response {
                        text,
                        prompt_tokens: ids.prompt.len(),
                        response_tokens: ids.response.len(),
                        ids,
                    }
                },
            )
            .collect())
    }
}

/// The debates of PERSUADED, UNMOVED and ALREADY_RIGHT, through the reference plugins.
fn debates() -> &'static [Debate; 3] {
    static DEBATES: OnceLock<[Debate; 3]> = OnceLock::new();
    DEBATES.get_or_init(|| {
        let (rt, _, _cache) = runtime();
        let limits = Limits::default();
        let mut plugins = Plugins {
            protocol: Protocol::load(&rt, &plugin("debate"), &json!({}), &limits).unwrap(),
            verifier: Verifier::load(&rt, &plugin("gsm8k"), &json!({}), &limits).unwrap(),
            shaper: RewardShaper::load(
                &rt,
                &plugin("influence"),
                &json!({"gamma": GAMMA, "beta_1": BETA_1}),
                &limits,
            )
            .unwrap(),
        };
        let tasks = [task("apples", "gsm8k", QUESTION, REFERENCE)];
        [PERSUADED, UNMOVED, ALREADY_RIGHT].map(|script| {
            let mut team = Scripted(script);
            let mut rollout = debate::run(
                &mut plugins,
                &mut team,
                &tasks,
                AGENTS as u32,
                TURNS as u32,
                OnPluginError::Stop,
            )
            .unwrap();
            let d = rollout.debates.pop().unwrap();
            // The verifier judged the script as written, and every turn was played.
            let judged: Vec<(u32, u32, bool)> = d
                .transcript
                .utterances
                .iter()
                .map(|u| (u.turn, u.agent, u.correct))
                .collect();
            let scripted: Vec<(u32, u32, bool)> = (1..=TURNS as u32)
                .flat_map(|t| (0..AGENTS as u32).map(move |a| (t, a)))
                .map(|(t, a)| (t, a, script[a as usize][t as usize - 1]))
                .collect();
            assert_eq!(judged, scripted);
            d
        })
    })
}

/// The shaped reward (total) and its parts of agent `agent` at `turn`.
fn reward(d: &Debate, turn: u32, agent: u32) -> (f32, HashMap<String, f32>) {
    let r = d
        .rewards
        .iter()
        .find(|r| r.turn == turn && r.agent == agent)
        .unwrap_or_else(|| panic!("no reward for turn {turn} agent {agent}"));
    (r.total, r.parts.iter().cloned().collect())
}

/// MAPoRL Definition 1 as the shaper documents it: (own + sum_k gamma^k m_{t+k}) / (1 + sum_k
/// gamma^k), m being the mean score of all agents at a later turn.
fn definition_1(own: f64, later_means: &[f64]) -> f64 {
    let (mut num, mut den) = (own, 1.0);
    for (k, m) in later_means.iter().enumerate() {
        let d = GAMMA.powi(k as i32 + 1);
        num += d * m;
        den += d;
    }
    num / den
}

/// The reward the documented formula gives utterance (turn, agent) of `script`, as
/// (influence, beta-1). Scores are 1 right, 0 wrong. beta-1 = BETA_1 * the fraction of the
/// other agents that went wrong -> right from `turn` to `turn + 1`, if the agent was right.
fn expected(script: &Script, turn: usize, agent: usize) -> (f64, f64) {
    let score = |a: usize, t: usize| f64::from(u8::from(script[a][t - 1]));
    let means: Vec<f64> = (turn + 1..=TURNS)
        .map(|t| (0..AGENTS).map(|a| score(a, t)).sum::<f64>() / AGENTS as f64)
        .collect();
    let influence = definition_1(score(agent, turn), &means);
    let beta_1 = if script[agent][turn - 1] && turn < TURNS {
        let others: Vec<usize> = (0..AGENTS).filter(|&a| a != agent).collect();
        let moved = others
            .iter()
            .filter(|&&o| !script[o][turn - 1] && script[o][turn])
            .count();
        BETA_1 * moved as f64 / others.len() as f64
    } else {
        0.0
    };
    (influence, beta_1)
}

#[test]
fn turn_one_answer_that_makes_the_other_right_earns_more_than_one_that_does_not() {
    let [a, b, c] = debates();
    // Every utterance's reward is the documented formula with these settings.
    for (name, d, script) in [
        ("A", a, PERSUADED),
        ("B", b, UNMOVED),
        ("C", c, ALREADY_RIGHT),
    ] {
        for turn in 1..=TURNS {
            for agent in 0..AGENTS {
                let (total, parts) = reward(d, turn as u32, agent as u32);
                let (influence, beta_1) = expected(&script, turn, agent);
                let at = format!("{name} turn {turn} agent {agent}: {parts:?}");
                assert!(
                    (f64::from(parts["influence"]) - influence).abs() < 1e-6,
                    "{at}"
                );
                assert!((f64::from(parts["beta-1"]) - beta_1).abs() < 1e-6, "{at}");
                assert!((f64::from(total) - influence - beta_1).abs() < 1e-6, "{at}");
            }
        }
    }

    // The headline numbers for agent 0 at turn 1.
    let (ra, pa) = reward(a, 1, 0);
    let (rb, pb) = reward(b, 1, 0);
    let (rc, pc) = reward(c, 1, 0);
    eprintln!("agent 0, turn 1: A {pa:?} = {ra}, B {pb:?} = {rb}, C {pc:?} = {rc}");
    // A: right, and everyone is right afterwards: influence 1; agent 1 moved: beta-1 = 2.
    assert!((pa["influence"] - 1.0).abs() < 1e-6, "{pa:?}");
    assert!(
        pa["beta-1"] > 0.0 && (pa["beta-1"] - 2.0).abs() < 1e-6,
        "{pa:?}"
    );
    assert!((ra - 3.0).abs() < 1e-6, "{ra}");
    // B: right, but the later means are 1/2 and nobody moved:
    // (1 + 0.3 * 0.5 + 0.09 * 0.5) / 1.39 = 1.195 / 1.39.
    assert!((f64::from(rb) - 1.195 / 1.39).abs() < 1e-6, "{rb}");
    assert_eq!(pb["beta-1"], 0.0);
    // C: the same influence as A (everyone right later) but nobody needed persuading.
    assert!((rc - 1.0).abs() < 1e-6 && pc["beta-1"] == 0.0, "{pc:?}");
    assert!(ra > rb && ra > rc, "A {ra}, B {rb}, C {rc}");
    // Agent 1's turn-1 answer was wrong in both; it is credited more in A, where the team
    // ends right.
    assert!(reward(a, 1, 1).0 > reward(b, 1, 1).0);
}

/// Agent 0's samples as `ppo_step` lays them out: right-aligned rows of the longest response's
/// width, with a 0/1 mask on real tokens; returns (scores, mask, the real tokens' offsets).
fn layout(samples: &[Sample]) -> (Vec<f32>, Vec<Vec<f32>>, Vec<usize>) {
    let width = samples.iter().map(|s| s.response.len()).max().unwrap();
    let offsets: Vec<usize> = samples.iter().map(|s| width - s.response.len()).collect();
    let mask = offsets
        .iter()
        .map(|&o| (0..width).map(|k| if k < o { 0.0 } else { 1.0 }).collect())
        .collect();
    (samples.iter().map(|s| s.reward).collect(), mask, offsets)
}

fn advantages(
    scores: &[f32],
    kl: &[Vec<f32>],
    values: &[Vec<f32>],
    mask: &[Vec<f32>],
    kl_coef: f32,
) -> Vec<Vec<f32>> {
    let rewards = token_rewards(kl, mask, scores, kl_coef);
    gae(&rewards, values, mask, GAE_GAMMA, GAE_LAMBDA).0
}

#[test]
fn gae_carries_the_influence_credit_to_every_token_of_that_answer_and_nowhere_else() {
    let [a, b, _] = debates();
    let (sa, sb) = (
        samples_of(std::slice::from_ref(a), 0),
        samples_of(std::slice::from_ref(b), 0),
    );
    assert_eq!(sa.iter().map(|s| s.turn).collect::<Vec<_>>(), vec![1, 2, 3]);
    // The same turn-1 tokens after the same prompt; only the reward differs.
    assert_eq!(
        (&sa[0].prompt, &sa[0].response),
        (&sb[0].prompt, &sb[0].response)
    );
    assert_eq!(sa[0].response, response_ids(0, 1, true));
    assert!(sa[0].reward > sb[0].reward);
    // Every response is its own, in both debates.
    for s in sa.iter().chain(&sb) {
        assert_eq!(s.response, response_ids(0, s.turn, true));
    }

    let (score_a, mask, offsets) = layout(&sa);
    let (score_b, mask_b, _) = layout(&sb);
    assert_eq!(mask, mask_b);
    assert!(offsets[0] > 0, "the turn-1 row is padded: {offsets:?}");
    let zeros: Vec<Vec<f32>> = mask.iter().map(|m| vec![0.0; m.len()]).collect();

    // No KL and zero values: token j (0-based) of an n-token response with reward R gets
    // R * (gamma * lambda)^(n - 1 - j), the first token included; padding gets nothing.
    let adv_a = advantages(&score_a, &zeros, &zeros, &mask, 0.05);
    let adv_b = advantages(&score_b, &zeros, &zeros, &mask, 0.05);
    for (adv, scores) in [(&adv_a, &score_a), (&adv_b, &score_b)] {
        for (row, (&o, &r)) in adv.iter().zip(offsets.iter().zip(scores)) {
            let n = row.len() - o;
            assert!(row[..o].iter().all(|&x| x == 0.0), "padding: {row:?}");
            for j in 0..n {
                let want = r * (GAE_GAMMA * GAE_LAMBDA).powi((n - 1 - j) as i32);
                assert!(
                    (row[o + j] - want).abs() < 1e-6,
                    "{row:?}, token {j}: want {want}"
                );
            }
        }
    }
    let first = offsets[0];
    eprintln!(
        "agent 0's turn-1 advantages: A {:?}, B {:?}",
        &adv_a[0][first..],
        &adv_b[0][first..]
    );
    // The first token of agent 0's turn-1 answer in A: 3 * 0.95^3.
    assert!((adv_a[0][first] - 3.0 * 0.95f32.powi(3)).abs() < 1e-6);
    for k in first..mask[0].len() {
        assert!(
            adv_a[0][k] > adv_b[0][k] + 1.5,
            "token {k}: A {adv_a:?} B {adv_b:?}"
        );
    }

    // With a KL penalty and a value baseline (the same in both), the difference A - B on a
    // turn-1 token is still exactly the reward difference, decayed by gamma * lambda per
    // position; and changing only the turn-1 reward changes only the turn-1 row.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    let mut noise = || -> Vec<Vec<f32>> {
        mask.iter()
            .map(|m| {
                m.iter()
                    .map(|&m| m * rng.random_range(-0.5f32..0.5))
                    .collect()
            })
            .collect()
    };
    let (kl, values) = (noise(), noise());
    let mut only_turn_one = score_a.clone();
    only_turn_one[0] = score_b[0];
    let full = advantages(&score_a, &kl, &values, &mask, 0.05);
    let changed = advantages(&only_turn_one, &kl, &values, &mask, 0.05);
    assert_eq!(
        full[1..],
        changed[1..],
        "credit leaked into another response"
    );
    let n = mask[0].len() - first;
    for j in 0..n {
        let want = (score_a[0] - score_b[0]) * (GAE_GAMMA * GAE_LAMBDA).powi((n - 1 - j) as i32);
        let got = full[0][first + j] - changed[0][first + j];
        assert!((got - want).abs() < 1e-5, "token {j}: {got} vs {want}");
    }
    assert!(full[0][..first].iter().all(|&x| x == 0.0));

    // After whitening over agent 0's batch (as ppo_step does), A's turn-1 tokens are the most
    // credited of the batch, all above the mean, and above the same tokens in B.
    let wa = whiten(&adv_a, &mask);
    let wb = whiten(&adv_b, &mask);
    let real = |w: &[Vec<f32>], row: usize| -> Vec<f32> {
        w[row]
            .iter()
            .zip(&mask[row])
            .filter(|(_, &m)| m > 0.0)
            .map(|(x, _)| *x)
            .collect()
    };
    let later_best = (1..3).flat_map(|r| real(&wa, r)).fold(f32::MIN, f32::max);
    for (x, y) in real(&wa, 0).into_iter().zip(real(&wb, 0)) {
        assert!(
            x > 0.0 && x > later_best && x > y,
            "A {x}, B {y}, A's later best {later_best}"
        );
    }
}

/// Total log-prob of `sample`'s response under `agent`.
fn logprob(agent: &Agent, sample: &Sample) -> f32 {
    let scored = score(
        agent,
        &[(sample.prompt.clone(), sample.response.clone())],
        maporl::model::Pass::Inference,
        64,
    )
    .unwrap();
    scored
        .logprobs
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

#[test]
fn one_ppo_update_makes_the_influential_answer_more_likely_than_the_same_answer_without_influence()
{
    let [a, b, _] = debates();
    let base = Arc::new(tiny_llama::<V>());
    let fresh = || {
        let mut agent = Agent::new(base.clone());
        let lora_cfg = LoraConfig {
            r: 4,
            alpha: 8.0,
            target_modules: ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]
                .map(String::from)
                .to_vec(),
        };
        agent.lora = Some(Lora::new(&base, lora_cfg, 1).unwrap());
        agent.value_head = Some(ValueHead::new(H, DType::F32, &Device::Cpu, 2).unwrap());
        agent
    };
    let reference = Agent::new(base.clone());
    let cfg = PpoConfig {
        lr: 1e-3,
        ..PpoConfig::default()
    };
    let turn_one = samples_of(std::slice::from_ref(a), 0).remove(0);
    let before = logprob(&fresh(), &turn_one);
    let trained = |d: &Debate| {
        let agent = fresh();
        let samples = samples_of(std::slice::from_ref(d), 0);
        let mut optimizer = AgentOptimizer::new(agent.named_trainable_vars(), cfg.lr, 0.0).unwrap();
        let mut kl = KlController::Fixed { value: 0.002 };
        ppo_step(
            &agent,
            &reference,
            &mut optimizer,
            Batch {
                samples: &samples,
                temperature: 1.0,
            },
            &mut kl,
            &cfg,
            0,
        )
        .unwrap();
        logprob(&agent, &turn_one)
    };
    let (after_a, after_b) = (trained(a), trained(b));
    eprintln!(
        "log p(agent 0's turn-1 answer): before {before}, after A {after_a}, after B {after_b}"
    );
    // Observed: before -21.20, after A -20.36 (+0.83), after B -21.53 (-0.34).
    assert!(
        after_a > before + 0.25,
        "before {before}, after A {after_a}"
    );
    assert!(
        after_a > after_b + 0.5,
        "after A {after_a}, after B {after_b}"
    );
}
