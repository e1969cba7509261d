//! The paper's influence-aware verification reward (MAPoRL Definition 1) with the
//! reward-shaping incentives of its Section 5.
//!
//! T is the last turn present in the transcript (a debate may stop early); every utterance
//! present gets one reward. For agent a at turn t (scores V in [0, 1]):
//!
//! ```text
//! R = [ V(t,a) + sum_{t'=t+1..T} gamma^(t'-t) * mean_j V(t',j) ] / sum_{t'=t..T} gamma^(t'-t)
//! ```
//!
//! where the mean is over the utterances present at t' (one agent per turn under
//! round-robin). A later turn with nothing to average (no utterance, or with share
//! "individual" no utterance of agent a) drops out of both sums.
//!
//! Settings (JSON, all optional):
//! - `gamma` (number in [0, 1], 0.3);
//! - `horizon` ("discounted-sum" | "last" | "current", "discounted-sum"): Definition 1;
//!   only the final turn's mean, R = m_T at every turn (with share "individual" the agent's
//!   own final score; its own score when it did not speak at T); or the agent's own score
//!   only;
//! - `share` ("all" | "individual", "all"): average all agents' later scores, or use the
//!   agent's own later scores;
//! - `alpha_0`, `alpha_1`, `beta_0`, `beta_1` (numbers, 0): the incentives, each logged
//!   as its own part ("alpha-0", ...) whenever its coefficient is non-zero;
//! - `beta_sign` ("paper" | "code", "paper"): "code" takes the authors' released code's beta
//!   rule instead (below).
//!
//! Incentives use ground-truth correctness. For t >= 2, with o = the mean correctness of the
//! other agents at t-1 ("others right" when o >= 0.5), agent a going wrong -> right earns
//! +alpha_1 when the others were right and +alpha_0 when they were wrong; going right ->
//! wrong costs alpha_1 when the others were wrong and alpha_0 when they were right. For
//! t < T, with f = the fraction of the other agents that went wrong -> right between t and
//! t+1, the utterance earns beta_1 * f if a was right at t, beta_0 * f if it was wrong.
//!
//! The code's beta rule (`beta_sign = "code"`, `bonus_rule` in the authors' repository) looks
//! at the others' mean correctness m_t, m_{t+1} (strict thresholds at 0.5) and has two
//! branches. Others wrong -> right (m_t < 0.5 < m_{t+1}): a right at t costs beta_1, a wrong
//! at t costs beta_0. Others right -> wrong (m_t > 0.5 > m_{t+1}): a wrong at t earns beta_1,
//! a right at t earns beta_0. So persuading peers toward the truth is penalised and leading
//! them into error rewarded, the opposite of the paper's stated intent.

use maporl_plugin::settings::parse_settings;
use maporl_plugin::transcript::{at_turn, check, find, last_turn, mean_score};
use maporl_plugin::{reward, Reward, RewardShaper, Task, Transcript, Utterance};
use serde::Deserialize;

/// The plugin's name in error messages.
pub const PLUGIN: &str = "influence";

/// Which later turns count.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Horizon {
    /// Definition 1: every later turn, discounted.
    #[default]
    DiscountedSum,
    /// Only the final turn.
    Last,
    /// The agent's own score only.
    Current,
}

/// Whose later scores count.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Share {
    /// The mean over every agent that spoke at the later turn (the paper).
    #[default]
    All,
    /// The agent's own later scores.
    Individual,
}

/// The sign of the beta incentives.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum BetaSign {
    /// The paper's intent: persuading others toward the truth is rewarded.
    #[default]
    Paper,
    /// The released code's rule: the opposite sign, and a mirror branch that rewards
    /// leading the others from right to wrong.
    Code,
}

/// The influence shaper's settings.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// The turn discount, in [0, 1].
    pub gamma: f64,
    /// Which later turns count.
    pub horizon: Horizon,
    /// Whose later scores count.
    pub share: Share,
    /// Self-correction against the others (wrong -> right while the others were wrong).
    pub alpha_0: f64,
    /// Following the correct majority (wrong -> right while the others were right).
    pub alpha_1: f64,
    /// A wrong answer that still precedes others moving wrong -> right.
    pub beta_0: f64,
    /// A right answer that precedes others moving wrong -> right.
    pub beta_1: f64,
    /// The sign of the beta terms.
    pub beta_sign: BetaSign,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            gamma: 0.3,
            horizon: Horizon::default(),
            share: Share::default(),
            alpha_0: 0.0,
            alpha_1: 0.0,
            beta_0: 0.0,
            beta_1: 0.0,
            beta_sign: BetaSign::default(),
        }
    }
}

impl Settings {
    /// Parses and validates the `configure` document.
    pub fn parse(json: &str) -> Result<Self, String> {
        let s: Settings = parse_settings(PLUGIN, json)?;
        s.check()?;
        Ok(s)
    }

    /// The checks serde cannot express.
    pub fn check(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.gamma) {
            return Err(format!(
                "{PLUGIN}: setting `gamma` must be in [0, 1], got {}",
                self.gamma
            ));
        }
        Ok(())
    }
}

/// The later value agent `agent` is credited with at `turn`, if any.
fn later_value(settings: &Settings, transcript: &Transcript, agent: u32, turn: u32) -> Option<f64> {
    match settings.share {
        Share::All => mean_score(transcript, turn),
        Share::Individual => find(transcript, turn, agent).map(|u| f64::from(u.score)),
    }
}

/// The influence-aware reward R of one utterance, `last` being the final turn T.
pub fn influence(settings: &Settings, transcript: &Transcript, u: &Utterance, last: u32) -> f64 {
    let own = f64::from(u.score);
    let gamma = settings.gamma;
    let discount = |t: u32| gamma.powi((t - u.turn) as i32);
    match settings.horizon {
        Horizon::Current => own,
        // Only the final turn counts, at every turn (the final one included): the mean of its
        // scores, or with share "individual" the agent's own final score. The authors' code
        // does the same; its own score at t does not enter.
        Horizon::Last => later_value(settings, transcript, u.agent, last).unwrap_or(own),
        Horizon::DiscountedSum => {
            let (mut num, mut den) = (own, 1.0);
            for t in u.turn + 1..=last {
                if let Some(m) = later_value(settings, transcript, u.agent, t) {
                    num += discount(t) * m;
                    den += discount(t);
                }
            }
            num / den
        }
    }
}

/// The incentive terms of one utterance: (alpha-0, alpha-1, beta-0, beta-1).
pub fn incentives(
    settings: &Settings,
    transcript: &Transcript,
    u: &Utterance,
    last: u32,
) -> [f64; 4] {
    let (mut a0, mut a1, mut b0, mut b1) = (0.0, 0.0, 0.0, 0.0);
    if u.turn >= 2 {
        let prev = find(transcript, u.turn - 1, u.agent);
        let (right, others) = right_of_n(
            at_turn(transcript, u.turn - 1)
                .filter(|o| o.agent != u.agent)
                .map(|o| o.correct),
        );
        if let (Some(prev), false) = (prev, others == 0) {
            let mean = right as f64 / others as f64;
            let others_right = mean >= 0.5;
            let wrong_to_right = !prev.correct && u.correct;
            let right_to_wrong = prev.correct && !u.correct;
            if wrong_to_right {
                if others_right {
                    a1 = settings.alpha_1;
                } else {
                    a0 = settings.alpha_0;
                }
            } else if right_to_wrong {
                if others_right {
                    a0 = -settings.alpha_0;
                } else {
                    a1 = -settings.alpha_1;
                }
            }
        }
    }
    if u.turn < last && settings.beta_sign == BetaSign::Code {
        let others_mean = |turn: u32| {
            let (right, others) = right_of_n(
                at_turn(transcript, turn)
                    .filter(|o| o.agent != u.agent)
                    .map(|o| o.correct),
            );
            (others > 0).then(|| right as f64 / others as f64)
        };
        if let (Some(now), Some(next)) = (others_mean(u.turn), others_mean(u.turn + 1)) {
            if now < 0.5 && next > 0.5 {
                if u.correct {
                    b1 = -settings.beta_1;
                } else {
                    b0 = -settings.beta_0;
                }
            } else if now > 0.5 && next < 0.5 {
                if u.correct {
                    b0 = settings.beta_0;
                } else {
                    b1 = settings.beta_1;
                }
            }
        }
    } else if u.turn < last {
        let (moved, peers) = right_of_n(
            at_turn(transcript, u.turn)
                .filter(|o| o.agent != u.agent)
                .filter_map(|o| {
                    find(transcript, u.turn + 1, o.agent).map(|next| !o.correct && next.correct)
                }),
        );
        if peers > 0 {
            let f = moved as f64 / peers as f64;
            if u.correct {
                b1 = settings.beta_1 * f;
            } else {
                b0 = settings.beta_0 * f;
            }
        }
    }
    [a0, a1, b0, b1]
}

/// `shape`: one reward per utterance, in transcript order.
pub fn shape(settings: &Settings, transcript: &Transcript) -> Result<Vec<Reward>, String> {
    check(PLUGIN, transcript)?;
    let Some(last) = last_turn(transcript) else {
        return Ok(Vec::new());
    };
    let coefficients = [
        ("alpha-0", settings.alpha_0),
        ("alpha-1", settings.alpha_1),
        ("beta-0", settings.beta_0),
        ("beta-1", settings.beta_1),
    ];
    // With every coefficient 0 (the default) the incentive terms are not logged: skip them.
    let incentives_on = coefficients.iter().any(|(_, c)| *c != 0.0);
    Ok(transcript
        .utterances
        .iter()
        .map(|u| {
            let terms = if incentives_on {
                incentives(settings, transcript, u, last)
            } else {
                [0.0; 4]
            };
            let logged = coefficients
                .iter()
                .zip(terms)
                .filter(|((_, coefficient), _)| *coefficient != 0.0)
                .map(|((name, _), value)| (*name, value));
            let own = ("influence", influence(settings, transcript, u, last));
            reward(u.turn, u.agent, std::iter::once(own).chain(logged))
        })
        .collect())
}

/// How many of `flags` are true, and how many there are.
fn right_of_n(flags: impl Iterator<Item = bool>) -> (usize, usize) {
    flags.fold((0, 0), |(right, n), flag| {
        (right + usize::from(flag), n + 1)
    })
}

/// The influence reward shaper.
pub struct Influence {
    settings: Settings,
}

impl RewardShaper for Influence {
    const NAME: &'static str = PLUGIN;
    type Settings = Settings;

    fn new(settings: Settings) -> Result<Self, String> {
        settings.check()?;
        Ok(Self { settings })
    }

    fn shape(&self, _task: &Task, transcript: &Transcript) -> Result<Vec<Reward>, String> {
        shape(&self.settings, transcript)
    }
}

maporl_plugin::export_reward_shaper!(Influence);

#[cfg(test)]
mod tests {
    use super::*;
    use maporl_plugin::testing::transcript;

    fn u(turn: u32, agent: u32, score: f32, correct: bool) -> Utterance {
        Utterance {
            turn,
            agent,
            text: String::new(),
            answer: None,
            score,
            correct,
        }
    }

    /// A = 2, T = 3: agent 0 scores 0.2, 0.5, 0.8; agent 1 scores 0.6, 0.9, 1.0.
    fn worked() -> Transcript {
        transcript(
            2,
            3,
            vec![
                u(1, 0, 0.2, false),
                u(1, 1, 0.6, true),
                u(2, 0, 0.5, true),
                u(2, 1, 0.9, true),
                u(3, 0, 0.8, true),
                u(3, 1, 1.0, true),
            ],
        )
    }

    fn totals(rewards: &[Reward]) -> Vec<(u32, u32, f32)> {
        rewards.iter().map(|r| (r.turn, r.agent, r.total)).collect()
    }

    fn assert_close(got: &[Reward], want: &[(u32, u32, f64)]) {
        assert_eq!(got.len(), want.len(), "{:?}", totals(got));
        for (r, (t, a, v)) in got.iter().zip(want) {
            assert_eq!((r.turn, r.agent), (*t, *a));
            assert!(
                (f64::from(r.total) - v).abs() < 1e-6,
                "turn {t} agent {a}: got {}, want {v}",
                r.total
            );
        }
    }

    #[test]
    fn worked_example_definition_1() {
        let r = shape(&Settings::default(), &worked()).unwrap();
        let (m2, m3) = (0.7, 0.9);
        assert_close(
            &r,
            &[
                (1, 0, (0.2 + 0.3 * m2 + 0.09 * m3) / 1.39),
                (1, 1, (0.6 + 0.3 * m2 + 0.09 * m3) / 1.39),
                (2, 0, (0.5 + 0.3 * m3) / 1.3),
                (2, 1, (0.9 + 0.3 * m3) / 1.3),
                (3, 0, 0.8),
                (3, 1, 1.0),
            ],
        );
        // The literal numbers: R1 = 0.491 / 1.39 for agent 0.
        assert!((f64::from(r[0].total) - 0.353_237_41).abs() < 1e-6);
        // Only the influence part without incentives.
        assert_eq!(r[0].parts.len(), 1);
        assert_eq!(r[0].parts[0].0, "influence");
        assert_eq!(r[0].parts[0].1, r[0].total);
    }

    #[test]
    fn early_stopped_debates_end_at_the_last_turn_present() {
        let mut tr = worked();
        tr.utterances.truncate(4);
        let r = shape(&Settings::default(), &tr).unwrap();
        assert_close(
            &r,
            &[
                (1, 0, (0.2 + 0.3 * 0.7) / 1.3),
                (1, 1, (0.6 + 0.3 * 0.7) / 1.3),
                (2, 0, 0.5),
                (2, 1, 0.9),
            ],
        );
    }

    #[test]
    fn round_robin_one_speaker_per_turn() {
        let tr = transcript(
            2,
            3,
            vec![u(1, 0, 0.2, false), u(2, 1, 0.6, true), u(3, 0, 1.0, true)],
        );
        let r = shape(&Settings::default(), &tr).unwrap();
        assert_close(
            &r,
            &[
                (1, 0, (0.2 + 0.3 * 0.6 + 0.09 * 1.0) / 1.39),
                (2, 1, (0.6 + 0.3 * 1.0) / 1.3),
                (3, 0, 1.0),
            ],
        );
        let individual = Settings {
            share: Share::Individual,
            ..Settings::default()
        };
        let r = shape(&individual, &tr).unwrap();
        assert_close(
            &r,
            &[(1, 0, (0.2 + 0.09 * 1.0) / 1.09), (2, 1, 0.6), (3, 0, 1.0)],
        );
    }

    #[test]
    fn horizons_and_shares() {
        let last = Settings {
            horizon: Horizon::Last,
            ..Settings::default()
        };
        // Only the final turn's mean, at every turn: the own score does not enter.
        assert_close(
            &shape(&last, &worked()).unwrap(),
            &[
                (1, 0, 0.9),
                (1, 1, 0.9),
                (2, 0, 0.9),
                (2, 1, 0.9),
                (3, 0, 0.9),
                (3, 1, 0.9),
            ],
        );
        let current = Settings {
            horizon: Horizon::Current,
            ..Settings::default()
        };
        assert_close(
            &shape(&current, &worked()).unwrap(),
            &[
                (1, 0, 0.2),
                (1, 1, 0.6),
                (2, 0, 0.5),
                (2, 1, 0.9),
                (3, 0, 0.8),
                (3, 1, 1.0),
            ],
        );
        let individual = Settings {
            share: Share::Individual,
            ..Settings::default()
        };
        assert_close(
            &shape(&individual, &worked()).unwrap(),
            &[
                (1, 0, (0.2 + 0.3 * 0.5 + 0.09 * 0.8) / 1.39),
                (1, 1, (0.6 + 0.3 * 0.9 + 0.09 * 1.0) / 1.39),
                (2, 0, (0.5 + 0.3 * 0.8) / 1.3),
                (2, 1, (0.9 + 0.3 * 1.0) / 1.3),
                (3, 0, 0.8),
                (3, 1, 1.0),
            ],
        );
        let last_individual = Settings {
            horizon: Horizon::Last,
            share: Share::Individual,
            ..Settings::default()
        };
        assert_close(
            &shape(&last_individual, &worked()).unwrap(),
            &[
                (1, 0, 0.8),
                (1, 1, 1.0),
                (2, 0, 0.8),
                (2, 1, 1.0),
                (3, 0, 0.8),
                (3, 1, 1.0),
            ],
        );
    }

    #[test]
    fn gamma_extremes() {
        let zero = Settings {
            gamma: 0.0,
            ..Settings::default()
        };
        let r = shape(&zero, &worked()).unwrap();
        assert_close(
            &r,
            &[
                (1, 0, 0.2),
                (1, 1, 0.6),
                (2, 0, 0.5),
                (2, 1, 0.9),
                (3, 0, 0.8),
                (3, 1, 1.0),
            ],
        );
        let one = Settings {
            gamma: 1.0,
            ..Settings::default()
        };
        let r = shape(&one, &worked()).unwrap();
        assert!((f64::from(r[0].total) - (0.2 + 0.7 + 0.9) / 3.0).abs() < 1e-6);
    }

    fn with_incentives() -> Settings {
        Settings {
            alpha_0: 3.0,
            alpha_1: 2.0,
            beta_0: 5.0,
            beta_1: 7.0,
            ..Settings::default()
        }
    }

    /// The (alpha-0, alpha-1) parts of agent 0 at turn 2 when agent 0 goes `own` and agent 1
    /// was `other` at turn 1.
    fn alphas(own: (bool, bool), other: bool) -> (f32, f32) {
        let tr = transcript(
            2,
            2,
            vec![
                u(1, 0, 0.0, own.0),
                u(1, 1, 0.0, other),
                u(2, 0, 0.0, own.1),
                u(2, 1, 0.0, other),
            ],
        );
        let r = shape(&with_incentives(), &tr).unwrap();
        let part = |name: &str| r[2].parts.iter().find(|(n, _)| n == name).unwrap().1;
        (part("alpha-0"), part("alpha-1"))
    }

    #[test]
    fn alpha_signs() {
        // wrong -> right, others right: correctly persuaded.
        assert_eq!(alphas((false, true), true), (0.0, 2.0));
        // wrong -> right, others wrong: self-correction.
        assert_eq!(alphas((false, true), false), (3.0, 0.0));
        // right -> wrong, others wrong: wrongly persuaded.
        assert_eq!(alphas((true, false), false), (0.0, -2.0));
        // right -> wrong, others right: left the correct majority.
        assert_eq!(alphas((true, false), true), (-3.0, 0.0));
        // No switch: nothing.
        assert_eq!(alphas((true, true), false), (0.0, 0.0));
        assert_eq!(alphas((false, false), true), (0.0, 0.0));
    }

    #[test]
    fn alpha_uses_the_others_mean_with_threshold_one_half() {
        // Three agents: agent 0 goes wrong -> right; of the others at turn 1 one is right.
        let tr = transcript(
            3,
            2,
            vec![
                u(1, 0, 0.0, false),
                u(1, 1, 0.0, true),
                u(1, 2, 0.0, false),
                u(2, 0, 0.0, true),
            ],
        );
        let r = shape(&with_incentives(), &tr).unwrap();
        // o-bar = 0.5 counts as "others right".
        assert_eq!(r[3].parts[2], ("alpha-1".to_string(), 2.0));
        assert_eq!(r[3].parts[1], ("alpha-0".to_string(), 0.0));
        // Turn 1 has no alpha terms.
        assert_eq!(r[0].parts[1].1, 0.0);
        assert_eq!(r[0].parts[2].1, 0.0);
    }

    #[test]
    fn beta_signs_and_fractions() {
        // Agent 0 right throughout; agent 1 wrong -> right; agent 2 wrong -> wrong.
        let tr = transcript(
            3,
            2,
            vec![
                u(1, 0, 1.0, true),
                u(1, 1, 0.0, false),
                u(1, 2, 0.0, false),
                u(2, 0, 1.0, true),
                u(2, 1, 1.0, true),
                u(2, 2, 0.0, false),
            ],
        );
        let part = |r: &Reward, name: &str| r.parts.iter().find(|(n, _)| n == name).unwrap().1;
        let r = shape(&with_incentives(), &tr).unwrap();
        // Agent 0 (right at 1): half of the others went wrong -> right.
        assert_eq!(part(&r[0], "beta-1"), 3.5);
        assert_eq!(part(&r[0], "beta-0"), 0.0);
        // Agent 1 (wrong at 1): the others did not move to right.
        assert_eq!(part(&r[1], "beta-0"), 0.0);
        // Agent 2 (wrong at 1): agent 1 of its two others went wrong -> right.
        assert_eq!(part(&r[2], "beta-0"), 2.5);
        assert_eq!(part(&r[2], "beta-1"), 0.0);
        // No beta at the last turn.
        assert!(r[3..]
            .iter()
            .all(|r| part(r, "beta-0") == 0.0 && part(r, "beta-1") == 0.0));
        // The total is the sum of the parts.
        for reward in &r {
            let sum: f32 = reward.parts.iter().map(|(_, v)| *v).sum();
            assert_eq!(reward.total, sum);
        }
        let names: Vec<&str> = r[0].parts.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            vec!["influence", "alpha-0", "alpha-1", "beta-0", "beta-1"]
        );

        // The code's rule takes the others' mean against strict 0.5 thresholds: a half of
        // the others moving is no move at all.
        let code = Settings {
            beta_sign: BetaSign::Code,
            ..with_incentives()
        };
        let r = shape(&code, &tr).unwrap();
        assert!(r
            .iter()
            .all(|r| part(r, "beta-0") == 0.0 && part(r, "beta-1") == 0.0));
        // Its two branches, with two agents: (agent 0 at turns 1, 2; agent 1 at turns 1, 2)
        // -> agent 0's turn-1 (beta-0, beta-1).
        for (zero, one, want) in [
            // Agent 1 wrong -> right: agent 0 right at 1 costs beta_1, wrong at 1 beta_0.
            ([true, true], [false, true], (0.0, -7.0)),
            ([false, true], [false, true], (-5.0, 0.0)),
            // Agent 1 right -> wrong: agent 0 wrong at 1 earns beta_1, right at 1 beta_0.
            ([false, false], [true, false], (0.0, 7.0)),
            ([true, true], [true, false], (5.0, 0.0)),
            // Agent 1 stays: nothing.
            ([true, true], [true, true], (0.0, 0.0)),
        ] {
            let tr = transcript(
                2,
                2,
                vec![
                    u(1, 0, f32::from(u8::from(zero[0])), zero[0]),
                    u(1, 1, f32::from(u8::from(one[0])), one[0]),
                    u(2, 0, f32::from(u8::from(zero[1])), zero[1]),
                    u(2, 1, f32::from(u8::from(one[1])), one[1]),
                ],
            );
            let r = shape(&code, &tr).unwrap();
            assert_eq!(
                (part(&r[0], "beta-0"), part(&r[0], "beta-1")),
                want,
                "agent 0 {zero:?}, agent 1 {one:?}"
            );
            // The paper's rule credits only the others' wrong -> right, with a plus sign.
            let paper = shape(&with_incentives(), &tr).unwrap();
            let moved = !one[0] && one[1];
            let credit = match (moved, zero[0]) {
                (false, _) => (0.0, 0.0),
                (true, true) => (0.0, 7.0),
                (true, false) => (5.0, 0.0),
            };
            assert_eq!(
                (part(&paper[0], "beta-0"), part(&paper[0], "beta-1")),
                credit
            );
        }
    }

    #[test]
    fn only_non_zero_coefficients_get_parts() {
        let s = Settings {
            beta_0: 2.0,
            ..Settings::default()
        };
        let r = shape(&s, &worked()).unwrap();
        let names: Vec<&str> = r[0].parts.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, vec!["influence", "beta-0"]);
    }

    #[test]
    fn edge_cases() {
        assert!(shape(&Settings::default(), &transcript(2, 3, vec![]))
            .unwrap()
            .is_empty());
        let dup = transcript(2, 3, vec![u(1, 0, 0.0, false), u(1, 0, 1.0, true)]);
        assert!(shape(&Settings::default(), &dup).is_err());
    }

    #[test]
    fn settings() {
        assert_eq!(Settings::parse("{}").unwrap(), Settings::default());
        let s = Settings::parse(
            r#"{"gamma": 0.5, "horizon": "last", "share": "individual", "alpha_1": 2,
                "beta_sign": "code"}"#,
        )
        .unwrap();
        assert_eq!(s.gamma, 0.5);
        assert_eq!(s.horizon, Horizon::Last);
        assert_eq!(s.share, Share::Individual);
        assert_eq!(s.alpha_1, 2.0);
        assert_eq!(s.beta_sign, BetaSign::Code);
        assert_eq!(
            Settings::parse(r#"{"gamma": 1.5}"#).unwrap_err(),
            "influence: setting `gamma` must be in [0, 1], got 1.5"
        );
        let e = Settings::parse(r#"{"horizon": "sum"}"#).unwrap_err();
        assert!(
            e.contains("expected one of `discounted-sum`, `last`, `current`"),
            "{e}"
        );
        let e = Settings::parse(r#"{"alpha1": 2}"#).unwrap_err();
        assert!(e.contains("did you mean `alpha_1`"), "{e}");
    }
}
