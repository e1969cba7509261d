//! Final-only reward: every utterance of agent a is rewarded with the final turn's score
//! (T = the last turn present in the transcript). One part, ("final", value).
//!
//! Settings (JSON, all optional):
//! - `share` ("individual" | "all", "individual"): agent a's own score at T, or the mean
//!   score of every agent at T. Under round-robin an agent may not speak at T; "individual"
//!   then uses its latest score;
//! - `last_turn_only` (bool, false): reward only the final turn's utterances.

use maporl_plugin::settings::parse_settings;
use maporl_plugin::transcript::{check, last_turn, latest, mean_score};
use maporl_plugin::{reward, Reward, RewardShaper, Task, Transcript};
use serde::Deserialize;

/// The plugin's name in error messages.
pub const PLUGIN: &str = "final-only";

/// Whose final score counts.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Share {
    /// The agent's own final score.
    #[default]
    Individual,
    /// The mean final score of the team.
    All,
}

/// The final-only shaper's settings.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Whose final score counts.
    pub share: Share,
    /// Reward only the final turn's utterances.
    pub last_turn_only: bool,
}

impl Settings {
    /// Parses the `configure` document.
    pub fn parse(json: &str) -> Result<Self, String> {
        parse_settings(PLUGIN, json)
    }
}

/// `shape`: see the crate docs.
pub fn shape(settings: &Settings, transcript: &Transcript) -> Result<Vec<Reward>, String> {
    check(PLUGIN, transcript)?;
    let Some(last) = last_turn(transcript) else {
        return Ok(Vec::new());
    };
    let team = mean_score(transcript, last).unwrap_or(0.0);
    Ok(transcript
        .utterances
        .iter()
        .filter(|u| !settings.last_turn_only || u.turn == last)
        .map(|u| {
            let value = match settings.share {
                Share::All => team,
                Share::Individual => latest(transcript, u.agent, last)
                    .map_or(f64::from(u.score), |l| f64::from(l.score)),
            };
            reward(u.turn, u.agent, [("final", value)])
        })
        .collect())
}

/// The final-only reward shaper.
pub struct FinalOnly {
    settings: Settings,
}

impl RewardShaper for FinalOnly {
    const NAME: &'static str = PLUGIN;
    type Settings = Settings;

    fn new(settings: Settings) -> Result<Self, String> {
        Ok(Self { settings })
    }

    fn shape(&self, _task: &Task, transcript: &Transcript) -> Result<Vec<Reward>, String> {
        shape(&self.settings, transcript)
    }
}

maporl_plugin::export_reward_shaper!(FinalOnly);

#[cfg(test)]
mod tests {
    use super::*;
    use maporl_plugin::testing::{transcript, utt};

    fn debate() -> Transcript {
        transcript(
            2,
            3,
            vec![
                utt(1, 0, "", None, 0.1),
                utt(1, 1, "", None, 0.2),
                utt(2, 0, "", None, 0.3),
                utt(2, 1, "", None, 0.4),
            ],
        )
    }

    fn values(r: &[Reward]) -> Vec<(u32, u32, f32)> {
        r.iter().map(|r| (r.turn, r.agent, r.total)).collect()
    }

    #[test]
    fn individual_final_scores() {
        let r = shape(&Settings::default(), &debate()).unwrap();
        assert_eq!(
            values(&r),
            vec![(1, 0, 0.3), (1, 1, 0.4), (2, 0, 0.3), (2, 1, 0.4)]
        );
        assert_eq!(r[0].parts, vec![("final".to_string(), 0.3)]);
    }

    #[test]
    fn team_mean_and_last_turn_only() {
        let all = Settings {
            share: Share::All,
            ..Settings::default()
        };
        let r = shape(&all, &debate()).unwrap();
        assert!(r.iter().all(|r| (r.total - 0.35).abs() < 1e-6));
        let last = Settings {
            last_turn_only: true,
            ..Settings::default()
        };
        let r = shape(&last, &debate()).unwrap();
        assert_eq!(values(&r), vec![(2, 0, 0.3), (2, 1, 0.4)]);
    }

    #[test]
    fn round_robin_uses_each_agents_latest_score() {
        let tr = transcript(
            2,
            3,
            vec![
                utt(1, 0, "", None, 0.1),
                utt(2, 1, "", None, 0.5),
                utt(3, 0, "", None, 0.9),
            ],
        );
        let r = shape(&Settings::default(), &tr).unwrap();
        assert_eq!(values(&r), vec![(1, 0, 0.9), (2, 1, 0.5), (3, 0, 0.9)]);
        assert!(shape(&Settings::default(), &transcript(2, 3, vec![]))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn settings() {
        let s = Settings::parse(r#"{"share": "all", "last_turn_only": true}"#).unwrap();
        assert_eq!(s.share, Share::All);
        let e = Settings::parse(r#"{"share": "team"}"#).unwrap_err();
        assert!(e.contains("expected `individual` or `all`"), "{e}");
    }
}
