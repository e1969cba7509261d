//! A tiny agent model, made by the project for its task (`maporl warm-start`): a fresh
//! llama-architecture decoder with a byte-level BPE tokenizer learned from the task and the
//! ChatML chat format, every weight trained on debates of scripted agents ([`ScriptedTeam`]) run through the config's
//! own protocol, verifier and shaper. It learns the task and the debate format, imperfectly
//! (the teachers are right with probability `teacher_skill` and follow their peers at later
//! turns), so MAPoRL has something to improve. A 135M model takes about 12 minutes per PPO
//! step on 2 CPU cores; this one takes seconds, which is what lets the quickstart train.

use crate::model::Pass;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::checkpoint::replace_dir;
use crate::config::{Config, WarmStartConfig};
use crate::debate::{self, OnPluginError, Persuasion, Plugins, ScriptedTeam};
use crate::model::{self, score, Agent, Base, ChatTemplate};
use crate::optim::{learning_rate, AgentOptimizer};
use crate::transcript::Task;
use tokenizers::Tokenizer;

/// What a warm start did, written as `warm_start.json` next to the weights.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Summary {
    /// The settings it was made with; `maporl warm-start` redoes the model when they change.
    pub config: WarmStartConfig,
    pub difficulty: u32,
    pub seed: u64,
    /// sha256 of the questions kept out of its training (the run's own), one per line.
    pub excluded_sha256: String,
    pub parameters: usize,
    /// Utterances of the scripted debates it was trained on.
    pub utterances: usize,
    /// Mean negative log-likelihood per response token over the first and the last 5% of
    /// the steps.
    pub first_loss: f64,
    pub last_loss: f64,
    pub seconds: f64,
}

impl Summary {
    /// The summary of the model in `dir`, if it was made by a warm start.
    pub fn read(dir: &Path) -> Option<Summary> {
        let text = std::fs::read_to_string(dir.join("warm_start.json")).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Whether this model is what `config` would make, keeping `exclude` out.
    pub fn matches(&self, config: &Config, exclude: &[Task]) -> bool {
        config.warm_start.as_ref() == Some(&self.config)
            && self.difficulty == config.data.difficulty
            && self.seed == config.seed
            && self.excluded_sha256 == fingerprint(exclude)
    }
}

/// Makes the tiny model `config.warm_start` describes and writes it to `out` as an HF
/// folder (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
/// warm_start.json), replacing what was there only once it is complete. The teachers'
/// questions leave out every question of `exclude` (the run's own). `progress` gets each
/// step and its loss.
pub fn warm_start(
    config: &Config,
    plugins: &mut Plugins,
    exclude: &[Task],
    out: &Path,
    mut progress: impl FnMut(usize, f64),
) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let ws = config
        .warm_start
        .clone()
        .context("the config has no [warm_start] section: nothing says how to make the model")?;
    // The scripted teachers' debates, through the config's own plugins.
    let mut tasks = teacher_tasks(ws.tasks + ws.drills, config, exclude);
    let drills = tasks.split_off(ws.tasks.min(tasks.len()));
    let agents = config.debate.agents;
    let (to_right, to_wrong) = ws.adopt_rates();
    let mut team = ScriptedTeam::new(
        &tasks,
        vec![ws.teacher_skill; agents as usize],
        Persuasion { to_right, to_wrong },
        config.seed,
    );
    let mut debates = Vec::with_capacity(tasks.len());
    for chunk in tasks.chunks(64) {
        let rollout = debate::run(
            plugins,
            &mut team,
            chunk,
            agents,
            config.debate.turns,
            OnPluginError::Stop,
        )?;
        debates.extend(rollout.debates);
    }
    // The conversations as the agents will see them, then a tokenizer learned from them.
    let template = ChatTemplate::new(CHATML, "", END)?;
    let mut texts: Vec<(u32, String, String)> = Vec::new();
    for d in &debates {
        for (u, s) in d.transcript.utterances.iter().zip(&d.speeches) {
            let messages: Vec<model::ChatMessage> = s
                .messages
                .iter()
                .map(|m| model::ChatMessage::new(m.role.name(), &m.content))
                .collect();
            let prompt = template.render(&messages, true)?;
            texts.push((u.turn, prompt, u.text.trim().to_string()));
        }
    }
    let tokenizer = learn_tokenizer(
        ws.vocab_size,
        texts.iter().flat_map(|(_, p, r)| [p.as_str(), r.as_str()]),
    )?;
    let eos = tokenizer
        .token_to_id(END)
        .context("the learned tokenizer lacks its end-of-turn token")?;
    let encode = |text: &str| -> anyhow::Result<Vec<u32>> {
        Ok(tokenizer
            .encode(text, false)
            .map_err(|e| anyhow::anyhow!("warm_start: tokenizing: {e}"))?
            .get_ids()
            .to_vec())
    };
    // (prompt, response) token ids per utterance, grouped by turn so a batch pads little.
    let mut by_turn: HashMap<u32, Vec<Pair>> = HashMap::new();
    for (turn, prompt, response) in &texts {
        let mut response = encode(response)?;
        response.push(eos);
        by_turn
            .entry(*turn)
            .or_default()
            .push((encode(prompt)?, response));
    }
    let utterances = texts.len();
    // Drills: the question alone, then the right answer with its working.
    let drills = drills
        .iter()
        .map(|t| {
            let answer: i64 = t
                .reference
                .parse()
                .context("arithmetic answers are integers")?;
            let mut response = encode(&debate::worked_answer(&t.question, answer))?;
            response.push(eos);
            Ok((encode(&format!("{}\n", t.question))?, response))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;

    let vocab = tokenizer.get_vocab_size(true);
    let hf_config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": ws.hidden_size,
        "intermediate_size": ws.intermediate_size,
        "num_hidden_layers": ws.layers,
        "num_attention_heads": ws.heads,
        "num_key_value_heads": ws.heads,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": true,
        "hidden_act": "silu",
        "eos_token_id": eos,
        "torch_dtype": "float32",
    });
    let cfg = model::Config::from_hf_json(&hf_config.to_string())?;
    let weights = initial_weights(&ws, vocab, config.seed)?;
    let parameters = weights.values().map(Tensor::elem_count).sum();
    let base = Base::new(
        &cfg,
        VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu),
    )?;
    let mut agent = Agent::new(Arc::new(base));
    agent.train_all_weights()?;

    let losses = train(&ws, &agent, drills, by_turn, config.seed, &mut progress)?;
    let window = (losses.len() / 20).max(1);
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len().max(1) as f64;
    let summary = Summary {
        config: ws,
        difficulty: config.data.difficulty,
        seed: config.seed,
        excluded_sha256: fingerprint(exclude),
        parameters,
        utterances,
        first_loss: mean(&losses[..window.min(losses.len())]),
        last_loss: mean(&losses[losses.len().saturating_sub(window)..]),
        seconds: started.elapsed().as_secs_f64(),
    };
    replace_dir(out, |dir| {
        std::fs::write(
            dir.join("config.json"),
            serde_json::to_string_pretty(&hf_config)?,
        )?;
        tokenizer
            .save(dir.join("tokenizer.json"), false)
            .map_err(|e| anyhow::anyhow!("writing tokenizer.json: {e}"))?;
        std::fs::write(
            dir.join("tokenizer_config.json"),
            serde_json::to_string_pretty(&serde_json::json!({
                "chat_template": CHATML,
                "eos_token": END,
            }))?,
        )?;
        agent.save_weights(&dir.join("model.safetensors"))?;
        std::fs::write(
            dir.join("warm_start.json"),
            serde_json::to_string_pretty(&summary)?,
        )?;
        Ok(())
    })
    .with_context(|| format!("writing the model to {}", out.display()))?;
    Ok(summary)
}

fn fingerprint(tasks: &[Task]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for t in tasks {
        h.update(t.question.as_bytes());
        h.update(b"\n");
    }
    format!("{:x}", h.finalize())
}

/// A (prompt, response) pair of token ids.
type Pair = (Vec<u32>, Vec<u32>);

/// ChatML, the chat format of Qwen2 and SmolLM2, without a default system prompt.
const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
const START: &str = "<|im_start|>";
const END: &str = "<|im_end|>";

/// A byte-level BPE tokenizer with `vocab_size` tokens learned from `texts`, digits always
/// single tokens (so numbers are read digit by digit), and ChatML's two special tokens.
fn learn_tokenizer<'a>(
    vocab_size: usize,
    texts: impl Iterator<Item = &'a str> + Send,
) -> anyhow::Result<Tokenizer> {
    use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
    use tokenizers::models::TrainerWrapper;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::digits::Digits;
    use tokenizers::pre_tokenizers::sequence::Sequence;
    use tokenizers::{
        AddedToken, DecoderWrapper, ModelWrapper, NormalizerWrapper, PostProcessorWrapper,
        PreTokenizerWrapper, TokenizerBuilder,
    };
    let specials = vec![AddedToken::from(START, true), AddedToken::from(END, true)];
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab_size)
        .min_frequency(0)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(specials)
        .build()
        .into();
    let mut tokenizer = TokenizerBuilder::<
        ModelWrapper,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >::new()
    .with_model(BPE::default().into())
    .with_normalizer(None)
    .with_pre_tokenizer(Some(
        Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])
        .into(),
    ))
    .with_post_processor(None)
    .with_decoder(Some(DecoderWrapper::from(ByteLevel::default())))
    .build()
    .map_err(|e| anyhow::anyhow!("warm_start: building the tokenizer: {e}"))?;
    tokenizer
        .train(&mut trainer, texts)
        .map_err(|e| anyhow::anyhow!("warm_start: learning the tokenizer: {e}"))?;
    Ok(Tokenizer::from(tokenizer))
}

/// `count` distinct arithmetic questions at the run's difficulty, none of them in `exclude`
/// (fewer when the question space runs out).
fn teacher_tasks(count: usize, config: &Config, exclude: &[Task]) -> Vec<Task> {
    let excluded: HashSet<&str> = exclude.iter().map(|t| t.question.as_str()).collect();
    let families = families(config);
    let k = families.len();
    // Each family's share, then the families interleaved so that tasks and drills (the
    // front and the back of the list) both hold every family.
    let shares: Vec<Vec<Task>> = families
        .iter()
        .enumerate()
        .map(|(i, &family)| {
            let share = count / k + usize::from(i < count % k);
            // A stream of its own, so the teachers' questions are not the run's questions
            // reordered (the first family's is the one a single family has).
            let stream = (config.seed ^ 0x7761_726d).wrapping_add((i as u64) << 40);
            family_tasks(share, family, stream, &excluded)
        })
        .collect();
    let longest = shares.iter().map(Vec::len).max().unwrap_or(0);
    let mut iters: Vec<_> = shares.into_iter().map(Vec::into_iter).collect();
    (0..longest)
        .flat_map(|_| {
            iters
                .iter_mut()
                .filter_map(Iterator::next)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `count` distinct questions of one family from `stream` on, none of them `excluded`.
fn family_tasks(
    count: usize,
    difficulty: u32,
    mut stream: u64,
    excluded: &HashSet<&str>,
) -> Vec<Task> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(count);
    let mut barren = 0;
    // Until enough, or 8 batches in a row bring nothing new (the question space is used up).
    while out.len() < count && barren < 8 {
        let before = out.len();
        // An enumerated family holds every question once: a batch is at most all of them.
        let batch = crate::data::distinct_questions(difficulty).map_or(count, |n| count.min(n));
        let drawn = crate::data::arithmetic(batch, difficulty, stream)
            .expect("a batch within the family's size");
        for t in drawn {
            if out.len() < count
                && !excluded.contains(t.question.as_str())
                && seen.insert(t.question.clone())
            {
                out.push(t);
            }
        }
        stream = stream.wrapping_add(1);
        barren = if out.len() == before { barren + 1 } else { 0 };
    }
    out
}

/// The questions a warm start keeps out of its teachers' debates and drills: the run's own
/// (what `data` selects), in every family of `warm_start.families`, so that a model made on
/// two families has seen neither family's evaluation questions.
pub fn excluded(config: &Config) -> anyhow::Result<Vec<Task>> {
    let mut out = crate::session::tasks(config)?;
    for f in families(config) {
        if f != config.data.difficulty {
            let mut other = config.clone();
            other.data.difficulty = f;
            out.extend(crate::session::tasks(&other)?);
        }
    }
    Ok(out)
}

/// The arithmetic difficulties the teachers draw from: `warm_start.families`, or
/// `data.difficulty` alone.
fn families(config: &Config) -> Vec<u32> {
    match config.warm_start.as_ref().map(|w| w.families.as_slice()) {
        Some(f) if !f.is_empty() => f.to_vec(),
        _ => vec![config.data.difficulty],
    }
}

/// HF-style initial weights: every matrix uniform with standard deviation 0.02, norms at 1.
fn initial_weights(
    ws: &WarmStartConfig,
    vocab: usize,
    seed: u64,
) -> anyhow::Result<HashMap<String, Tensor>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x1417);
    let bound = 0.02 * 3f32.sqrt();
    let mut matrix = |rows: usize, cols: usize| -> anyhow::Result<Tensor> {
        let v: Vec<f32> = (0..rows * cols)
            .map(|_| rng.random_range(-bound..bound))
            .collect();
        Ok(Tensor::from_vec(v, (rows, cols), &Device::Cpu)?)
    };
    let ones = |n: usize| Tensor::ones(n, DType::F32, &Device::Cpu);
    let (h, i) = (ws.hidden_size, ws.intermediate_size);
    let mut w = HashMap::new();
    w.insert("model.embed_tokens.weight".to_string(), matrix(vocab, h)?);
    for l in 0..ws.layers {
        let p = format!("model.layers.{l}");
        for (name, rows, cols) in [
            ("self_attn.q_proj", h, h),
            ("self_attn.k_proj", h, h),
            ("self_attn.v_proj", h, h),
            ("self_attn.o_proj", h, h),
            ("mlp.gate_proj", i, h),
            ("mlp.up_proj", i, h),
            ("mlp.down_proj", h, i),
        ] {
            w.insert(format!("{p}.{name}.weight"), matrix(rows, cols)?);
        }
        w.insert(format!("{p}.input_layernorm.weight"), ones(h)?);
        w.insert(format!("{p}.post_attention_layernorm.weight"), ones(h)?);
    }
    w.insert("model.norm.weight".to_string(), ones(h)?);
    Ok(w)
}

/// Cross-entropy on the response tokens, every weight trained; returns each step's loss.
/// Two steps in three are drills (short, so many to a batch: where the arithmetic is
/// learned); the third is a batch of debate utterances of one turn, the turns in cycle. A
/// batch holds about `batch_tokens` tokens.
fn train(
    ws: &WarmStartConfig,
    agent: &Agent,
    drills: Vec<Pair>,
    by_turn: HashMap<u32, Vec<Pair>>,
    seed: u64,
    progress: &mut impl FnMut(usize, f64),
) -> anyhow::Result<Vec<f64>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5f7);
    let mut turns: Vec<_> = by_turn.into_iter().filter(|(_, p)| !p.is_empty()).collect();
    turns.sort_by_key(|(t, _)| *t);
    if turns.is_empty() {
        bail!("warm_start: the scripted debates produced no utterances");
    }
    let pool = |pairs| Pool {
        pairs,
        order: Vec::new(),
    };
    let mut drills = (!drills.is_empty()).then(|| pool(drills));
    let mut turns: Vec<Pool> = turns.into_iter().map(|(_, pairs)| pool(pairs)).collect();
    let mut optimizer = AgentOptimizer::new(agent.named_trainable_vars(), ws.lr, 0.01)?;
    let warmup = ws.steps / 20;
    let mut losses = Vec::with_capacity(ws.steps);
    for step in 0..ws.steps {
        let batch = match &mut drills {
            Some(d) if step % 3 != 2 => d.next_batch(ws.batch_tokens, &mut rng),
            _ => {
                let k = (step / 3) % turns.len();
                turns[k].next_batch(ws.batch_tokens, &mut rng)
            }
        };
        optimizer.set_lr(learning_rate(step, ws.steps, warmup, ws.lr, 0.1));
        let scored = score(agent, &batch, Pass::Training, 64)?;
        let n = scored.mask.sum_all()?.to_scalar::<f32>()?;
        let loss = ((&scored.logprobs * &scored.mask)?.sum_all()?.neg()? / f64::from(n))?;
        optimizer.minimize(&loss, 1.0)?;
        let value = f64::from(loss.to_scalar::<f32>()?);
        if !value.is_finite() {
            bail!("warm_start: the loss is {value} at step {step}; lower warm_start.lr");
        }
        losses.push(value);
        progress(step, value);
    }
    Ok(losses)
}

/// One turn's utterances, drawn in a fresh shuffled order each pass.
struct Pool {
    pairs: Vec<Pair>,
    order: Vec<usize>,
}

impl Pool {
    /// Utterances until the batch (padded to its longest) holds about `budget` tokens; at
    /// least one.
    fn next_batch(&mut self, budget: usize, rng: &mut ChaCha8Rng) -> Vec<Pair> {
        let mut batch: Vec<Pair> = Vec::new();
        let mut longest = 0;
        loop {
            if self.order.is_empty() {
                self.order = (0..self.pairs.len()).collect();
                self.order.shuffle(rng);
            }
            let next = &self.pairs[*self.order.last().expect("refilled")];
            let len = next.0.len() + next.1.len();
            if !batch.is_empty() && longest.max(len) * (batch.len() + 1) > budget {
                return batch;
            }
            longest = longest.max(len);
            batch.push(next.clone());
            self.order.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Teachers on two families draw half their questions from each, interleaved (so tasks
    /// and drills both hold both), and none of the run's questions in either family; one
    /// family is what it always was.
    #[test]
    fn teacher_questions_cover_every_family_and_none_of_the_runs() {
        let mut config = Config::parse(
            "[data]\ncount = 300\nheld_out = 100\n[warm_start]\nfamilies = [1, 4]\n",
            &[],
        )
        .unwrap();
        let exclude = excluded(&config).unwrap();
        assert_eq!(exclude.len(), 600, "the run's 300 questions in each family");
        let tasks = teacher_tasks(2001, &config, &exclude);
        assert_eq!(tasks.len(), 2001);
        let subtraction = |t: &Task| t.question.contains(" - ");
        assert_eq!(tasks.iter().filter(|t| subtraction(t)).count(), 1000);
        for (i, t) in tasks.iter().enumerate() {
            assert_eq!(
                subtraction(t),
                i % 2 == 1,
                "interleaved: {i} {}",
                t.question
            );
        }
        let run: HashSet<&str> = exclude.iter().map(|t| t.question.as_str()).collect();
        assert!(run.iter().any(|q| q.contains(" - ")) && run.iter().any(|q| q.contains(" + ")));
        assert!(tasks.iter().all(|t| !run.contains(t.question.as_str())));
        // One family: the questions a single-family config always had.
        let single = {
            config.warm_start.as_mut().unwrap().families.clear();
            teacher_tasks(500, &config, &crate::session::tasks(&config).unwrap())
        };
        assert!(single.iter().all(|t| t.question.contains(" + ")));
        assert_eq!(
            single[..],
            {
                config.warm_start.as_mut().unwrap().families = vec![1];
                teacher_tasks(500, &config, &excluded(&config).unwrap())
            }[..]
        );
    }

    #[test]
    fn the_learned_tokenizer_reads_digits_one_by_one_and_round_trips() {
        let texts = [
            "<|im_start|>user\nQuestion: What is 71 + 47?<|im_end|>\n<|im_start|>assistant\n",
            "71 + 47: 1 + 7 = 8, 7 + 4 = 11, so 118.\nAnswer: \\boxed{118}",
        ];
        let tok = learn_tokenizer(300, texts.iter().copied()).unwrap();
        let enc = tok.encode("so 1189.", false).unwrap();
        let pieces: Vec<&str> = enc.get_tokens().iter().map(String::as_str).collect();
        for d in ["1", "1", "8", "9"] {
            assert!(pieces.contains(&d), "{pieces:?}");
        }
        assert_eq!(
            pieces
                .iter()
                .filter(|p| p.chars().any(|c| c.is_ascii_digit()))
                .count(),
            4,
            "every digit its own token: {pieces:?}"
        );
        // Text it never saw (bytes outside the corpus) still round-trips.
        let other = "Zebra ü 42 {x}";
        let ids = tok.encode(other, false).unwrap().get_ids().to_vec();
        assert_eq!(tok.decode(&ids, false).unwrap(), other);
        // The chat format's markers are single special tokens.
        let ids = tok.encode(texts[0], false).unwrap().get_ids().to_vec();
        let start = tok.token_to_id(START).unwrap();
        let end = tok.token_to_id(END).unwrap();
        assert_eq!(ids.iter().filter(|&&i| i == start).count(), 2);
        assert_eq!(ids.iter().filter(|&&i| i == end).count(), 1);
        assert!(tok.get_vocab_size(true) <= 300 + 2);
    }

    #[test]
    fn teachers_never_see_the_runs_questions() {
        let config = Config {
            warm_start: Some(WarmStartConfig::default()),
            ..Config::default()
        };
        let run = crate::data::arithmetic(300, 1, 0).unwrap();
        let teach = teacher_tasks(500, &config, &run);
        assert_eq!(teach.len(), 500);
        let run_q: HashSet<&str> = run.iter().map(|t| t.question.as_str()).collect();
        assert!(teach.iter().all(|t| !run_q.contains(t.question.as_str())));
        let distinct: HashSet<&str> = teach.iter().map(|t| t.question.as_str()).collect();
        assert_eq!(distinct.len(), 500, "no question twice");
        assert_eq!(teach, teacher_tasks(500, &config, &run), "seeded");
    }

    #[test]
    fn a_batch_fills_its_token_budget_and_passes_cover_every_utterance() {
        let pairs: Vec<Pair> = (0..10).map(|i| (vec![i; 8], vec![i; 2])).collect();
        let mut pool = Pool {
            pairs,
            order: Vec::new(),
        };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut drawn = Vec::new();
        for _ in 0..4 {
            let b = pool.next_batch(35, &mut rng);
            assert_eq!(b.len(), 3, "3 x 10 tokens fit in 35, 4 do not");
            drawn.extend(b.iter().map(|(p, _)| p[0]));
        }
        // The first pass draws each utterance once, then a new pass begins.
        let mut first: Vec<u32> = drawn[..10].to_vec();
        first.sort();
        assert_eq!(first, (0..10).collect::<Vec<u32>>());
        assert_ne!(drawn[..10], (0..10).collect::<Vec<u32>>()[..], "shuffled");
        let mut lone = Pool {
            pairs: vec![(vec![1; 100], vec![1; 5])],
            order: Vec::new(),
        };
        assert_eq!(lone.next_batch(10, &mut rng).len(), 1, "at least one");
    }
}
