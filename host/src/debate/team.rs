//! LLM agents as a debate team: each agent's prompts are rendered with its model's chat
//! template and generated in batches across tasks, with its own seeded sampler.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{bail, Context};
use candle_core::{DType, Device};

use super::{Request, Response, Team, TokenIds};
use crate::model::{
    self, Agent, ChatTemplate, GenerateOptions, PrefixCache, PrefixStats, Sampler, SamplingParams,
};
use crate::transcript::ChatMessage;

/// What an agent needs to talk: its model's tokenizer, chat template and stop tokens.
struct Voice {
    tokenizer: tokenizers::Tokenizer,
    template: ChatTemplate,
    stop_tokens: Vec<u32>,
    pad_token: u32,
}

struct Member {
    agent: Agent,
    voice: Arc<Voice>,
    /// A learning agent ([`ModelTeam::mark_learner`]): with its adapter it records what its
    /// update needs of its tokens as it generates them.
    learner: bool,
}

/// A team of LLM agents. Agents on the same model file share its frozen weights, and while
/// they have no adapters of their own their prompts are generated in one batch.
pub struct ModelTeam {
    /// Each agent's model, or `None` for an agent another process holds
    /// ([`ModelTeam::load_part`]).
    members: Vec<Option<Member>>,
    /// How each agent samples.
    sampling: Vec<SamplingParams>,
    /// Each agent's sampler: the team's own random streams (a [`Seated`] view has its own).
    samplers: Vec<Sampler>,
    /// Turns before this one are answered by the bare base models, adapters unused (the
    /// paper's frozen turn-1 policy with a "collaboration" adapter for later turns).
    adapters_from_turn: u32,
    max_new_tokens: usize,
    batch_size: usize,
    /// Paired draws' seed ([`ModelTeam::pair_draws`]).
    paired: Option<u64>,
    /// Whether learners record their policy traces under paired draws (training with
    /// [`ModelTeam::draw_per_request`]; evaluations record nothing).
    trace_paired: bool,
    /// The generation prefix cache (`generation.prefix_cache_mib`); `None` when off.
    prefixes: Option<Mutex<PrefixCache>>,
    /// Its budget, which each [`Seated`] view's own cache gets too.
    prefix_cache_bytes: usize,
}

/// Sampling and batching of a [`ModelTeam`].
#[derive(Clone, Debug)]
pub struct TeamOptions {
    /// How each agent samples, one entry per agent.
    pub sampling: Vec<SamplingParams>,
    pub max_new_tokens: usize,
    /// Most prompts generated together.
    pub batch_size: usize,
    pub seed: u64,
    pub dtype: DType,
    /// Bytes of prompts' keys and values kept for the prompts that extend them (0: none).
    pub prefix_cache_bytes: usize,
}

impl ModelTeam {
    /// Loads one agent per entry of `model_paths` (each an HF folder or a GGUF file), agent
    /// i on `devices[i]`. Agents with the same model on the same device share its weights.
    pub fn load(
        model_paths: &[std::path::PathBuf],
        devices: &[Device],
        opts: &TeamOptions,
    ) -> anyhow::Result<ModelTeam> {
        let here: Vec<Option<Device>> = devices.iter().cloned().map(Some).collect();
        Self::load_part(model_paths, &here, opts)
    }

    /// [`load`](Self::load) of the agents this process holds: agent i on `devices[i]`, or
    /// not loaded at all where that is `None` (one agent per rank,
    /// `distributed.placement = "agents"`). Asking an agent that is not here to speak is an
    /// error; it still has its place, so agent ids and random streams stay the team's.
    pub fn load_part(
        model_paths: &[std::path::PathBuf],
        devices: &[Option<Device>],
        opts: &TeamOptions,
    ) -> anyhow::Result<ModelTeam> {
        if devices.len() != model_paths.len() || opts.sampling.len() != model_paths.len() {
            bail!(
                "{} devices and {} sampling settings for {} agents",
                devices.len(),
                opts.sampling.len(),
                model_paths.len()
            );
        }
        type Key<'a> = (&'a std::path::Path, String);
        let mut loaded: HashMap<Key, (Arc<model::Base>, Arc<Voice>)> = HashMap::new();
        let mut members = Vec::new();
        let mut samplers = Vec::new();
        for (i, (path, device)) in model_paths.iter().zip(devices).enumerate() {
            // Each agent samples from its own stream, the same on every run.
            samplers.push(agent_sampler(opts.sampling[i], opts.seed, i));
            let Some(device) = device else {
                members.push(None);
                continue;
            };
            let key = (path.as_path(), format!("{:?}", device.location()));
            if !loaded.contains_key(&key) {
                let l = model::load(path, opts.dtype, device).with_context(|| {
                    format!("loading the model of agent {i} from {}", path.display())
                })?;
                let (base, voice) =
                    split(l).with_context(|| format!("model {}", path.display()))?;
                loaded.insert(key.clone(), (Arc::new(base), Arc::new(voice)));
            }
            let (base, voice) = loaded[&key].clone();
            members.push(Some(Member {
                agent: Agent::new(base),
                voice,
                learner: false,
            }));
        }
        Ok(ModelTeam {
            members,
            sampling: opts.sampling.clone(),
            samplers,
            adapters_from_turn: 1,
            paired: None,
            trace_paired: false,
            max_new_tokens: opts.max_new_tokens,
            batch_size: opts.batch_size.max(1),
            prefixes: new_prefix_cache(opts.prefix_cache_bytes),
            prefix_cache_bytes: opts.prefix_cache_bytes,
        })
    }

    /// Agent `a`, e.g. to give it an adapter and a value head for training. Panics for an
    /// agent another process holds (see [`holds`](Self::holds)).
    pub fn agent_mut(&mut self, a: usize) -> &mut Agent {
        &mut self.members[a]
            .as_mut()
            .unwrap_or_else(|| panic!("agent {a} is held by another process"))
            .agent
    }

    /// Marks agent `a` as learning: from now on, speaking with its adapter, it records its
    /// policy trace (its log-probs at its sampling temperature, and its value head's values
    /// if it has one) for its update. Panics for an agent another process holds.
    pub fn mark_learner(&mut self, a: usize) {
        self.members[a]
            .as_mut()
            .unwrap_or_else(|| panic!("agent {a} is held by another process"))
            .learner = true;
    }

    pub fn agent(&self, a: usize) -> &Agent {
        &self.member(a).agent
    }

    /// Whether this process holds agent `a`'s model (every agent, unless the team was
    /// loaded with [`load_part`](Self::load_part)).
    pub fn holds(&self, a: usize) -> bool {
        self.members.get(a).is_some_and(Option::is_some)
    }

    fn member(&self, a: usize) -> &Member {
        self.members[a]
            .as_ref()
            .unwrap_or_else(|| panic!("agent {a} is held by another process"))
    }

    /// Agent `a`'s model, or an error saying why it cannot speak here.
    fn present(&self, a: usize) -> Result<&Member, String> {
        match self.members.get(a) {
            Some(Some(m)) => Ok(m),
            Some(None) => Err(format!(
                "agent {a} is held by another process (distributed.placement = \"agents\")"
            )),
            None => Err(format!(
                "no agent {a}: the team has {} agents",
                self.members.len()
            )),
        }
    }

    /// Answers turns before `turn` with the bare base models, ignoring the agents' adapters
    /// (1, the default: adapters speak on every turn).
    pub fn use_adapters_from_turn(&mut self, turn: u32) {
        self.adapters_from_turn = turn.max(1);
    }

    /// Each agent's sampler position, for a checkpoint.
    pub fn rng_states(&self) -> Vec<model::RngState> {
        self.samplers.iter().map(Sampler::state).collect()
    }

    /// Puts every agent's sampler back where [`rng_states`](Self::rng_states) found it.
    pub fn restore_rng_states(&mut self, states: &[model::RngState]) -> anyhow::Result<()> {
        if states.len() != self.samplers.len() {
            bail!(
                "the checkpoint has sampler states for {} agents, the team has {}",
                states.len(),
                self.samplers.len()
            );
        }
        for (a, (sampler, s)) in self.samplers.iter_mut().zip(states).enumerate() {
            sampler
                .restore(s)
                .with_context(|| format!("agent {a}'s sampler"))?;
        }
        Ok(())
    }

    /// The team with random streams of its own, seeded by `seed` (agent i's is the stream
    /// a team loaded with that seed gives agent i): any number of seated views of one team
    /// can debate at the same time (a server's requests), each giving the same debate for the
    /// same seed whatever the others do, before or beside it. So each view has a prefix cache
    /// of its own (with the team's budget), emptied with it: its prompts share prefixes
    /// with its own earlier prompts only, and its generation waits on no other view's.
    pub fn seated(&self, seed: u64) -> Seated<'_> {
        Seated {
            team: self,
            samplers: (0..self.members.len())
                .map(|a| agent_sampler(self.sampling[a], seed, a))
                .collect(),
            prefixes: new_prefix_cache(self.prefix_cache_bytes),
        }
    }

    /// How agent `agent` samples by default (the config's `generation` with its overrides).
    pub fn sampling(&self, agent: usize) -> SamplingParams {
        self.sampling[agent]
    }

    /// The number of agents.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Responses of agents on one base, generated together in batches of up to
    /// `batch_size` rows (each agent's rows with its own adapter and value head): `asks`
    /// holds each agent's requests, in agent order. Before `adapters_from_turn` (`adapted`
    /// false) the agents speak as the bare base. Each agent draws from its sampler in
    /// `samplers`, or, with paired draws, each request from a stream of its own.
    fn respond_together(
        &self,
        samplers: &mut [Sampler],
        prefixes: Option<&Mutex<PrefixCache>>,
        turn: u32,
        adapted: bool,
        asks: &[(usize, Vec<Request<'_>>)],
    ) -> anyhow::Result<Vec<Vec<Response>>> {
        // Rendered and tokenized over the pool, in order.
        let prompts: Vec<Vec<Vec<u32>>> = asks
            .iter()
            .map(|(agent, requests)| {
                use rayon::prelude::*;
                requests
                    .par_iter()
                    .map(|r| self.prompt_ids(*agent, r.messages))
                    .collect::<anyhow::Result<Vec<_>>>()
            })
            .collect::<anyhow::Result<_>>()?;
        let bare: Vec<Agent> = asks
            .iter()
            .map(|&(a, _)| Agent::new(self.member(a).agent.base.clone()))
            .collect();
        let speaking: Vec<&Agent> = (0..asks.len())
            .map(|k| {
                if adapted {
                    &self.member(asks[k].0).agent
                } else {
                    &bare[k]
                }
            })
            .collect();
        // All agents on one base read with one tokenizer and stop at the same tokens.
        let voice = self.member(asks[0].0).voice.clone();
        let opts = GenerateOptions {
            max_new_tokens: self.max_new_tokens,
            stop_tokens: voice.stop_tokens.clone(),
            pad_token: voice.pad_token,
        };
        // The rows, agent by agent, cut into batches.
        let rows: Vec<(usize, usize)> = prompts
            .iter()
            .enumerate()
            .flat_map(|(k, p)| (0..p.len()).map(move |i| (k, i)))
            .collect();
        // Paired draws: the stream of a request is fixed by what it is, not by its place.
        let mut occurrence: HashMap<(&str, u32), u64> = HashMap::new();
        let streams: Vec<Option<u64>> = rows
            .iter()
            .map(|&(k, i)| {
                let r = &asks[k].1[i];
                self.paired.map(|seed| {
                    let n = occurrence.entry((r.task, r.agent)).or_default();
                    *n += 1;
                    stream_seed(seed, r.task, r.agent, turn, *n - 1)
                })
            })
            .collect();
        let mut out: Vec<Vec<Response>> = prompts.iter().map(|_| Vec::new()).collect();
        let batch_rows = self.batch_size.max(1);
        for (b, batch) in rows.chunks(batch_rows).enumerate() {
            // Who draws for which rows: (k, first prompt, prompts), each agent's contiguous
            // share of the batch, or each row alone with paired draws.
            let mut units: Vec<(usize, usize, usize)> = Vec::new();
            for &(k, i) in batch {
                match units.last_mut() {
                    Some((last, _, n)) if *last == k && self.paired.is_none() => *n += 1,
                    _ => units.push((k, i, 1)),
                }
            }
            let mut own: Vec<Sampler> = streams[b * batch_rows..b * batch_rows + batch.len()]
                .iter()
                .zip(batch)
                .filter_map(|(stream, &(k, _))| {
                    stream.map(|s| Sampler::new(self.sampling[asks[k].0], s))
                })
                .collect();
            let mut own = own.iter_mut();
            let mut free: Vec<Option<&mut Sampler>> = samplers.iter_mut().map(Some).collect();
            let mut speakers = Vec::with_capacity(units.len());
            for &(k, first, n) in &units {
                let agent = speaking[k];
                let sampler = match self.paired {
                    Some(_) => own.next().expect("one stream per row"),
                    None => free[asks[k].0]
                        .take()
                        .expect("one share per agent in a batch"),
                };
                // A learner speaking with its adapter records what its update needs of its
                // tokens as it generates them, at the temperature it samples (and its update
                // scores) at;
                // evaluations (paired draws) train on nothing and record nothing.
                let traced = adapted
                    && self.member(asks[k].0).learner
                    && (self.paired.is_none() || self.trace_paired);
                speakers.push(model::Speaker {
                    agent,
                    prompts: &prompts[k][first..first + n],
                    trace_at: traced.then(|| sampler.params().temperature),
                    sampler,
                });
            }
            let generations = match prefixes {
                Some(p) => model::generate_sharing(&mut speakers, &opts, &mut lock(p))?,
                None => model::generate_together(&mut speakers, &opts)?,
            };
            for (&(k, first, _), gens) in units.iter().zip(generations) {
                let agent = asks[k].0;
                for (prompt, g) in prompts[k][first..].iter().zip(gens) {
                    let text = voice
                        .tokenizer
                        .decode(&g.tokens, true)
                        .map_err(|e| anyhow::anyhow!("decoding agent {agent}'s response: {e}"))?;
                    out[k].push(Response {
                        text: text.trim().to_string(),
                        prompt_tokens: prompt.len(),
                        response_tokens: g.tokens.len(),
                        ids: TokenIds {
                            prompt: prompt.clone(),
                            response: g.tokens,
                            policy: g.trace,
                        },
                    });
                }
            }
        }
        Ok(out)
    }

    /// `cache` (the team's generation prefix cache or a seated view's), when it is on and
    /// can serve this team: not while an agent fine-tunes its base's own weights, which the
    /// cache's keys do not follow.
    fn usable<'c>(&self, cache: &'c Option<Mutex<PrefixCache>>) -> Option<&'c Mutex<PrefixCache>> {
        let full = self
            .members
            .iter()
            .flatten()
            .any(|m| !m.agent.weights.is_empty());
        cache.as_ref().filter(|_| !full)
    }

    /// Empties the prefix cache (what it served so far is still counted).
    pub fn forget_prefixes(&self) {
        if let Some(p) = &self.prefixes {
            lock(p).clear();
        }
    }

    /// How much of the prompts generated since the last call the prefix cache served
    /// (nothing when it is off).
    pub fn take_prefix_stats(&self) -> PrefixStats {
        self.prefixes
            .as_ref()
            .map_or_else(PrefixStats::default, |p| lock(p).take_stats())
    }

    /// Paired draws (`Some(seed)`): from now on every response draws from a random stream
    /// of its own, seeded by `seed`, its task, its agent, its turn (and its place among
    /// identical requests), whatever else is generated with it and whatever was generated
    /// before. Two evaluations of a task (before and after training, or two runs' rows at
    /// the same seed) then share their sampling noise and differ only by the weights.
    /// `None` (the default, for training): each agent draws from its own one stream.
    /// Identical requests (same task id, agent and turn) within one `respond` call are told
    /// apart by their order there; across calls they would share a stream, so an evaluation
    /// should not hold one task id twice (`maporl compare` refuses that too).
    pub fn pair_draws(&mut self, seed: Option<u64>) {
        self.paired = seed;
        self.trace_paired = false;
    }

    /// For training split between ranks (`distributed.placement = "data"`): every response
    /// draws from a stream of its own, as with [`pair_draws`](Self::pair_draws), so a
    /// debate's draws do not depend on which other debates share its rank; learners record
    /// their policy traces for PPO as without it. `None` goes back to the team's samplers.
    pub fn draw_per_request(&mut self, seed: Option<u64>) {
        self.paired = seed;
        self.trace_paired = seed.is_some();
    }
}

/// The prefix cache, whoever panicked holding it (what it holds stays consistent: each
/// sequence goes in whole or not at all).
fn lock(p: &Mutex<PrefixCache>) -> MutexGuard<'_, PrefixCache> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// The seed of one request's stream under paired draws (FNV-1a over the request's identity,
/// then SplitMix64's finaliser).
fn stream_seed(seed: u64, task: &str, agent: u32, turn: u32, occurrence: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = seed
        .to_le_bytes()
        .into_iter()
        .chain(task.bytes())
        .chain([0xff])
        .chain(agent.to_le_bytes())
        .chain(turn.to_le_bytes())
        .chain(occurrence.to_le_bytes());
    for b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut z = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl ModelTeam {
    /// The token ids of the prompt `agent`'s model reads for `messages`.
    fn prompt_ids(&self, agent: usize, messages: &[ChatMessage]) -> anyhow::Result<Vec<u32>> {
        let voice = &self.present(agent).map_err(anyhow::Error::msg)?.voice;
        let messages: Vec<model::ChatMessage> = messages
            .iter()
            .map(|m| model::ChatMessage::new(m.role.name(), &m.content))
            .collect();
        let text = voice.template.render(&messages, true)?;
        Ok(voice
            .tokenizer
            .encode(text.as_str(), false)
            .map_err(|e| anyhow::anyhow!("tokenizing agent {agent}'s prompt: {e}"))?
            .get_ids()
            .to_vec())
    }
}

impl ModelTeam {
    fn admit(&self, agent: u32, messages: &[ChatMessage]) -> Result<(), String> {
        let (tokens, context) = self.prompt_and_context(agent as usize, messages)?;
        if tokens + self.max_new_tokens > context {
            return Err(format!(
                "the prompt for agent {agent} is {tokens} tokens; with up to {} new tokens \
                 (generation.max_new_tokens) it needs {} positions, and the agent's model reads \
                 at most {context} (its max_position_embeddings)",
                self.max_new_tokens,
                tokens + self.max_new_tokens
            ));
        }
        Ok(())
    }

    /// One response per request, each agent drawing from `samplers[agent]`.
    fn respond_with(
        &self,
        samplers: &mut [Sampler],
        prefixes: Option<&Mutex<PrefixCache>>,
        turn: u32,
        requests: &[Request<'_>],
    ) -> anyhow::Result<Vec<Response>> {
        let adapted = turn >= self.adapters_from_turn;
        let mut by_agent: Vec<Vec<usize>> = vec![Vec::new(); self.members.len()];
        for (i, r) in requests.iter().enumerate() {
            if let Err(why) = self.present(r.agent as usize) {
                bail!("a request for agent {}: {why}", r.agent);
            }
            by_agent[r.agent as usize].push(i);
        }
        let mut out: Vec<Option<Response>> = vec![None; requests.len()];
        // Generators on one base (adapters or not) generate together, one batch for all.
        let mut done = vec![false; self.members.len()];
        for first in 0..self.members.len() {
            if done[first] || by_agent[first].is_empty() {
                continue;
            }
            let base = &self.member(first).agent.base;
            let group: Vec<usize> = (first..self.members.len())
                .filter(|&a| {
                    !by_agent[a].is_empty()
                        && !done[a]
                        && Arc::ptr_eq(&self.member(a).agent.base, base)
                })
                .collect();
            group.iter().for_each(|&a| done[a] = true);
            let asks: Vec<(usize, Vec<Request<'_>>)> = group
                .iter()
                .map(|&a| (a, by_agent[a].iter().map(|&i| requests[i]).collect()))
                .collect();
            let answers = self.respond_together(samplers, prefixes, turn, adapted, &asks)?;
            for (&a, responses) in group.iter().zip(answers) {
                for (&i, r) in by_agent[a].iter().zip(responses) {
                    out[i] = Some(r);
                }
            }
        }
        Ok(out
            .into_iter()
            .map(|r| r.expect("every request answered"))
            .collect())
    }
}

/// How a [`ModelTeam::complete`] request samples and where it stops.
#[derive(Clone, Debug)]
pub struct CompletionOptions {
    pub sampling: SamplingParams,
    /// The request's own random stream: the same seed gives the same completions.
    pub seed: u64,
    pub max_tokens: usize,
    /// Text that ends a completion where it first appears (it is not included).
    pub stop: Vec<String>,
    /// Completions of the one prompt (generated as one batch, from one stream).
    pub n: usize,
}

/// Why a completion ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The model ended its turn, or a stop string appeared.
    Stop,
    /// `max_tokens` was reached.
    Length,
    /// The caller's observer asked to stop (a client went away).
    Cancelled,
}

/// One completion of a chat.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub text: String,
    pub tokens: usize,
    pub finish: Finish,
}

/// The completions of one chat, and the size of its prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct Completions {
    pub prompt_tokens: usize,
    pub choices: Vec<Completion>,
}

impl ModelTeam {
    /// The length in tokens of agent `agent`'s prompt for `messages`, and of its model's
    /// context.
    fn prompt_and_context(
        &self,
        agent: usize,
        messages: &[ChatMessage],
    ) -> Result<(usize, usize), String> {
        let member = self.present(agent)?;
        let tokens = self
            .prompt_ids(agent, messages)
            .map_err(|e| format!("{e:#}"))?
            .len();
        Ok((tokens, member.agent.base.config().max_position_embeddings))
    }

    /// The length in tokens of the prompt agent `agent` reads for `messages`.
    pub fn prompt_tokens(&self, agent: usize, messages: &[ChatMessage]) -> anyhow::Result<usize> {
        anyhow::ensure!(agent < self.members.len(), "no agent {agent}");
        Ok(self.prompt_ids(agent, messages)?.len())
    }

    /// Checks that agent `agent` can answer `messages` with up to `max_tokens` new tokens;
    /// returns the prompt's length in tokens, or says what does not fit.
    pub fn check_chat(
        &self,
        agent: usize,
        messages: &[ChatMessage],
        max_tokens: usize,
    ) -> Result<usize, String> {
        let (tokens, context) = self.prompt_and_context(agent, messages)?;
        if tokens + max_tokens > context {
            return Err(format!(
                "the prompt is {tokens} tokens; with max_tokens = {max_tokens} it needs {} \
                 positions, and agent {agent}'s model reads at most {context}",
                tokens + max_tokens
            ));
        }
        Ok(tokens)
    }

    /// Agent `agent` (with its adapter, if it has one) continues the chat `messages`, as
    /// `opts` says. `on_text(choice, delta)` hears each piece of text as soon as it is known
    /// (whole characters; text that might still become a stop string is held back until it
    /// cannot); when it returns false, generation stops and every choice ends `Cancelled`.
    /// The text is independent of `on_text`: streaming gives the same completion as not.
    pub fn complete(
        &self,
        agent: usize,
        messages: &[ChatMessage],
        opts: &CompletionOptions,
        on_text: &mut dyn FnMut(usize, &str) -> bool,
    ) -> anyhow::Result<Completions> {
        let member = self.present(agent).map_err(anyhow::Error::msg)?;
        let prompt = self.prompt_ids(agent, messages)?;
        let voice = &member.voice;
        let gen = GenerateOptions {
            max_new_tokens: opts.max_tokens,
            stop_tokens: voice.stop_tokens.clone(),
            pad_token: voice.pad_token,
        };
        let n = opts.n.max(1);
        let prompts = vec![prompt.clone(); n];
        let mut sampler = Sampler::new(opts.sampling, opts.seed);
        let mut rows: Vec<Streamed> = (0..n).map(|_| Streamed::default()).collect();
        let mut cancelled = false;
        let mut failure: Option<anyhow::Error> = None;
        let generations = model::generate_observed(
            &member.agent,
            &prompts,
            &mut sampler,
            &gen,
            &mut |row, token| {
                if cancelled || failure.is_some() {
                    return false;
                }
                let r = &mut rows[row];
                r.tokens.push(token);
                match r.advance(&voice.tokenizer, &opts.stop, false) {
                    Ok(delta) => {
                        if !delta.is_empty() && !on_text(row, &delta) {
                            cancelled = true;
                        }
                    }
                    Err(e) => failure = Some(e),
                }
                !cancelled && failure.is_none() && !r.stopped
            },
        )?;
        if let Some(e) = failure {
            return Err(e);
        }
        let mut choices = Vec::with_capacity(n);
        for (row, (r, g)) in rows.iter_mut().zip(&generations).enumerate() {
            // The rest of the text: what was held back for a stop string that never came.
            if !cancelled && !r.stopped {
                let delta = r.advance(&voice.tokenizer, &opts.stop, true)?;
                if !delta.is_empty() && !on_text(row, &delta) {
                    cancelled = true;
                }
            }
            let finish = if cancelled {
                Finish::Cancelled
            } else if r.stopped || g.stopped {
                Finish::Stop
            } else {
                Finish::Length
            };
            choices.push(Completion {
                text: std::mem::take(&mut r.sent),
                tokens: g.tokens.len(),
                finish,
            });
        }
        Ok(Completions {
            prompt_tokens: prompt.len(),
            choices,
        })
    }
}

/// One choice of a completion as it is streamed: its tokens and the text already sent.
#[derive(Default)]
struct Streamed {
    tokens: Vec<u32>,
    sent: String,
    /// A stop string appeared: the row is over, its text cut before it.
    stopped: bool,
}

impl Streamed {
    /// The text to send now. The tokens decode to `text`; a stop string in it ends the row
    /// there; otherwise the text that is sure to stay is sent: whole characters (no
    /// replacement character from a half-decoded one), and, unless `last`, nothing that could
    /// be the start of a stop string.
    fn advance(
        &mut self,
        tokenizer: &tokenizers::Tokenizer,
        stop: &[String],
        last: bool,
    ) -> anyhow::Result<String> {
        let text = tokenizer
            .decode(&self.tokens, true)
            .map_err(|e| anyhow::anyhow!("decoding a completion: {e}"))?;
        let mut end = text.len();
        if let Some(cut) = stop.iter().filter_map(|s| text.find(s.as_str())).min() {
            end = cut;
            self.stopped = true;
        } else if !last {
            if text.ends_with('\u{FFFD}') {
                end = text.trim_end_matches('\u{FFFD}').len();
            }
            // Hold back a tail that may grow into a stop string.
            let held = stop
                .iter()
                .flat_map(|s| {
                    (1..s.len())
                        .filter(|&k| s.is_char_boundary(k))
                        .filter(|&k| text[..end].ends_with(&s[..k]))
                })
                .max()
                .unwrap_or(0);
            end -= held;
        }
        let text = &text[..end];
        // Byte-level tokenizers decode a prefix to a prefix of the whole; if one does not,
        // hold the text until it does (the final call sends what is missing, if it can).
        match text.strip_prefix(self.sent.as_str()) {
            Some(delta) => {
                let delta = delta.to_string();
                self.sent.push_str(&delta);
                Ok(delta)
            }
            None => Ok(String::new()),
        }
    }
}

impl Team for ModelTeam {
    fn admit(&self, agent: u32, messages: &[ChatMessage]) -> Result<(), String> {
        ModelTeam::admit(self, agent, messages)
    }

    /// Every prompt rendered and tokenized over the pool (the verdicts in order).
    fn admit_all(&self, asks: &[(u32, &[ChatMessage])]) -> anyhow::Result<Vec<Result<(), String>>> {
        use rayon::prelude::*;
        Ok(asks
            .par_iter()
            .map(|&(a, m)| ModelTeam::admit(self, a, m))
            .collect())
    }

    fn respond(&mut self, turn: u32, requests: &[Request<'_>]) -> anyhow::Result<Vec<Response>> {
        let mut samplers = std::mem::take(&mut self.samplers);
        let out = self.respond_with(&mut samplers, self.usable(&self.prefixes), turn, requests);
        self.samplers = samplers;
        out
    }
}

/// A [`ModelTeam`] with random streams of its own ([`ModelTeam::seated`]).
pub struct Seated<'a> {
    team: &'a ModelTeam,
    samplers: Vec<Sampler>,
    /// This view's own prefix cache (see [`ModelTeam::seated`]).
    prefixes: Option<Mutex<PrefixCache>>,
}

impl Team for Seated<'_> {
    fn admit(&self, agent: u32, messages: &[ChatMessage]) -> Result<(), String> {
        self.team.admit(agent, messages)
    }

    fn respond(&mut self, turn: u32, requests: &[Request<'_>]) -> anyhow::Result<Vec<Response>> {
        let prefixes = self.team.usable(&self.prefixes);
        self.team
            .respond_with(&mut self.samplers, prefixes, turn, requests)
    }
}

/// A generation prefix cache of `bytes` (none for 0).
fn new_prefix_cache(bytes: usize) -> Option<Mutex<PrefixCache>> {
    (bytes > 0).then(|| Mutex::new(PrefixCache::new(bytes)))
}

/// Agent `agent`'s sampler in a team seeded with `seed`.
fn agent_sampler(params: SamplingParams, seed: u64, agent: usize) -> Sampler {
    Sampler::new(params, seed.wrapping_add(1 + agent as u64))
}

/// Tokens that end an assistant turn in common chat formats.
const END_OF_TURN: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|end|>",
    "<|endoftext|>",
    "</s>",
];

/// A loaded model as its frozen weights and its voice.
fn split(l: model::Loaded) -> anyhow::Result<(model::Base, Voice)> {
    let tokenizer = l
        .tokenizer
        .context("the model has no tokenizer (tokenizer.json or GGUF metadata)")?;
    let template = l.chat_template.context(
        "the model has no chat template (tokenizer_config.json `chat_template` or GGUF metadata)",
    )?;
    let mut stop_tokens = l.eos_token_ids;
    for t in END_OF_TURN {
        if let Some(id) = tokenizer.token_to_id(t) {
            if !stop_tokens.contains(&id) {
                stop_tokens.push(id);
            }
        }
    }
    if stop_tokens.is_empty() {
        bail!("the model names no end-of-sequence token, so generation could not stop");
    }
    let pad_token = tokenizer
        .get_padding()
        .map(|p| p.pad_id)
        .unwrap_or(stop_tokens[0]);
    Ok((
        l.base,
        Voice {
            tokenizer,
            template,
            stop_tokens,
            pad_token,
        },
    ))
}
