//! LLM agents as a debate team: each agent's prompts are rendered with its model's chat
//! template and generated in batches across tasks, with its own seeded sampler.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{bail, Context};
use candle_core::{DType, Device};

use super::{Response, Team, TokenIds};
use crate::model::{self, Agent, ChatTemplate, GenerateOptions, Sampler, SamplingParams};
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
    sampler: Sampler,
}

/// A team of LLM agents. Agents on the same model file share its frozen weights, and while
/// they have no adapters of their own their prompts are generated in one batch.
pub struct ModelTeam {
    members: Vec<Member>,
    /// Turns before this one are answered by the bare base models, adapters unused (the
    /// paper's frozen turn-1 policy with a "collaboration" adapter for later turns).
    adapters_from_turn: u32,
    max_new_tokens: usize,
    batch_size: usize,
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
}

impl ModelTeam {
    /// Loads one agent per entry of `model_paths` (each an HF folder or a GGUF file), agent
    /// i on `devices[i]`. Agents with the same model on the same device share its weights.
    pub fn load(
        model_paths: &[std::path::PathBuf],
        devices: &[Device],
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
        for (i, (path, device)) in model_paths.iter().zip(devices).enumerate() {
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
            members.push(Member {
                agent: Agent::new(base),
                voice,
                // Each agent samples from its own stream, the same on every run.
                sampler: Sampler::new(opts.sampling[i], opts.seed.wrapping_add(1 + i as u64)),
            });
        }
        Ok(ModelTeam {
            members,
            adapters_from_turn: 1,
            max_new_tokens: opts.max_new_tokens,
            batch_size: opts.batch_size.max(1),
        })
    }

    /// Agent `a`, e.g. to give it an adapter and a value head for training.
    pub fn agent_mut(&mut self, a: usize) -> &mut Agent {
        &mut self.members[a].agent
    }

    pub fn agent(&self, a: usize) -> &Agent {
        &self.members[a].agent
    }

    /// Answers turns before `turn` with the bare base models, ignoring the agents' adapters
    /// (1, the default: adapters speak on every turn).
    pub fn use_adapters_from_turn(&mut self, turn: u32) {
        self.adapters_from_turn = turn.max(1);
    }

    /// Each agent's sampler position, for a checkpoint.
    pub fn rng_states(&self) -> Vec<model::RngState> {
        self.members.iter().map(|m| m.sampler.state()).collect()
    }

    /// Puts every agent's sampler back where [`rng_states`](Self::rng_states) found it.
    pub fn restore_rng_states(&mut self, states: &[model::RngState]) -> anyhow::Result<()> {
        if states.len() != self.members.len() {
            bail!(
                "the checkpoint has sampler states for {} agents, the team has {}",
                states.len(),
                self.members.len()
            );
        }
        for (a, (m, s)) in self.members.iter_mut().zip(states).enumerate() {
            m.sampler
                .restore(s)
                .with_context(|| format!("agent {a}'s sampler"))?;
        }
        Ok(())
    }

    fn respond_as(
        &mut self,
        agent: usize,
        adapted: bool,
        conversations: &[&[ChatMessage]],
    ) -> anyhow::Result<Vec<Response>> {
        let prompts = conversations
            .iter()
            .map(|messages| self.prompt_ids(agent, messages))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let member = &mut self.members[agent];
        let bare;
        let speaker = if adapted {
            &member.agent
        } else {
            bare = Agent::new(member.agent.base.clone());
            &bare
        };
        let voice = member.voice.clone();
        let opts = GenerateOptions {
            max_new_tokens: self.max_new_tokens,
            stop_tokens: voice.stop_tokens.clone(),
            pad_token: voice.pad_token,
        };
        let mut out = Vec::with_capacity(prompts.len());
        for chunk in prompts.chunks(self.batch_size) {
            for (prompt, g) in
                chunk
                    .iter()
                    .zip(model::generate(speaker, chunk, &mut member.sampler, &opts)?)
            {
                let text = voice
                    .tokenizer
                    .decode(&g.tokens, true)
                    .map_err(|e| anyhow::anyhow!("decoding agent {agent}'s response: {e}"))?;
                out.push(Response {
                    text: text.trim().to_string(),
                    prompt_tokens: prompt.len(),
                    response_tokens: g.tokens.len(),
                    ids: TokenIds {
                        prompt: prompt.clone(),
                        response: g.tokens,
                    },
                });
            }
        }
        Ok(out)
    }
}

impl ModelTeam {
    /// The token ids of the prompt `agent`'s model reads for `messages`.
    fn prompt_ids(&self, agent: usize, messages: &[ChatMessage]) -> anyhow::Result<Vec<u32>> {
        let voice = &self.members[agent].voice;
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

impl Team for ModelTeam {
    fn admit(&self, agent: u32, messages: &[ChatMessage]) -> Result<(), String> {
        let a = agent as usize;
        let Some(member) = self.members.get(a) else {
            return Err(format!(
                "a prompt for agent {agent}, but the team has {} agents",
                self.members.len()
            ));
        };
        let tokens = self
            .prompt_ids(a, messages)
            .map_err(|e| format!("{e:#}"))?
            .len();
        let context = member.agent.base.config().max_position_embeddings;
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

    fn respond(
        &mut self,
        turn: u32,
        requests: &[(u32, &[ChatMessage])],
    ) -> anyhow::Result<Vec<Response>> {
        let adapted = turn >= self.adapters_from_turn;
        let bare = |m: &Member| !adapted || m.agent.lora.is_none();
        // Requests go to the member that generates for them: agents on the same base without
        // an adapter of their own are the same model, so their prompts form one batch.
        let generator: Vec<usize> = (0..self.members.len())
            .map(|a| {
                let m = &self.members[a];
                if !bare(m) {
                    return a;
                }
                (0..a)
                    .find(|&b| {
                        let o = &self.members[b];
                        bare(o) && Arc::ptr_eq(&o.agent.base, &m.agent.base)
                    })
                    .unwrap_or(a)
            })
            .collect();
        let mut by_agent: Vec<Vec<usize>> = vec![Vec::new(); self.members.len()];
        for (i, (agent, _)) in requests.iter().enumerate() {
            match generator.get(*agent as usize) {
                Some(&g) => by_agent[g].push(i),
                None => bail!(
                    "a request for agent {agent}, but the team has {} agents",
                    self.members.len()
                ),
            }
        }
        let mut out: Vec<Option<Response>> = vec![None; requests.len()];
        for (agent, indices) in by_agent.iter().enumerate() {
            if indices.is_empty() {
                continue;
            }
            let conversations: Vec<&[ChatMessage]> =
                indices.iter().map(|&i| requests[i].1).collect();
            for (&i, r) in indices
                .iter()
                .zip(self.respond_as(agent, adapted, &conversations)?)
            {
                out[i] = Some(r);
            }
        }
        Ok(out
            .into_iter()
            .map(|r| r.expect("every request answered"))
            .collect())
    }
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
