//! A team whose agents are held by several processes (`distributed.placement = "agents"`):
//! each rank holds some agents' models (agent r on rank r), generates their responses for
//! the whole batch, and the responses' texts are all-gathered, so that every rank holds
//! every debate and runs the plugins on the same inputs. The token ids of a response stay
//! with the rank that generated it: only its agent's update reads them.

use anyhow::bail;
use serde::{Deserialize, Serialize};

use super::{Request, Response, Team, TokenIds};
use crate::debate::ModelTeam;
use crate::distributed::{gather_json, World};
use crate::transcript::ChatMessage;

/// A [`ModelTeam`] loaded in part ([`ModelTeam::load_part`]) on each of `world`'s ranks,
/// answering as the whole team. Every rank must ask it the same things in the same order
/// (the debates are the same on every rank, since the plugins are deterministic).
pub struct SpreadTeam<'a> {
    team: &'a mut ModelTeam,
    world: &'a dyn World,
}

impl<'a> SpreadTeam<'a> {
    pub fn new(team: &'a mut ModelTeam, world: &'a dyn World) -> SpreadTeam<'a> {
        SpreadTeam { team, world }
    }
}

/// One response as the other ranks receive it: its text and sizes, not its token ids.
#[derive(Serialize, Deserialize)]
struct Said {
    request: usize,
    text: String,
    prompt_tokens: usize,
    response_tokens: usize,
}

impl Team for SpreadTeam<'_> {
    fn admit(&self, agent: u32, messages: &[ChatMessage]) -> Result<(), String> {
        Team::admit(&*self.team, agent, messages)
    }

    /// Each rank judges the prompts of the agents it holds; the verdicts are all-gathered,
    /// so every rank refuses the same prompts.
    fn admit_all(&self, asks: &[(u32, &[ChatMessage])]) -> anyhow::Result<Vec<Result<(), String>>> {
        let mine: Vec<Option<Result<(), String>>> = asks
            .iter()
            .map(|&(a, m)| {
                self.team
                    .holds(a as usize)
                    .then(|| Team::admit(&*self.team, a, m))
            })
            .collect();
        let all = gather_json(self.world, &mine, "prompt admissions")?;
        asks.iter()
            .enumerate()
            .map(|(i, &(a, _))| {
                let verdict = all
                    .iter()
                    .find_map(|theirs| theirs.get(i).cloned().flatten());
                Ok(verdict.unwrap_or_else(|| {
                    Err(format!(
                        "a prompt for agent {a}, but no rank holds it (the team has {} agents \
                         over {} ranks)",
                        self.team.len(),
                        self.world.size()
                    ))
                }))
            })
            .collect()
    }

    fn respond(&mut self, turn: u32, requests: &[Request<'_>]) -> anyhow::Result<Vec<Response>> {
        let here: Vec<usize> = (0..requests.len())
            .filter(|&i| self.team.holds(requests[i].agent as usize))
            .collect();
        let asked: Vec<Request<'_>> = here.iter().map(|&i| requests[i]).collect();
        let answered = self.team.respond(turn, &asked)?;
        let said: Vec<Said> = here
            .iter()
            .zip(&answered)
            .map(|(&request, r)| Said {
                request,
                text: r.text.clone(),
                prompt_tokens: r.prompt_tokens,
                response_tokens: r.response_tokens,
            })
            .collect();
        let mut out: Vec<Option<Response>> = vec![None; requests.len()];
        for (rank, theirs) in gather_json(self.world, &said, "responses")?
            .into_iter()
            .enumerate()
        {
            for s in theirs {
                match out.get_mut(s.request) {
                    Some(slot @ None) => {
                        *slot = Some(Response {
                            text: s.text,
                            prompt_tokens: s.prompt_tokens,
                            response_tokens: s.response_tokens,
                            ids: TokenIds::default(),
                        })
                    }
                    _ => bail!(
                        "turn {turn}: rank {rank} answered request {} of {}, which is not \
                         one or was answered already",
                        s.request,
                        requests.len()
                    ),
                }
            }
        }
        // This rank's own responses keep their token ids (and policy traces) for the update.
        for (&i, r) in here.iter().zip(answered) {
            if let Some(slot) = &mut out[i] {
                slot.ids = r.ids;
            }
        }
        out.into_iter()
            .enumerate()
            .map(|(i, r)| match r {
                Some(r) => Ok(r),
                None => bail!(
                    "turn {turn}: no rank answered request {i} (agent {})",
                    requests[i].agent
                ),
            })
            .collect()
    }
}
