//! The repeated collaboration game and its policy-gradient learners.
//!
//! See the module docs of [`super`] for the payoffs and the analytic thresholds. This file is
//! the whole simulation: the environment ([`play_round`]), the logistic policy
//! ([`Policy`]) and REINFORCE with a per-round baseline ([`train`]).

use anyhow::{ensure, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Per-question base success probabilities p(q). Each round draws q uniformly from this bank;
/// every agent's own answer is then correct (reward 1) with probability p(q), independently
/// of the other agent and of whether it collaborated.
pub const QUESTION_BANK: [f64; 4] = [0.2, 0.4, 0.6, 0.8];

/// Number of policy features, see [`features`].
pub const N_FEATURES: usize = 4;

/// Parameters of one training run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToyConfig {
    /// T: rounds per episode (one question per round).
    pub rounds: usize,
    /// R_syn: synergy reward paid to each collaborator when enough agents collaborate.
    pub r_syn: f64,
    /// c: cost an agent pays in every round it collaborates.
    pub cost: f64,
    /// C(q): how many of the two agents must collaborate for the synergy to be paid (1 or 2).
    pub threshold: usize,
    /// Single setting: probability that the fixed partner collaborates, i.i.d. every round.
    pub partner_rate: f64,
    /// Policy-gradient iterations (points on the curve).
    pub iterations: usize,
    /// Episodes sampled per iteration.
    pub episodes_per_iter: usize,
    /// Step size of the (plain) gradient ascent on the logistic weights.
    pub lr: f64,
    /// Seed of the ChaCha8 generator: a run is a pure function of the config.
    pub seed: u64,
}

impl Default for ToyConfig {
    fn default() -> Self {
        Self {
            rounds: 10,
            r_syn: 3.0,
            cost: 1.0,
            threshold: 2,
            partner_rate: 0.2,
            iterations: 200,
            episodes_per_iter: 64,
            lr: 0.5,
            seed: 0,
        }
    }
}

impl ToyConfig {
    /// Rejects configurations the game is not defined for.
    pub fn validate(&self) -> Result<()> {
        ensure!(self.rounds >= 1, "toy: rounds must be >= 1");
        ensure!(
            (1..=2).contains(&self.threshold),
            "toy: threshold C(q) must be 1 or 2 (two agents), got {}",
            self.threshold
        );
        ensure!(
            (0.0..=1.0).contains(&self.partner_rate),
            "toy: partner_rate must be in [0, 1], got {}",
            self.partner_rate
        );
        ensure!(self.r_syn.is_finite(), "toy: r_syn must be finite");
        ensure!(
            self.cost.is_finite() && self.cost >= 0.0,
            "toy: cost must be finite and >= 0"
        );
        ensure!(self.iterations >= 1, "toy: iterations must be >= 1");
        ensure!(
            self.episodes_per_iter >= 2,
            "toy: episodes_per_iter must be >= 2"
        );
        ensure!(
            self.lr.is_finite() && self.lr > 0.0,
            "toy: lr must be finite and > 0"
        );
        Ok(())
    }
}

/// Who is trained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Setting {
    /// One learner against a fixed partner that collaborates i.i.d. with `partner_rate`.
    Single,
    /// Two learners, each with its own policy, trained at the same time on the same episodes.
    Joint,
}

impl Setting {
    /// Lower-case name, as used in labels and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Setting::Single => "single",
            Setting::Joint => "joint",
        }
    }
}

/// The result of one training run: the collaboration rate over training.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    /// e.g. `"joint, T=10"`.
    pub label: String,
    pub setting: Setting,
    pub config: ToyConfig,
    /// Per iteration: the learners' collaboration probability, averaged over every state the
    /// learners visited in that iteration's episodes (and over both learners when joint).
    pub collab_rate: Vec<f64>,
    /// Per iteration: fraction of rounds in which both agents collaborated.
    pub mutual_rate: Vec<f64>,
    /// Per iteration: mean per-round reward of the learners.
    pub mean_reward: Vec<f64>,
    /// Final logistic weights of each learner (1 when single, 2 when joint), see [`features`].
    pub final_weights: Vec<[f64; N_FEATURES]>,
}

impl Curve {
    /// Mean collaboration rate over the last tenth of training (at least one iteration).
    pub fn final_rate(&self) -> f64 {
        tail_mean(&self.collab_rate)
    }

    /// Mean mutual-collaboration rate over the last tenth of training.
    pub fn final_mutual_rate(&self) -> f64 {
        tail_mean(&self.mutual_rate)
    }
}

fn tail_mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let k = (v.len() / 10).max(1);
    v[v.len() - k..].iter().sum::<f64>() / k as f64
}

/// What the last round told an agent about its partner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prev {
    /// Round 0: no history yet.
    None,
    /// The partner collaborated in the previous round.
    Collaborated,
    /// The partner acted independently in the previous round.
    Independent,
}

/// Policy input: `[1, partner collaborated last round, partner was independent last round,
/// t / (T - 1)]`. Round 0 has both history indicators at 0.
pub fn features(t: usize, rounds: usize, prev: Prev) -> [f64; N_FEATURES] {
    let tau = if rounds > 1 {
        t as f64 / (rounds - 1) as f64
    } else {
        0.0
    };
    let (c, i) = match prev {
        Prev::None => (0.0, 0.0),
        Prev::Collaborated => (1.0, 0.0),
        Prev::Independent => (0.0, 1.0),
    };
    [1.0, c, i, tau]
}

/// Logistic policy: P(collaborate | x) = sigmoid(w . x).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Policy {
    pub w: [f64; N_FEATURES],
}

impl Policy {
    /// Probability of collaborating given the features.
    pub fn prob(&self, x: &[f64; N_FEATURES]) -> f64 {
        let z: f64 = self.w.iter().zip(x).map(|(w, x)| w * x).sum();
        1.0 / (1.0 + (-z).exp())
    }
}

/// The payoffs of one round, given both actions (`true` = collaborate) and both agents'
/// correctness draws (0 or 1): `u_i = correct_i + [a_i] * (R_syn * [n_collab >= C] - c)`.
pub fn play_round(cfg: &ToyConfig, actions: [bool; 2], correct: [f64; 2]) -> [f64; 2] {
    let n = actions.iter().filter(|&&a| a).count();
    let synergy = if n >= cfg.threshold { cfg.r_syn } else { 0.0 };
    let mut u = correct;
    for i in 0..2 {
        if actions[i] {
            u[i] += synergy - cfg.cost;
        }
    }
    u
}

/// One learner's trajectory step, kept for the gradient.
#[derive(Clone, Copy)]
struct Step {
    x: [f64; N_FEATURES],
    collaborated: bool,
    prob: f64,
    reward: f64,
}

/// Trains the learner(s) of `setting` with REINFORCE and returns the collaboration-rate curve.
///
/// Each iteration samples `episodes_per_iter` episodes of T rounds with the current policies,
/// computes each learner's undiscounted reward-to-go G_t, subtracts a per-round baseline (the
/// batch mean of G_t for that learner and round), normalises the advantages by their batch
/// standard deviation, and takes one gradient-ascent step on
/// `mean(A * grad log pi(a | x))` for each learner separately (independent learners: each
/// treats the other as part of the environment).
pub fn train(cfg: &ToyConfig, setting: Setting) -> Result<Curve> {
    cfg.validate()?;
    let t_max = cfg.rounds;
    let n_learners = match setting {
        Setting::Single => 1,
        Setting::Joint => 2,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    // Uniform initial policies (w = 0, P(collaborate) = 1/2 in every state).
    let mut policies = vec![Policy::default(); n_learners];
    let mut collab_rate = Vec::with_capacity(cfg.iterations);
    let mut mutual_rate = Vec::with_capacity(cfg.iterations);
    let mut mean_reward = Vec::with_capacity(cfg.iterations);

    // steps[learner][episode][round]
    let mut steps: Vec<Vec<Vec<Step>>> =
        vec![vec![Vec::with_capacity(t_max); cfg.episodes_per_iter]; n_learners];

    for _ in 0..cfg.iterations {
        let mut prob_sum = 0.0;
        let mut mutual = 0usize;
        let mut reward_sum = 0.0;
        for ep in 0..cfg.episodes_per_iter {
            let mut prev = [Prev::None; 2];
            for s in steps.iter_mut() {
                s[ep].clear();
            }
            for t in 0..t_max {
                let p_q = QUESTION_BANK[rng.random_range(0..QUESTION_BANK.len())];
                let mut actions = [false; 2];
                let mut xs = [[0.0; N_FEATURES]; 2];
                let mut probs = [0.0; 2];
                for agent in 0..2 {
                    if agent < n_learners {
                        xs[agent] = features(t, t_max, prev[agent]);
                        probs[agent] = policies[agent].prob(&xs[agent]);
                    } else {
                        probs[agent] = cfg.partner_rate;
                    }
                    actions[agent] = rng.random::<f64>() < probs[agent];
                }
                let correct = [
                    f64::from(u8::from(rng.random::<f64>() < p_q)),
                    f64::from(u8::from(rng.random::<f64>() < p_q)),
                ];
                let u = play_round(cfg, actions, correct);
                for l in 0..n_learners {
                    steps[l][ep].push(Step {
                        x: xs[l],
                        collaborated: actions[l],
                        prob: probs[l],
                        reward: u[l],
                    });
                    prob_sum += probs[l];
                    reward_sum += u[l];
                }
                mutual += usize::from(actions[0] && actions[1]);
                // Each agent observes its partner's action of this round.
                prev = [actions[1], actions[0]].map(|a| {
                    if a {
                        Prev::Collaborated
                    } else {
                        Prev::Independent
                    }
                });
            }
        }
        let n_steps = (cfg.episodes_per_iter * t_max) as f64;
        collab_rate.push(prob_sum / (n_steps * n_learners as f64));
        mutual_rate.push(mutual as f64 / n_steps);
        mean_reward.push(reward_sum / (n_steps * n_learners as f64));

        for (policy, eps) in policies.iter_mut().zip(&steps) {
            policy_gradient_step(policy, eps, t_max, cfg.lr);
        }
    }

    Ok(Curve {
        label: format!("{}, T={}", setting.name(), cfg.rounds),
        setting,
        config: cfg.clone(),
        collab_rate,
        mutual_rate,
        mean_reward,
        final_weights: policies.iter().map(|p| p.w).collect(),
    })
}

/// One REINFORCE step for one learner over a batch of episodes (`eps[episode][round]`).
fn policy_gradient_step(policy: &mut Policy, eps: &[Vec<Step>], t_max: usize, lr: f64) {
    let n_eps = eps.len() as f64;
    // Reward-to-go G_t per episode.
    let returns: Vec<Vec<f64>> = eps
        .iter()
        .map(|ep| {
            let mut g = vec![0.0; ep.len()];
            let mut acc = 0.0;
            for t in (0..ep.len()).rev() {
                acc += ep[t].reward;
                g[t] = acc;
            }
            g
        })
        .collect();
    // Per-round baseline b_t = batch mean of G_t.
    let baseline: Vec<f64> = (0..t_max)
        .map(|t| returns.iter().map(|g| g[t]).sum::<f64>() / n_eps)
        .collect();
    let adv: Vec<Vec<f64>> = returns
        .iter()
        .map(|g| g.iter().zip(&baseline).map(|(g, b)| g - b).collect())
        .collect();
    let n = n_eps * t_max as f64;
    let var = adv.iter().flatten().map(|a| a * a).sum::<f64>() / n;
    let scale = 1.0 / (var.sqrt() + 1e-8);
    let mut grad = [0.0; N_FEATURES];
    for (ep, a_ep) in eps.iter().zip(&adv) {
        for (s, a) in ep.iter().zip(a_ep) {
            // d/dw log pi(a | x) = (a - pi(x)) * x for a logistic policy.
            let dlogp = f64::from(u8::from(s.collaborated)) - s.prob;
            for (g, x) in grad.iter_mut().zip(&s.x) {
                *g += a * scale * dlogp * x;
            }
        }
    }
    for (w, g) in policy.w.iter_mut().zip(grad) {
        *w += lr * g / n;
    }
}
