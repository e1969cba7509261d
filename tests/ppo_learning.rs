//! PPO and GRPO learn: a tiny random model, LoRA (+ a value head for PPO), rewarded by a
//! verifier-like rule for answering a one-token question right, goes from chance to at least
//! 0.9 accuracy within a bounded number of steps on CPU.

use std::sync::Arc;

use candle_core::{DType, Device};
use maporl::distributed::Single;
use maporl::model::{
    generate, generate_traced, Agent, GenerateOptions, Lora, LoraConfig, Sampler, SamplingParams,
    ValueHead,
};
use maporl::optim::AgentOptimizer;
use maporl::train::grpo::{group_advantages, grpo_step_in};
use maporl::train::ppo::{ppo_step, Batch, KlController, PpoConfig, Sample};
use rand::{Rng, SeedableRng};

mod support;

use support::tiny_llama;

const V: usize = 16;
const H: usize = 32;

/// Question q (0..4) is the prompt [1, 2 + q]; its one right answer is token 8 + q.
fn prompt(q: u32) -> Vec<u32> {
    vec![1, 2 + q]
}

fn answer(q: u32) -> u32 {
    8 + q
}

/// Fraction of right answers over `n` sampled answers per question, at temperature 1.
fn accuracy(agent: &Agent, sampler: &mut Sampler, n: usize) -> f32 {
    let opts = GenerateOptions {
        max_new_tokens: 1,
        stop_tokens: vec![],
        pad_token: 0,
    };
    let prompts: Vec<Vec<u32>> = (0..4)
        .flat_map(|q| std::iter::repeat_n(prompt(q), n))
        .collect();
    let out = generate(agent, &prompts, sampler, &opts).unwrap();
    let right = out
        .iter()
        .zip(&prompts)
        .filter(|(g, p)| g.tokens[0] == answer(p[1] - 2))
        .count();
    right as f32 / prompts.len() as f32
}

#[test]
fn ppo_takes_a_tiny_model_from_chance_to_ninety_percent() {
    let base = Arc::new(tiny_llama::<V>());
    let lora_cfg = LoraConfig {
        r: 8,
        alpha: 16.0,
        target_modules: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
        .map(String::from)
        .to_vec(),
    };
    let mut agent = Agent::new(base.clone());
    agent.lora = Some(Lora::new(&base, lora_cfg, 1).unwrap());
    agent.value_head = Some(ValueHead::new(H, DType::F32, &Device::Cpu, 2).unwrap());
    let reference = Agent::new(base.clone());
    let cfg = PpoConfig {
        lr: 3e-3,
        minibatches: 4,
        ..PpoConfig::default()
    };
    let mut optimizer = AgentOptimizer::new(agent.named_trainable_vars(), cfg.lr, 0.0).unwrap();
    let mut kl = KlController::Fixed { value: 0.002 };
    let mut sampler = Sampler::new(
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
        },
        7,
    );
    let mut eval_sampler = Sampler::new(
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
        },
        8,
    );

    let start = accuracy(&agent, &mut eval_sampler, 32);
    assert!(
        start < 0.3,
        "a random model starts near chance (1/16), got {start}"
    );

    let opts = GenerateOptions {
        max_new_tokens: 1,
        stop_tokens: vec![],
        pad_token: 0,
    };
    let mut curve = vec![start];
    for step in 0..120u64 {
        let prompts: Vec<Vec<u32>> = (0..64).map(|i| prompt(i % 4)).collect();
        // The old policy's log-probs and values come from generation, as in `maporl train`.
        let out = generate_traced(&agent, &prompts, &mut sampler, &opts, 1.0).unwrap();
        let samples: Vec<Sample> = prompts
            .iter()
            .zip(out)
            .map(|(p, g)| Sample {
                reward: if g.tokens[0] == answer(p[1] - 2) {
                    1.0
                } else {
                    0.0
                },
                prompt: p.clone(),
                response: g.tokens,
                turn: 1,
                policy: g.trace,
            })
            .collect();
        let stats = ppo_step(
            &agent,
            &reference,
            &mut optimizer,
            Batch {
                samples: &samples,
                temperature: 1.0,
            },
            &mut kl,
            &cfg,
            step,
        )
        .unwrap();
        assert!(
            stats.grad_norm.is_finite() && stats.policy_loss.is_finite(),
            "{stats:?}"
        );
        if step % 5 == 4 {
            let acc = accuracy(&agent, &mut eval_sampler, 32);
            curve.push(acc);
            if acc >= 0.9 {
                break;
            }
        }
    }
    eprintln!("accuracy every 5 PPO steps: {curve:?}");
    let end = *curve.last().unwrap();
    assert!(end >= 0.9, "accuracy after training: {curve:?}");
}

/// GRPO with no value head: 64 answers a step, 16 per question, each compared with the
/// other answers to its question. Within its bound of steps it takes the model from chance
/// to 0.9, its KL term stays finite and non-negative, and a step whose groups are all flat
/// (every reward equal) moves the policy only through the KL term: with β = 0, not at all.
#[test]
fn grpo_takes_a_tiny_model_from_chance_to_ninety_percent_without_a_critic() {
    let base = Arc::new(tiny_llama::<V>());
    let lora_cfg = LoraConfig {
        r: 8,
        alpha: 16.0,
        target_modules: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
        .map(String::from)
        .to_vec(),
    };
    let mut agent = Agent::new(base.clone());
    agent.lora = Some(Lora::new(&base, lora_cfg, 1).unwrap());
    let reference = Agent::new(base.clone());
    let cfg = PpoConfig {
        lr: 3e-3,
        minibatches: 4,
        ..PpoConfig::default()
    };
    let mut optimizer = AgentOptimizer::new(agent.named_trainable_vars(), cfg.lr, 0.0).unwrap();
    let mut kl = KlController::Fixed { value: 0.002 };
    let params = SamplingParams {
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
    };
    let mut sampler = Sampler::new(params, 7);
    let mut eval_sampler = Sampler::new(params, 8);
    let start = accuracy(&agent, &mut eval_sampler, 32);
    assert!(
        start < 0.3,
        "a random model starts near chance, got {start}"
    );
    let opts = GenerateOptions {
        max_new_tokens: 1,
        stop_tokens: vec![],
        pad_token: 0,
    };
    let questions: Vec<u32> = (0..64).map(|i| i / 16).collect();
    let prompts: Vec<Vec<u32>> = questions.iter().map(|&q| prompt(q)).collect();
    let samples_of = |agent: &Agent, sampler: &mut Sampler, reward: &dyn Fn(u32, u32) -> f32| {
        let out = generate(agent, &prompts, sampler, &opts).unwrap();
        prompts
            .iter()
            .zip(&questions)
            .zip(out)
            .map(|((p, &q), g)| Sample {
                reward: reward(q, g.tokens[0]),
                prompt: p.clone(),
                response: g.tokens,
                turn: 1,
                policy: None,
            })
            .collect::<Vec<Sample>>()
    };

    // Flat groups with β = 0: a zero loss gradient, and the weights do not move.
    let before = trainable_values(&agent);
    let flat = samples_of(&agent, &mut sampler, &|_, _| 1.0);
    let rewards: Vec<f32> = flat.iter().map(|s| s.reward).collect();
    let (advantages, zero) = group_advantages(&rewards, &questions, true);
    assert_eq!(zero, 1.0);
    let batch = Batch {
        samples: &flat,
        temperature: 1.0,
    };
    let mut no_kl = KlController::Fixed { value: 0.0 };
    let mut scratch = AgentOptimizer::new(agent.named_trainable_vars(), cfg.lr, 0.0).unwrap();
    let stats = grpo_step_in(
        &Single,
        &agent,
        &reference,
        &mut scratch,
        batch,
        (&advantages, zero),
        &mut no_kl,
        &cfg,
        0,
    )
    .unwrap();
    assert_eq!(stats.grad_norm, 0.0, "{stats:?}");
    assert_eq!(
        trainable_values(&agent),
        before,
        "a flat step with beta 0 moved the policy"
    );

    let mut curve = vec![start];
    for step in 0..120u64 {
        let samples = samples_of(&agent, &mut sampler, &|q, t| f32::from(t == answer(q)));
        let rewards: Vec<f32> = samples.iter().map(|s| s.reward).collect();
        let (advantages, zero) = group_advantages(&rewards, &questions, true);
        let stats = grpo_step_in(
            &Single,
            &agent,
            &reference,
            &mut optimizer,
            Batch {
                samples: &samples,
                temperature: 1.0,
            },
            (&advantages, zero),
            &mut kl,
            &cfg,
            step,
        )
        .unwrap();
        let kl_loss = stats.kl_loss.expect("GRPO reports its KL term");
        assert!(kl_loss.is_finite() && kl_loss >= 0.0, "{stats:?}");
        assert!(
            stats.value_loss.is_none() && stats.grad_norm.is_finite(),
            "{stats:?}"
        );
        if step % 5 == 4 {
            let acc = accuracy(&agent, &mut eval_sampler, 32);
            curve.push(acc);
            if acc >= 0.9 {
                break;
            }
        }
    }
    eprintln!("accuracy every 5 GRPO steps: {curve:?}");
    let end = *curve.last().unwrap();
    assert!(end >= 0.9, "accuracy after training: {curve:?}");
}

/// Gradient accumulation changes memory, not the update: micro-batches of unequal token
/// counts, weighted by their share of tokens, sum to the minibatch's gradient.
#[test]
fn gradient_accumulation_gives_the_same_update_as_whole_minibatches() {
    let base = Arc::new(tiny_llama::<V>());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    // Responses of 1 to 5 tokens, so that micro-batches hold different token counts.
    let samples: Vec<Sample> = (0..12u32)
        .map(|i| Sample {
            prompt: prompt(i % 4),
            response: (0..1 + i % 5)
                .map(|_| rng.random_range(0..V as u32))
                .collect(),
            reward: (i % 3) as f32 - 1.0,
            turn: 1,
            policy: None,
        })
        .collect();
    let fresh = || {
        let mut agent = Agent::new(base.clone());
        let lora_cfg = LoraConfig {
            r: 4,
            alpha: 8.0,
            target_modules: vec!["q_proj".into(), "down_proj".into()],
        };
        agent.lora = Some(Lora::new(&base, lora_cfg, 1).unwrap());
        agent.value_head = Some(ValueHead::new(H, DType::F32, &Device::Cpu, 2).unwrap());
        agent
    };
    let params = trainable_values;
    let train = |grad_accum: usize| {
        let agent = fresh();
        let cfg = PpoConfig {
            lr: 1e-2,
            minibatches: 2,
            epochs: 2,
            grad_accum,
            ..PpoConfig::default()
        };
        let mut optimizer = AgentOptimizer::new(agent.named_trainable_vars(), cfg.lr, 0.0).unwrap();
        let mut kl = KlController::Fixed { value: 0.01 };
        let reference = Agent::new(base.clone());
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
            5,
        )
        .unwrap();
        params(&agent)
    };
    let (whole, micro) = (train(1), train(3));
    let mut worst = 0f32;
    for (a, b) in whole.iter().zip(&micro) {
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((x - y).abs());
        }
    }
    assert!(worst < 1e-5, "parameters differ by up to {worst}");
    // And the update did something (else equality proves nothing).
    assert_ne!(params(&fresh()), whole);
}

/// The old policy's log-probs and values that generation records give the update that
/// scoring the responses again gives (`maporl train` no longer scores them twice).
#[test]
fn an_update_from_generation_traces_equals_one_that_scores_again() {
    let base = Arc::new(tiny_llama::<V>());
    let fresh = || {
        let mut agent = Agent::new(base.clone());
        let lora_cfg = LoraConfig {
            r: 4,
            alpha: 8.0,
            target_modules: vec!["q_proj".into(), "v_proj".into(), "down_proj".into()],
        };
        agent.lora = Some(Lora::new(&base, lora_cfg, 1).unwrap());
        agent.value_head = Some(ValueHead::new(H, DType::F32, &Device::Cpu, 2).unwrap());
        agent
    };
    let params = |agent: &Agent| trainable_values(agent).concat();
    let opts = GenerateOptions {
        max_new_tokens: 5,
        stop_tokens: vec![3, 7],
        pad_token: 0,
    };
    let sampling = SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        top_k: 0,
    };
    let prompts: Vec<Vec<u32>> = (0..12).map(|i| prompt(i % 4)).collect();
    let generated = generate_traced(
        &fresh(),
        &prompts,
        &mut Sampler::new(sampling, 3),
        &opts,
        0.8,
    )
    .unwrap();
    let samples = |traced: bool| -> Vec<Sample> {
        prompts
            .iter()
            .zip(&generated)
            .enumerate()
            .map(|(i, (p, g))| Sample {
                prompt: p.clone(),
                response: g.tokens.clone(),
                reward: (i % 3) as f32 - 1.0,
                turn: 1,
                policy: if traced { g.trace.clone() } else { None },
            })
            .collect()
    };
    let train = |samples: Vec<Sample>, temperature: f64| {
        let agent = fresh();
        let cfg = PpoConfig {
            lr: 1e-2,
            minibatches: 2,
            epochs: 2,
            ..PpoConfig::default()
        };
        let mut optimizer = AgentOptimizer::new(agent.named_trainable_vars(), cfg.lr, 0.0).unwrap();
        let mut kl = KlController::Fixed { value: 0.01 };
        let stats = ppo_step(
            &agent,
            &Agent::new(base.clone()),
            &mut optimizer,
            Batch {
                samples: &samples,
                temperature,
            },
            &mut kl,
            &cfg,
            5,
        )
        .unwrap();
        (params(&agent), stats)
    };
    let (traced, traced_stats) = train(samples(true), 0.8);
    let (scored, scored_stats) = train(samples(false), 0.8);
    let worst = traced
        .iter()
        .zip(&scored)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-5, "parameters differ by up to {worst}");
    assert!((traced_stats.kl - scored_stats.kl).abs() < 1e-4);
    assert_ne!(params(&fresh()), traced, "the update did something");
    // A trace taken at another temperature is not used: the update scores again.
    let (other, _) = train(samples(true), 1.0);
    let (rescored, _) = train(samples(false), 1.0);
    assert_eq!(other, rescored);
    // The traces are what the update reads when they fit (else the equalities above would
    // hold with traces ignored): shifted log-probs move the KL and the parameters.
    let shifted: Vec<Sample> = samples(true)
        .into_iter()
        .map(|mut s| {
            let trace = s.policy.as_mut().expect("a learner's generation is traced");
            trace.logprobs.iter_mut().for_each(|l| *l += 0.5);
            s
        })
        .collect();
    let (moved, moved_stats) = train(shifted, 0.8);
    assert!(
        (moved_stats.kl - traced_stats.kl).abs() > 0.1,
        "{} against {}",
        moved_stats.kl,
        traced_stats.kl
    );
    assert_ne!(moved, traced);
}

/// Every trainable tensor of `agent` (LoRA, value head), flattened, in the optimizer's order.
fn trainable_values(agent: &Agent) -> Vec<Vec<f32>> {
    agent
        .named_trainable_vars()
        .into_iter()
        .map(|(_, v)| {
            v.as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

/// A learner with no critic records its log-probs alone as it generates (no values), and
/// GRPO's update reads them: the same update as one that scores the old policy again (to
/// rounding), and a different one when the recorded log-probs are shifted.
#[test]
fn a_grpo_update_reads_the_log_probs_generation_recorded_without_a_value_head() {
    let base = Arc::new(tiny_llama::<V>());
    let fresh = || {
        let mut agent = Agent::new(base.clone());
        let lora_cfg = LoraConfig {
            r: 4,
            alpha: 8.0,
            target_modules: vec!["q_proj".into(), "v_proj".into(), "down_proj".into()],
        };
        agent.lora = Some(Lora::new(&base, lora_cfg, 1).unwrap());
        agent
    };
    let opts = GenerateOptions {
        max_new_tokens: 5,
        stop_tokens: vec![3, 7],
        pad_token: 0,
    };
    let sampling = SamplingParams {
        temperature: 0.8,
        top_p: 1.0,
        top_k: 0,
    };
    let prompts: Vec<Vec<u32>> = (0..12).map(|i| prompt(i % 4)).collect();
    let generated = generate_traced(
        &fresh(),
        &prompts,
        &mut Sampler::new(sampling, 3),
        &opts,
        0.8,
    )
    .unwrap();
    for g in &generated {
        let trace = g.trace.as_ref().expect("traced");
        assert_eq!(trace.logprobs.len(), g.tokens.len());
        assert!(trace.values.is_empty(), "no value head, no values");
    }
    let groups: Vec<u32> = (0..12).map(|i| i % 4).collect();
    let rewards: Vec<f32> = (0..12).map(|i| (i % 3) as f32).collect();
    let (advantages, zero) = group_advantages(&rewards, &groups, true);
    let train = |shift: Option<f32>| {
        let agent = fresh();
        let samples: Vec<Sample> = prompts
            .iter()
            .zip(&generated)
            .zip(&rewards)
            .map(|((p, g), &reward)| Sample {
                prompt: p.clone(),
                response: g.tokens.clone(),
                reward,
                turn: 1,
                policy: shift.map(|d| {
                    let mut t = g.trace.clone().unwrap();
                    t.logprobs.iter_mut().for_each(|l| *l += d);
                    t
                }),
            })
            .collect();
        let cfg = PpoConfig {
            lr: 1e-2,
            minibatches: 2,
            epochs: 2,
            ..PpoConfig::default()
        };
        let mut optimizer = AgentOptimizer::new(agent.named_trainable_vars(), cfg.lr, 0.0).unwrap();
        let stats = grpo_step_in(
            &Single,
            &agent,
            &Agent::new(base.clone()),
            &mut optimizer,
            Batch {
                samples: &samples,
                temperature: 0.8,
            },
            (&advantages, zero),
            &mut KlController::Fixed { value: 0.01 },
            &cfg,
            5,
        )
        .unwrap();
        (trainable_values(&agent).concat(), stats)
    };
    let (traced, _) = train(Some(0.0));
    let (scored, _) = train(None);
    let worst = traced
        .iter()
        .zip(&scored)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-5, "parameters differ by up to {worst}");
    assert_ne!(
        trainable_values(&fresh()).concat(),
        traced,
        "the update did something"
    );
    let (moved, _) = train(Some(0.5));
    assert_ne!(moved, traced, "the recorded log-probs were not read");
}

/// Finite but absurd advantages make a loss that is not finite: the update stops, naming the
/// algorithm, the epoch and the loss's parts, and the weights are not touched.
#[test]
fn a_grpo_loss_that_is_not_finite_stops_the_update_by_name() {
    let base = Arc::new(tiny_llama::<V>());
    let mut agent = Agent::new(base.clone());
    let lora_cfg = LoraConfig {
        r: 4,
        alpha: 8.0,
        target_modules: vec!["q_proj".into()],
    };
    agent.lora = Some(Lora::new(&base, lora_cfg, 1).unwrap());
    let samples: Vec<Sample> = (0..4)
        .map(|q| Sample {
            prompt: prompt(q),
            response: vec![answer(q)],
            reward: 0.0,
            turn: 1,
            policy: None,
        })
        .collect();
    // One minibatch of all four: the token mean's sum overflows.
    let advantages = [-f32::MAX; 4];
    let before = trainable_values(&agent);
    let cfg = PpoConfig {
        minibatches: 1,
        ..PpoConfig::default()
    };
    let mut optimizer = AgentOptimizer::new(agent.named_trainable_vars(), cfg.lr, 0.0).unwrap();
    let err = grpo_step_in(
        &Single,
        &agent,
        &Agent::new(base.clone()),
        &mut optimizer,
        Batch {
            samples: &samples,
            temperature: 1.0,
        },
        (&advantages, 0.0),
        &mut KlController::Fixed { value: 0.01 },
        &cfg,
        0,
    )
    .unwrap_err();
    let message = format!("{err:#}");
    assert!(
        message.contains("the GRPO loss is") && message.contains("in epoch 1 (policy"),
        "{message}"
    );
    assert_eq!(trainable_values(&agent), before);
}
