//! `maporl toy`: the toy collaboration game of the paper's Section 2 (arXiv 2502.18439).
//!
//! The paper gives the shape of the model (two agents, actions collaborate / act
//! independently, a synergy reward R_syn(q) paid only when at least C(q) agents collaborate)
//! but not the exact payoffs; this module is a reconstruction and states its assumptions in
//! [`ASSUMPTIONS`] (printed by the CLI).
//!
//! # The game (reconstruction)
//!
//! An episode is T rounds played by two agents. In round t a question q is drawn uniformly
//! from [`QUESTION_BANK`], which holds its base success probability p(q). Each agent chooses
//! `a_i` in {collaborate, independent}; each agent's own answer is correct with probability
//! p(q) (reward `z_i` in {0, 1}), whatever it chose. Its reward for the round is
//!
//! ```text
//! u_i = z_i + [a_i = collaborate] * ( R_syn * [n_collaborators >= C] - c )
//! ```
//!
//! that is: collaborating always costs `c` (the effort of the exchange), and pays the synergy
//! `R_syn` to each collaborator only when at least `C` of the two agents collaborate (C = 2 by
//! default: both). `R_syn(q) = R_syn` and `C(q) = C` for every q; q only adds noise through
//! p(q), which cancels in every comparison between actions. The episode return is the
//! undiscounted sum over the T rounds.
//!
//! Policies are logistic in `[1, partner collaborated last round, partner independent last
//! round, t / (T - 1)]` (see [`features`]), start uniform (P(collaborate) = 1/2), and are
//! trained by REINFORCE with reward-to-go and a per-round baseline ([`train`]). In the
//! *single* setting one learner plays a fixed partner that collaborates i.i.d. with
//! probability rho (`partner_rate`) whatever happens; in the *joint* setting two learners with
//! separate policies are trained on the same episodes.
//!
//! # Thresholds (derived, see [`thresholds`])
//!
//! Write `g = u_i(collaborate) - u_i(independent)` for one round, the partner's action fixed.
//! With C = 2, `g = R_syn * [partner collaborates] - c`; with C = 1, `g = R_syn - c`.
//!
//! * **Dominance, `R_syn < c`.** Then `g <= R_syn - c < 0` in every round and after every
//!   history: a round's reward under "independent" is strictly higher whatever anyone does,
//!   and the partner's later actions cannot raise it. So never collaborating is strictly
//!   dominant in the repeated game, and *neither setting collaborates* (for any T).
//! * **Single learner, C = 2.** Against an i.i.d. partner the learner's action cannot change
//!   the partner's future, so each round is a one-shot decision with `E[g] = rho * R_syn - c`:
//!   the best response is to collaborate iff `R_syn > c / rho` (never if rho = 0). This is
//!   Observation 1: a partner that collaborates too rarely (rho < c / R_syn) teaches the
//!   learner to act independently.
//! * **Joint learners, C = 2.** The stage game is a stag hunt for `R_syn > c`: both
//!   collaborating and both independent are equilibria. From the uniform start the partner
//!   collaborates with probability 1/2 and its policy does not yet depend on my past action,
//!   so the first gradient has the sign of `R_syn / 2 - c`: for `R_syn > 2c` (collaboration
//!   risk-dominant) both learners climb to the collaborative equilibrium, which is
//!   self-reinforcing as the partner's rate rises; for `R_syn < 2c` both slide to
//!   independence, and the reciprocity a history feature could encode never gets started.
//!   This is Observation 2, with threshold `2c`, independent of T.
//! * **C = 1.** Collaborating pays `R_syn - c` on its own: both settings collaborate iff
//!   `R_syn > c`.
//!
//! So with the defaults (c = 1, rho = 0.2, C = 2), for `2 < R_syn < 5` joint training ends
//! collaborating while the single learner does not; below `R_syn = 2` neither does (below 1
//! provably for any learner); above 5 both do.
//!
//! # Use
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! # use maporl::toy;
//! let cfg = toy::ToyConfig { r_syn: 3.0, ..Default::default() };
//! let curves = toy::run_grid(&cfg, &[10, 20])?;
//! println!("{}\n{}", toy::ASSUMPTIONS, toy::table(&curves));
//! toy::write_outputs(std::path::Path::new("runs/toy"), &curves)?; // toy.svg + toy.json
//! # Ok(()) }
//! ```

mod game;
mod svg;
#[cfg(test)]
mod tests;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

pub use game::{
    features, play_round, train, Curve, Policy, Prev, Setting, ToyConfig, N_FEATURES, QUESTION_BANK,
};
pub use svg::{render_svg, HEIGHT, WIDTH};

/// The payoff assumptions of this reconstruction, for the CLI to print.
pub const ASSUMPTIONS: &str = "\
Toy collaboration game (reconstruction of the paper's Section 2; the exact payoffs are not given there).
- Two agents, T rounds; each round a question q is drawn uniformly, with base success p(q) in {0.2, 0.4, 0.6, 0.8}.
- Each agent chooses collaborate or independent; its own answer is correct (reward 1) with probability p(q) either way.
- Collaborating costs c every time; each collaborator also gets the synergy R_syn when at least C agents collaborate
  (C = 2 of 2 by default): u_i = z_i + [a_i = collab] * (R_syn * [n_collab >= C] - c). R_syn(q) = R_syn, C(q) = C for all q.
- Return = undiscounted sum over the T rounds. Policies: logistic in (bias, partner collaborated last round,
  partner independent last round, t/(T-1)), start at P(collab) = 1/2, trained with REINFORCE (reward-to-go, per-round baseline).
- single: one learner vs a fixed partner collaborating i.i.d. with probability rho; joint: two learners trained together.
- Thresholds (C = 2): R_syn < c -> collaborating is strictly dominated, nobody collaborates; single learner collaborates
  iff R_syn > c/rho; joint learners from the uniform start reach mutual collaboration iff R_syn > 2c (risk dominance).
  (C = 1: both iff R_syn > c.)
- Collaboration rate = learners' mean P(collaborate) over the states visited in each training iteration.";

/// The analytic thresholds on R_syn for a configuration (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Thresholds {
    /// Below this (`c`) collaborating is strictly dominated: no learner collaborates.
    pub dominated_below: f64,
    /// Above this joint learners started uniform reach mutual collaboration (`2c`, or `c`
    /// when C = 1).
    pub joint_above: f64,
    /// Above this the single learner's best response to the fixed partner is to collaborate
    /// (`c / rho`, or `c` when C = 1); infinite (JSON `null`) when rho = 0 and C = 2.
    pub single_above: f64,
}

/// The analytic thresholds of [`Thresholds`] for `cfg` (they do not depend on T).
pub fn thresholds(cfg: &ToyConfig) -> Thresholds {
    let c = cfg.cost;
    if cfg.threshold <= 1 {
        return Thresholds {
            dominated_below: c,
            joint_above: c,
            single_above: c,
        };
    }
    Thresholds {
        dominated_below: c,
        joint_above: 2.0 * c,
        single_above: if cfg.partner_rate > 0.0 {
            c / cfg.partner_rate
        } else {
            f64::INFINITY
        },
    }
}

/// Trains every combination of `rounds` (T values, in order) x {single, joint} from the same
/// base config (its `rounds` field is overridden), single before joint for each T.
pub fn run_grid(cfg: &ToyConfig, rounds: &[usize]) -> Result<Vec<Curve>> {
    let mut out = Vec::with_capacity(2 * rounds.len());
    for &t in rounds {
        let c = ToyConfig {
            rounds: t,
            ..cfg.clone()
        };
        for setting in [Setting::Single, Setting::Joint] {
            out.push(train(&c, setting)?);
        }
    }
    Ok(out)
}

/// A plain-text summary: per curve, the collaboration rate at the start, at 1/4, 1/2 and 3/4
/// of training, at the end (mean of the last tenth), the final mutual-collaboration rate and
/// mean reward per round; then the analytic thresholds of the first curve's config.
pub fn table(curves: &[Curve]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<16} {:>6} {:>7} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7} {:>7}",
        "run", "R_syn", "iters", "start", "1/4", "1/2", "3/4", "final", "mutual", "reward"
    );
    for c in curves {
        let r = &c.collab_rate;
        let at = |f: f64| {
            if r.is_empty() {
                f64::NAN
            } else {
                r[((r.len() - 1) as f64 * f).round() as usize]
            }
        };
        let tail = |v: &[f64]| {
            let k = (v.len() / 10).max(1);
            v.iter().rev().take(k).sum::<f64>() / k as f64
        };
        let _ = writeln!(
            s,
            "{:<16} {:>6.2} {:>7} {:>6.3} {:>6.3} {:>6.3} {:>6.3} {:>6.3} {:>7.3} {:>7.3}",
            c.label,
            c.config.r_syn,
            r.len(),
            at(0.0),
            at(0.25),
            at(0.5),
            at(0.75),
            c.final_rate(),
            c.final_mutual_rate(),
            tail(&c.mean_reward),
        );
    }
    if let Some(c) = curves.first() {
        let th = thresholds(&c.config);
        let _ = writeln!(
            s,
            "analytic thresholds (c = {}, C = {}, rho = {}): collaboration dominated for R_syn < {:.3}; \
             joint collaborates for R_syn > {:.3}; single collaborates for R_syn > {:.3}",
            c.config.cost,
            c.config.threshold,
            c.config.partner_rate,
            th.dominated_below,
            th.joint_above,
            th.single_above
        );
    }
    s
}

/// The JSON written to `toy.json`: `{"assumptions", "thresholds", "curves"}` (thresholds of the
/// first curve's config; every curve carries its own config).
pub fn report_json(curves: &[Curve]) -> serde_json::Value {
    serde_json::json!({
        "assumptions": ASSUMPTIONS,
        "thresholds": curves.first().map(|c| thresholds(&c.config)),
        "curves": curves,
    })
}

/// Writes `toy.svg` (all curves in one figure) and `toy.json` ([`report_json`]) into `dir`,
/// creating it; returns the two paths.
pub fn write_outputs(dir: &Path, curves: &[Curve]) -> Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let r_syn = curves.first().map_or(f64::NAN, |c| c.config.r_syn);
    let title =
        format!("Toy collaboration game: collaboration rate over training (R_syn = {r_syn})");
    let svg_path = dir.join("toy.svg");
    std::fs::write(&svg_path, render_svg(curves, &title))
        .with_context(|| format!("writing {}", svg_path.display()))?;
    let json_path = dir.join("toy.json");
    let json = serde_json::to_string_pretty(&report_json(curves))?;
    std::fs::write(&json_path, json + "\n")
        .with_context(|| format!("writing {}", json_path.display()))?;
    Ok((svg_path, json_path))
}
