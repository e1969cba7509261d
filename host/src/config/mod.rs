//! The run config: TOML with every default filled in, unknown keys refused with the line and
//! the key, `--set key=value` overrides, and the resolved form saved into the run directory.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::data::FieldMap;
pub use crate::debate::OnPluginError;
use crate::files::expand_home;
use crate::plugin::Limits;

mod grpo;
mod ppo;
mod verifier;
pub use grpo::{Algorithm, GrpoConfig};
pub use ppo::{KlEstimator, PpoConfig};
pub use verifier::{AnswerTurns, VerifierConfig, VerifierGenerateConfig, VerifierTrainConfig};

/// A whole run: data, team, debate, plugins.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Seeds the data order, sampling and the plugins' sandboxes.
    pub seed: u64,
    /// Where the run writes its outputs; `runs/<config name>` when empty.
    pub run_dir: String,
    /// Where the agents' tensors live: "cpu", "cuda" (the first GPU), "cuda:N", or "auto"
    /// (the first GPU when this maporl has CUDA and one is present, else the CPU).
    /// `[[agents]]` and `[verifier]` may each name their own.
    pub device: DeviceChoice,
    pub data: DataConfig,
    pub model: ModelConfig,
    /// Per-agent overrides; agents without an entry use `model` and `device`.
    pub agents: Vec<AgentConfig>,
    pub debate: DebateConfig,
    pub generation: GenerationConfig,
    pub plugins: PluginsConfig,
    pub train: TrainConfig,
    /// The learned verifier served through `judge`, and how to make one.
    pub verifier: VerifierConfig,
    /// `maporl warm-start`: how the tiny model at `model.path` is made (none: the model
    /// exists already).
    pub warm_start: Option<WarmStartConfig>,
    /// One run over several processes (`mpirun -np N maporl train`, `eval`, `verifier
    /// train`); none: one process.
    pub distributed: Option<DistributedConfig>,
}

/// `[distributed]`: how a run started under `mpirun -np N` splits its work.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DistributedConfig {
    pub placement: Placement,
}

/// Where the work of a run on several ranks goes.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// Every rank holds the whole team; each step's debates are split between the ranks,
    /// and every update is the one a single process would make on the whole batch. Each
    /// response draws from a random stream of its own (seeded by seed, step, task, agent,
    /// turn), so the debates do not depend on how many ranks share them.
    #[default]
    Data,
    /// Rank r holds agent r's model only (with fewer ranks than agents, agent a is on rank
    /// a mod N): a team whose models do not fit on one device, such as one model per GPU.
    /// Each turn every rank generates its agents' responses for the whole batch; the texts
    /// are all-gathered and every rank runs the plugins on the same debates (checked: the
    /// ranks compare each step's plans, verdicts and rewards); each rank updates its own
    /// agents.
    Agents,
}

/// A tiny decoder the project trains from scratch on the config's task before MAPoRL
/// (`maporl warm-start`): the llama architecture at the given size, a tokenizer learned from
/// the task and the ChatML chat format, every weight trained on debates of scripted agents
/// over the config's protocol. Written to `model.path`; nothing is downloaded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct WarmStartConfig {
    /// Tokens of the byte-level BPE tokenizer learned from the scripted debates (256 bytes,
    /// then merges; digits stay single tokens).
    pub vocab_size: usize,
    /// Width of the decoder made from scratch.
    pub hidden_size: usize,
    /// Width of its MLP.
    pub intermediate_size: usize,
    /// Its decoder layers.
    pub layers: usize,
    /// Its attention heads (`hidden_size` must split into heads of an even size).
    pub heads: usize,
    /// Arithmetic questions the scripted teachers debate, and more that are drilled alone
    /// (the question, then the right answer with its working; no chat format, so short); the
    /// run's own questions (training and held-out) are in neither.
    pub tasks: usize,
    /// Arithmetic questions drilled alone (see `tasks`).
    pub drills: usize,
    /// The teachers' chance of a right turn-1 answer.
    pub teacher_skill: f64,
    /// The teachers' chance of adopting their peers' majority answer at later turns when it differs from their own (see `teacher_adopt_right`).
    pub teacher_persuadability: f64,
    /// The chance of adopting the majority when it is right (and `teacher_adopt_wrong`, when
    /// it is wrong), in place of `teacher_persuadability` (each defaults to it). Teachers that adopt a right peer
    /// more often than a wrong one switch on something a model can learn to check: the
    /// peer's working is always right, its slip is in the final answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub teacher_adopt_right: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// The chance of adopting a wrong majority (see `teacher_adopt_right`).
    pub teacher_adopt_wrong: Option<f64>,
    /// The arithmetic difficulties (task families) the teachers' questions and drills come
    /// from, in equal shares; empty: `data.difficulty` alone. A model made on two families
    /// can be trained on one and evaluated on the other (RESULTS.md's cross-domain test).
    /// The run's questions are kept out of every family, as `data` would select them there.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub families: Vec<u32>,
    /// Optimizer steps on about `batch_tokens` tokens each: two in three on drills, the third
    /// on debate utterances of one turn (the turns in cycle); AdamW at `lr` with linear
    /// warmup over the first 5% and linear decay to 0.1x.
    pub steps: usize,
    /// Tokens per optimizer step (see `steps`).
    pub batch_tokens: usize,
    /// AdamW's peak learning rate (see `steps`).
    pub lr: f64,
}

impl Default for WarmStartConfig {
    fn default() -> Self {
        WarmStartConfig {
            // The quickstart's: on 2 CPU cores about 6 minutes for 2-digit addition. A
            // 4-layer, 128-wide model learned it far more slowly per second (BENCHMARKS.md).
            vocab_size: 1024,
            hidden_size: 64,
            intermediate_size: 256,
            layers: 3,
            heads: 4,
            tasks: 2000,
            drills: 6000,
            teacher_skill: 0.8,
            teacher_persuadability: 0.6,
            teacher_adopt_right: None,
            teacher_adopt_wrong: None,
            families: Vec::new(),
            steps: 1500,
            batch_tokens: 4096,
            lr: 5e-3,
        }
    }
}

/// `maporl train`: who learns, for how long, with what adapter and PPO settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// "maporl": every agent learns, jointly; "single": only agent 0 learns, the others stay
    /// frozen (the paper's single-agent baseline); "off-the-shelf": no training, the debates
    /// are only evaluated; "sft": fine-tune every agent on the best off-the-shelf debates
    /// (the paper's SFT baseline, see `train.sft`).
    pub mode: TrainMode,
    /// Training steps (rollout + update).
    pub steps: usize,
    /// LoRA rank.
    pub lora_r: usize,
    /// LoRA scaling: the adapter adds `lora_alpha / lora_r` × B·A.
    pub lora_alpha: f64,
    /// The PEFT module names that get an adapter.
    pub lora_targets: Vec<String>,
    /// The KL coefficient (λ_KL); with `kl_target` it adapts towards that KL over
    /// `kl_horizon`.
    pub kl_coef: f64,
    /// The KL the adaptive controller steers towards (none: `kl_coef` is fixed).
    pub kl_target: Option<f64>,
    /// Steps (in samples) over which the adaptive KL controller moves `kl_coef`.
    pub kl_horizon: f64,
    /// Steps of linear learning-rate warmup, then linear decay to `final_lr_fraction` × lr.
    pub warmup_steps: usize,
    /// The learning rate at the last step, as a fraction of the peak.
    pub final_lr_fraction: f64,
    /// A checkpoint every this many steps (0: only at the end and on Ctrl-C).
    pub checkpoint_every: usize,
    /// How many of the newest checkpoints are kept (0: all).
    pub keep_checkpoints: usize,
    /// Train every weight of each learner's model instead of a LoRA adapter. Each learner
    /// then holds its own copy of its base; the shared original stays the KL reference.
    pub full_finetune: bool,
    /// "shared": one value head per agent; "per-turn": one per debate turn (paper's code).
    pub value_heads: ValueHeads,
    /// The first turn at which the trained adapter speaks. 1: every turn. 2: the paper's
    /// code: turn 1 is answered by the frozen base and one "collaboration" adapter is
    /// trained for turns >= 2 (turn-1 utterances are then not trained on).
    pub adapter_from_turn: u32,
    /// "joint": every step trains on all turns' utterances. "turn-based" (paper's code):
    /// only turn 2 for `turn2_steps` steps, then one turn per step: T, T-1, ..., 2, T, ...
    pub schedule: Schedule,
    /// With `schedule = "turn-based"`: steps that train turn 2 alone before the cycle starts.
    pub turn2_steps: usize,
    /// The SFT baseline (mode "sft").
    pub sft: SftConfig,
    /// "ppo" (the paper's) or "grpo" (critic-free, groups of debates of one question; see
    /// `train.grpo`).
    pub algorithm: Algorithm,
    pub ppo: PpoConfig,
    pub grpo: GrpoConfig,
}

/// The paper's SFT baseline: off-the-shelf debates over the data, the best `top_fraction`
/// of them by total shaped reward kept, and every agent fine-tuned (LoRA, cross-entropy on
/// its own responses) on its utterances in those debates.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SftConfig {
    /// Fraction of debates kept (the paper: the top 10%).
    pub top_fraction: f64,
    /// Passes over the kept debates' utterances.
    pub epochs: usize,
    /// Responses per optimizer step.
    pub batch_size: usize,
    /// AdamW's learning rate.
    pub lr: f64,
    /// Dropout on the LoRA layers' inputs while fine-tuning (PEFT's `lora_dropout`; the
    /// paper's 0.05). PPO runs without dropout, as TRL's PPOTrainer (the paper's code) turns
    /// it off. The masks come from a stream per agent, so under several ranks a minibatch
    /// split between them draws other masks than one process would.
    pub lora_dropout: f64,
    /// Activation checkpointing, as `train.ppo.activation_checkpointing`: each batch's
    /// forward keeps only every layer's input and its backward runs the layers again (the
    /// same dropout masks), for long responses.
    pub activation_checkpointing: bool,
}

impl Default for SftConfig {
    fn default() -> Self {
        SftConfig {
            top_fraction: 0.1,
            epochs: 2,
            batch_size: 8,
            lr: 1e-4,
            lora_dropout: 0.0,
            activation_checkpointing: false,
        }
    }
}

/// LoRA on every attention and MLP projection (arXiv 2502.18439): the default for the agents and
/// the learned verifier.
pub(crate) fn all_projections() -> Vec<String> {
    [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ]
    .map(String::from)
    .to_vec()
}

impl Default for TrainConfig {
    fn default() -> Self {
        // the paper (arXiv 2502.18439): LoRA r8 alpha16 on q,k,v,o,gate,up,down; lambda_KL 0.002.
        TrainConfig {
            mode: TrainMode::Maporl,
            steps: 10,
            lora_r: 8,
            lora_alpha: 16.0,
            lora_targets: all_projections(),
            kl_coef: 0.002,
            kl_target: None,
            kl_horizon: 10_000.0,
            warmup_steps: 0,
            final_lr_fraction: 0.1,
            checkpoint_every: 10,
            keep_checkpoints: 3,
            full_finetune: false,
            value_heads: ValueHeads::Shared,
            adapter_from_turn: 1,
            schedule: Schedule::Joint,
            turn2_steps: 0,
            sft: SftConfig::default(),
            algorithm: Algorithm::Ppo,
            ppo: PpoConfig::default(),
            grpo: GrpoConfig::default(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// "arithmetic" (generated, the embedded default), "gsm8k", "anli" or "jsonl".
    pub source: DataSource,
    /// The JSONL file (gsm8k, anli, jsonl).
    pub path: String,
    /// Arithmetic difficulty: 1 a + b, 2 a × b + c, 3 (a + b) × c − d, 4 a − b (a second
    /// task family, for the cross-domain test); and three families small enough to draw
    /// without replacement, so that the held-out and training questions never share one:
    /// 5 a + b with a in 10-99 and b in 1-9 (810 questions), 6 a + b with both in 2-20
    /// (361), 7 a + b + c of digits 1-9 (729).
    pub difficulty: u32,
    /// Seeds the arithmetic questions (none: the run's `seed`), so runs with different
    /// seeds can share one question set.
    pub seed: Option<u64>,
    /// How many tasks to use (0: all; arithmetic: how many to generate).
    pub count: usize,
    /// Tasks to skip first.
    pub offset: usize,
    /// The first `held_out` selected tasks are the evaluation set: `maporl eval` debates only
    /// them, `maporl train` trains on the rest and evaluates them before and after training.
    /// 0: no held-out set (eval and train use every selected task).
    pub held_out: usize,
    /// For "jsonl": the task kind plugins see, and which field holds what.
    pub kind: String,
    pub fields: Option<FieldMap>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// An HF folder (config.json, *.safetensors, tokenizer.json, tokenizer_config.json) or a
    /// GGUF file; a leading `~/` is the home directory.
    pub path: String,
    /// "f32", "bf16" or "f16".
    pub dtype: Precision,
}

impl ModelConfig {
    /// The candle dtype of `dtype`.
    pub fn candle_dtype(&self) -> candle_core::DType {
        match self.dtype {
            Precision::F32 => candle_core::DType::F32,
            Precision::Bf16 => candle_core::DType::BF16,
            Precision::F16 => candle_core::DType::F16,
        }
    }
}

/// A device as a config names it (`device`, `agents[i].device`, `verifier.device`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(try_from = "String", into = "String")]
pub enum DeviceChoice {
    /// The first CUDA device when this maporl has CUDA and one is present, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// CUDA device N ("cuda" is "cuda:0").
    Cuda(usize),
}

impl TryFrom<String> for DeviceChoice {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or_else(|| {
                    format!("unknown device `{other}`, expected `cpu`, `cuda`, `cuda:N` or `auto`")
                }),
        }
    }
}

impl From<DeviceChoice> for String {
    fn from(d: DeviceChoice) -> String {
        d.to_string()
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceChoice::Auto => f.write_str("auto"),
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl DeviceChoice {
    /// The device this names, on this machine and build: "auto" picks, a CUDA device that
    /// this build cannot use is an error saying why.
    pub fn open(self) -> anyhow::Result<candle_core::Device> {
        match self {
            DeviceChoice::Cpu => Ok(candle_core::Device::Cpu),
            DeviceChoice::Auto
                if cfg!(feature = "cuda") && candle_core::utils::cuda_is_available() =>
            {
                Ok(candle_core::Device::new_cuda(0)?)
            }
            DeviceChoice::Auto => Ok(candle_core::Device::Cpu),
            DeviceChoice::Cuda(n) if cfg!(feature = "cuda") => {
                candle_core::Device::new_cuda(n).with_context(|| format!("device = \"cuda:{n}\""))
            }
            DeviceChoice::Cuda(n) => bail!(
                "device = \"cuda:{n}\": this maporl was built without CUDA (build it with \
                 `--features cuda`), or use device = \"cpu\""
            ),
        }
    }
}

/// Who learns in a training run (`train.mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TrainMode {
    /// Every agent learns, jointly.
    Maporl,
    /// Only agent 0 learns; the others stay frozen (the paper's single-agent baseline).
    Single,
    /// No training: the debates are only evaluated.
    OffTheShelf,
    /// Every agent is fine-tuned on the best off-the-shelf debates (`train.sft`).
    Sft,
}

/// The value heads of a learning agent (`train.value_heads`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ValueHeads {
    /// One per agent.
    Shared,
    /// One per debate turn (the paper's code).
    PerTurn,
}

/// Which turns a training step learns from (`train.schedule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Schedule {
    /// Every turn, every step.
    Joint,
    /// Turn 2 for `turn2_steps` steps, then one turn per step: T, T-1, ..., 2, T, ...
    TurnBased,
}

/// Where the tasks come from (`data.source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DataSource {
    /// Generated arithmetic questions (the embedded default).
    Arithmetic,
    Gsm8k,
    Anli,
    /// Any JSONL file, with `data.fields` naming its fields.
    Jsonl,
}

impl std::fmt::Display for DataSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DataSource::Arithmetic => "arithmetic",
            DataSource::Gsm8k => "gsm8k",
            DataSource::Anli => "anli",
            DataSource::Jsonl => "jsonl",
        })
    }
}

/// The floating-point type of the models' weights and activations (`model.dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    F32,
    Bf16,
    F16,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    /// This agent's own base model; empty: the shared `model`.
    pub model: String,
    /// A LoRA adapter in the PEFT layout for this agent (e.g. a training run's
    /// `checkpoints/final/agent-N`); empty: none. Training continues from it.
    pub adapter: String,
    /// This agent's device; none: the run's `device`.
    pub device: Option<DeviceChoice>,
    /// This agent's sampling temperature; none: `generation.temperature`. A heterogeneous
    /// team samples each model at its own (the paper's runs used per-model decoding); PPO
    /// scores each agent's responses at the temperature that sampled them.
    pub temperature: Option<f64>,
    /// This agent's top-p; none: `generation.top_p`.
    pub top_p: Option<f64>,
    /// This agent's top-k; none: `generation.top_k`.
    pub top_k: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct DebateConfig {
    /// Agents in the team (each a policy; see `[[agents]]` for per-agent models).
    pub agents: u32,
    /// Debate turns (turn 1: every agent answers alone).
    pub turns: u32,
    /// Debates held together (generation batches across them): in training, a step's
    /// debates (with `train.algorithm = "grpo"`, `train.grpo.group_size` of each question).
    pub batch_size: usize,
    /// What a plugin failure on one task does: "stop" the run, or "drop-task" and go on.
    pub on_plugin_error: OnPluginError,
}

/// Bounds on the config's counts (see `Config::check_counts`): far past any run on the
/// machines maporl targets, far short of what would exhaust them by the count alone.
const MAX_AGENTS: usize = 64;
const MAX_TURNS: usize = 64;
const MAX_BATCH: usize = 1 << 16;
const MAX_TASKS: usize = 10_000_000;
const MAX_STEPS: usize = 100_000_000;

/// The largest `generation.prefix_cache_mib` (16 TiB), so that its bytes fit a `usize`.
const MAX_PREFIX_CACHE_MIB: usize = 1 << 24;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GenerationConfig {
    /// 0 is greedy.
    pub temperature: f64,
    /// Nucleus sampling: the smallest set of tokens whose probability reaches this (1.0: off).
    pub top_p: f64,
    /// 0 disables top-k.
    pub top_k: usize,
    /// Most tokens one response may have.
    pub max_new_tokens: usize,
    /// MiB of prompts' keys and values kept so that prompts extending them (every agent's
    /// turn-1 question under a frozen turn 1; each agent's next turn) are not computed again;
    /// 0 turns the cache off (and the prompts are then prefilled as one padded batch).
    pub prefix_cache_mib: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PluginsConfig {
    /// Where plugin file names without a directory are looked up; empty: the reference
    /// plugins built into the binary (or `$MAPORL_PLUGINS`).
    pub dir: String,
    pub protocol: PluginConfig,
    pub verifier: PluginConfig,
    pub shaper: PluginConfig,
    /// Where bundles (`path = "bundle/component@version-req"`) are installed; empty:
    /// `$MAPORL_BUNDLES`, else the user's data dir.
    pub store: String,
    /// The trusted-keys file; empty: `$MAPORL_TRUSTED_KEYS`, else
    /// `~/.config/maporl/trusted-keys.toml`.
    pub trusted_keys: String,
    /// Let unsigned bundles, and bundles signed by keys not in the trusted-keys file, run.
    pub allow_unsigned: bool,
    /// Bundle name -> the key id whose releases of it may run (overrides the store's
    /// binding of the name to the key that first installed it).
    pub signers: std::collections::BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// The component file; empty: the reference plugin for that role.
    #[serde(default)]
    pub path: String,
    /// Passed to the plugin's `configure` as JSON.
    #[serde(default = "empty_table")]
    #[schemars(with = "serde_json::Map<String, serde_json::Value>")]
    pub settings: toml::Table,
    #[serde(default)]
    pub limits: Limits,
}

fn empty_table() -> toml::Table {
    toml::Table::new()
}

impl PluginConfig {
    fn named(path: &str) -> PluginConfig {
        PluginConfig {
            path: path.into(),
            settings: empty_table(),
            limits: Limits::default(),
        }
    }

    /// The settings as the JSON document `configure` receives.
    pub fn settings_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.settings).expect("TOML tables are valid JSON")
    }
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            source: DataSource::Arithmetic,
            path: String::new(),
            difficulty: 1,
            seed: None,
            count: 16,
            offset: 0,
            held_out: 0,
            kind: String::new(),
            fields: None,
        }
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            path: "~/.cache/maporl/models/SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            dtype: Precision::F32,
        }
    }
}

impl Default for DebateConfig {
    fn default() -> Self {
        DebateConfig {
            agents: 2,
            turns: 3,
            batch_size: 8,
            on_plugin_error: OnPluginError::Stop,
        }
    }
}

impl Default for GenerationConfig {
    fn default() -> Self {
        // the paper (arXiv 2502.18439): temperature 0.7, top-p 1.0, up to 300 new tokens.
        GenerationConfig {
            temperature: 0.7,
            top_p: 1.0,
            top_k: 0,
            max_new_tokens: 300,
            prefix_cache_mib: 1024,
        }
    }
}

impl Default for PluginsConfig {
    fn default() -> Self {
        PluginsConfig {
            dir: String::new(),
            protocol: PluginConfig::named("debate.wasm"),
            verifier: PluginConfig::named("gsm8k.wasm"),
            shaper: PluginConfig::named("influence.wasm"),
            store: String::new(),
            trusted_keys: String::new(),
            allow_unsigned: false,
            signers: Default::default(),
        }
    }
}

impl Config {
    /// Reads `path`, applies `overrides` ("key.path=value", value in TOML syntax or a bare
    /// string) and checks the result.
    pub fn load(path: &Path, overrides: &[String]) -> anyhow::Result<Config> {
        let text = crate::files::read_regular_text(path, crate::files::TEXT_MAX, "config")?;
        let mut config = Config::parse(&text, overrides)
            .with_context(|| format!("in config {}", path.display()))?;
        if config.run_dir.is_empty() {
            let name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("run");
            config.run_dir = format!("runs/{name}");
        }
        Ok(config)
    }

    /// Parses config text; errors name the line and the key.
    pub fn parse(text: &str, overrides: &[String]) -> anyhow::Result<Config> {
        // First the file alone, so that errors carry its line numbers; then the overrides on
        // top of the file with every default filled in.
        let mut config: Config = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        if !overrides.is_empty() {
            let mut table = toml::Table::try_from(&config).expect("a config serializes");
            for o in overrides {
                apply_override(&mut table, o)?;
            }
            config = toml::Value::Table(table)
                .try_into()
                .map_err(|e| anyhow::anyhow!("after --set {}: {e}", overrides.join(" --set ")))?;
        }
        let defaults = PluginsConfig::default();
        for (slot, default) in [
            (&mut config.plugins.protocol, &defaults.protocol),
            (&mut config.plugins.verifier, &defaults.verifier),
            (&mut config.plugins.shaper, &defaults.shaper),
        ] {
            if slot.path.is_empty() {
                slot.path.clone_from(&default.path);
            }
        }
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> anyhow::Result<()> {
        if let Some(d) = &self.distributed {
            if self.train.mode == TrainMode::OffTheShelf {
                bail!(
                    "[distributed] is for train.mode = \"maporl\", \"single\" or \"sft\"; \
                     train.mode = \"off-the-shelf\" is an evaluation in one process (remove \
                     [distributed], or share the evaluation between ranks with `mpirun -np N \
                     maporl eval`)"
                );
            }
            if self.train.mode == TrainMode::Sft && d.placement == Placement::Agents {
                bail!(
                    "train.mode = \"sft\" over several ranks splits the data, not the team: \
                     use distributed.placement = \"data\" (every rank holds the whole team), \
                     or run it in one process"
                );
            }
        }
        for (slot, p) in [
            ("protocol", &self.plugins.protocol),
            ("verifier", &self.plugins.verifier),
            ("shaper", &self.plugins.shaper),
        ] {
            p.limits
                .check()
                .map_err(|e| anyhow::anyhow!("plugins.{slot}.{e}"))?;
        }
        if self.data.source != DataSource::Arithmetic && self.data.path.is_empty() {
            bail!(
                "data.path is required for data.source = \"{}\"",
                self.data.source
            );
        }
        if self.data.source == DataSource::Jsonl && self.data.fields.is_none() {
            bail!("data.fields (question, reference, ...) is required for data.source = \"jsonl\"");
        }
        if self.data.difficulty > crate::data::MAX_FAMILY {
            bail!(
                "data.difficulty = {}: expected {}",
                self.data.difficulty,
                crate::data::ARITHMETIC_FAMILIES
            );
        }
        if self.debate.agents == 0 || self.debate.turns == 0 {
            bail!("debate.agents and debate.turns must be at least 1");
        }
        self.check_counts()?;
        if self.agents.len() > self.debate.agents as usize {
            bail!(
                "{} [[agents]] entries for debate.agents = {}",
                self.agents.len(),
                self.debate.agents
            );
        }
        if self.debate.batch_size == 0 {
            bail!("debate.batch_size must be at least 1");
        }
        let g = &self.generation;
        if g.temperature < 0.0 || !(0.0..=1.0).contains(&g.top_p) || g.top_p == 0.0 {
            bail!("generation: temperature must be >= 0 and top_p in (0, 1]");
        }
        for a in 0..self.agents.len() {
            let s = self.agent_sampling(a);
            let bad_temperature = !(s.temperature.is_finite() && s.temperature >= 0.0);
            if bad_temperature || !(s.top_p > 0.0 && s.top_p <= 1.0) {
                bail!(
                    "agents[{a}]: temperature must be a finite number >= 0 and top_p in (0, 1], \
                     got temperature {} and top_p {}",
                    s.temperature,
                    s.top_p
                );
            }
        }
        if g.max_new_tokens == 0 {
            bail!("generation.max_new_tokens must be at least 1");
        }
        if g.prefix_cache_mib > MAX_PREFIX_CACHE_MIB {
            bail!(
                "generation.prefix_cache_mib = {}: expected at most {MAX_PREFIX_CACHE_MIB} \
                 (16 TiB; 0 turns the cache off)",
                g.prefix_cache_mib
            );
        }
        let t = &self.train;
        if t.adapter_from_turn == 0 || t.adapter_from_turn > self.debate.turns {
            bail!(
                "train.adapter_from_turn = {}: expected a turn from 1 to debate.turns = {}",
                t.adapter_from_turn,
                self.debate.turns
            );
        }
        if t.full_finetune && t.adapter_from_turn > 1 {
            bail!(
                "train.adapter_from_turn > 1 needs an adapter to switch off at turn 1; it \
                 cannot be combined with train.full_finetune"
            );
        }
        if t.schedule == Schedule::TurnBased && self.debate.turns < 2 {
            bail!("train.schedule = \"turn-based\" needs debate.turns >= 2");
        }
        if t.schedule == Schedule::TurnBased && t.adapter_from_turn > 2 {
            bail!(
                "train.schedule = \"turn-based\" trains turn 2 first, but \
                 train.adapter_from_turn = {} leaves turn 2 to the base model",
                t.adapter_from_turn
            );
        }
        if !(0.0..1.0).contains(&t.sft.lora_dropout) {
            bail!(
                "train.sft.lora_dropout = {}: expected a probability in [0, 1)",
                t.sft.lora_dropout
            );
        }
        if !(t.sft.top_fraction > 0.0 && t.sft.top_fraction <= 1.0) {
            bail!(
                "train.sft.top_fraction = {}: expected a fraction in (0, 1]",
                t.sft.top_fraction
            );
        }
        if t.ppo.grad_accum == 0 || t.ppo.epochs == 0 || t.ppo.minibatches == 0 {
            bail!("train.ppo.epochs, minibatches and grad_accum must be at least 1");
        }
        if t.algorithm == Algorithm::Grpo {
            self.check_grpo()?;
        }
        self.verifier.validate()?;
        if let Some(w) = &self.warm_start {
            w.validate()?;
            let max = crate::data::MAX_FAMILY;
            if let Some(f) = w.families.iter().find(|&&f| f == 0 || f > max) {
                bail!(
                    "warm_start.families holds {f}: expected arithmetic difficulties from 1 to {max}"
                );
            }
            if self.data.source != DataSource::Arithmetic {
                bail!(
                    "warm_start: its scripted teachers answer arithmetic questions only, and \
                     data.source = \"{}\"",
                    self.data.source
                );
            }
        }
        Ok(())
    }

    /// What `train.algorithm = "grpo"` needs of the rest of the config.
    fn check_grpo(&self) -> anyhow::Result<()> {
        let t = &self.train;
        let g = t.grpo.group_size;
        let other = match t.mode {
            TrainMode::Maporl | TrainMode::Single => None,
            TrainMode::Sft => Some("sft"),
            TrainMode::OffTheShelf => Some("off-the-shelf"),
        };
        if let Some(mode) = other {
            bail!(
                "train.algorithm = \"grpo\" is a way to update learners, for train.mode = \
                 \"maporl\" or \"single\"; train.mode = \"{mode}\" runs no RL update"
            );
        }
        if g < 2 {
            bail!(
                "train.grpo.group_size = {g}: GRPO compares each reward with the others of \
                 its group, so a group needs at least 2 debates"
            );
        }
        if !self.debate.batch_size.is_multiple_of(g) {
            bail!(
                "debate.batch_size = {} is not a multiple of train.grpo.group_size = {g}: \
                 debate.batch_size counts debates, and each question is debated {g} times",
                self.debate.batch_size
            );
        }
        if t.value_heads == ValueHeads::PerTurn {
            bail!(
                "train.value_heads = \"per-turn\" chooses PPO's value heads, and GRPO has \
                 none: remove it, or use train.algorithm = \"ppo\""
            );
        }
        Ok(())
    }

    /// The questions one training step debates: `debate.batch_size` debates, each of its
    /// own question, or with GRPO each question `train.grpo.group_size` times.
    pub fn questions_per_step(&self) -> usize {
        match self.train.algorithm {
            Algorithm::Ppo => self.debate.batch_size,
            Algorithm::Grpo => self.debate.batch_size / self.train.grpo.group_size.max(1),
        }
    }

    /// Every count the run allocates or loops by is held to a bound, so that a number that
    /// is a valid integer but absurd (`--set data.count=300000000`) is refused naming its key
    /// instead of exhausting memory or running for ever.
    fn check_counts(&self) -> anyhow::Result<()> {
        let (d, t, g) = (&self.data, &self.train, &self.generation);
        let v = &self.verifier;
        let mut counts: Vec<(&str, usize, usize)> = vec![
            ("debate.agents", self.debate.agents as usize, MAX_AGENTS),
            ("debate.turns", self.debate.turns as usize, MAX_TURNS),
            ("debate.batch_size", self.debate.batch_size, MAX_BATCH),
            (
                "generation.max_new_tokens",
                g.max_new_tokens,
                crate::model::ROPE_POSITIONS,
            ),
            ("data.held_out", d.held_out, MAX_TASKS),
            ("train.steps", t.steps, MAX_STEPS),
            ("train.lora_r", t.lora_r, 4096),
            ("train.ppo.epochs", t.ppo.epochs, 1000),
            ("train.ppo.minibatches", t.ppo.minibatches, MAX_BATCH),
            ("train.ppo.grad_accum", t.ppo.grad_accum, MAX_BATCH),
            ("train.grpo.group_size", t.grpo.group_size, MAX_BATCH),
            ("train.sft.epochs", t.sft.epochs, 1000),
            ("train.sft.batch_size", t.sft.batch_size, MAX_BATCH),
            ("verifier.batch_size", v.batch_size, MAX_BATCH),
            (
                "verifier.max_response_tokens",
                v.max_response_tokens,
                crate::model::ROPE_POSITIONS,
            ),
            (
                "verifier.generate.samples_per_question",
                v.generate.samples_per_question,
                MAX_BATCH,
            ),
            ("verifier.train.epochs", v.train.epochs, 1000),
            ("verifier.train.batch_size", v.train.batch_size, MAX_BATCH),
            ("verifier.train.lora_r", v.train.lora_r, 4096),
        ];
        // Generated tasks are held in memory, every one up to data.offset + data.count; a
        // file's are bounded by the file.
        if d.source == DataSource::Arithmetic {
            counts.push(("data.offset", d.offset, MAX_TASKS));
            counts.push(("data.count", d.count, MAX_TASKS));
            counts.push((
                "data.offset + data.count",
                d.offset.saturating_add(d.count),
                MAX_TASKS,
            ));
        }
        if let Some(w) = &self.warm_start {
            counts.extend([
                ("warm_start.vocab_size", w.vocab_size, 1 << 20),
                ("warm_start.hidden_size", w.hidden_size, 1 << 14),
                ("warm_start.intermediate_size", w.intermediate_size, 1 << 16),
                ("warm_start.layers", w.layers, 256),
                ("warm_start.heads", w.heads, 256),
                ("warm_start.tasks", w.tasks, MAX_TASKS),
                ("warm_start.drills", w.drills, MAX_TASKS),
                ("warm_start.steps", w.steps, MAX_STEPS),
                ("warm_start.batch_tokens", w.batch_tokens, 1 << 24),
            ]);
        }
        for (key, value, max) in counts {
            if value > max {
                bail!("{key} = {value}: expected at most {max}");
            }
        }
        Ok(())
    }

    /// The config as TOML, every default filled in.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a config serializes")
    }

    /// Whether the team's agents are split between the ranks of a run
    /// (`distributed.placement = "agents"`).
    pub fn spreads_agents(&self) -> bool {
        self.distributed
            .as_ref()
            .is_some_and(|d| d.placement == Placement::Agents)
    }

    /// The model path of agent `a`.
    /// Agent `a`'s adapter directory, if the config gives one.
    /// Agent `a`'s device: its `[[agents]]` entry's, else the run's.
    pub fn agent_device(&self, a: usize) -> DeviceChoice {
        self.agents
            .get(a)
            .and_then(|agent| agent.device)
            .unwrap_or(self.device)
    }

    /// How agent `a` samples: `generation`, with its `[[agents]]` overrides.
    pub fn agent_sampling(&self, a: usize) -> crate::model::SamplingParams {
        let g = &self.generation;
        let agent = self.agents.get(a);
        crate::model::SamplingParams {
            temperature: agent.and_then(|x| x.temperature).unwrap_or(g.temperature),
            top_p: agent.and_then(|x| x.top_p).unwrap_or(g.top_p),
            top_k: agent.and_then(|x| x.top_k).unwrap_or(g.top_k),
        }
    }

    pub fn agent_adapter(&self, a: usize) -> Option<&str> {
        self.agents
            .get(a)
            .map(|agent| agent.adapter.as_str())
            .filter(|p| !p.is_empty())
    }

    /// The task kind plugins see for a question asked outside the data (`maporl debate`,
    /// the server): the data's kind, else "arith".
    pub fn task_kind(&self) -> String {
        match self.data.source {
            DataSource::Jsonl if !self.data.kind.is_empty() => self.data.kind.clone(),
            DataSource::Jsonl | DataSource::Arithmetic => "arith".into(),
            other => other.to_string(),
        }
    }

    pub fn agent_model(&self, a: usize) -> &str {
        match self.agents.get(a) {
            Some(agent) if !agent.model.is_empty() => &agent.model,
            _ => &self.model.path,
        }
    }

    /// A plugin's component file: absolute, relative to the working directory when it has a
    /// directory part, else a bare name: in `plugins.dir` (or `$MAPORL_PLUGINS`) when one is
    /// set, else the built-in reference plugin of that name (`debate`, `final-only.wasm`,
    /// `final_only.wasm`, ...; see [`crate::plugin::builtin`]). A reference plugin's README
    /// name also finds its file in a directory (`final-only.wasm` -> `final_only.wasm`).
    /// (A `bundle/component@req` reference is resolved by
    /// `bundle::resolve_plugin` instead.)
    pub fn plugin_path(&self, plugin: &PluginConfig) -> PathBuf {
        use crate::plugin::builtin;
        if plugin.path.starts_with(builtin::PREFIX) {
            return PathBuf::from(&plugin.path);
        }
        let path = expand_home(&plugin.path);
        if path.is_absolute() || path.components().count() > 1 {
            return path;
        }
        let dir = if self.plugins.dir.is_empty() {
            plugins_dir_override()
        } else {
            Some(expand_home(&self.plugins.dir))
        };
        let reference = builtin::find(&plugin.path);
        match (dir, reference) {
            (Some(dir), Some(b)) if !dir.join(&path).exists() => dir.join(b.file),
            (Some(dir), _) => dir.join(path),
            (None, Some(b)) => builtin::path_of(b),
            // Not a reference name: loading it says so and lists the built-ins.
            (None, None) => PathBuf::from(format!("{}{}", builtin::PREFIX, plugin.path)),
        }
    }
}

impl WarmStartConfig {
    /// The teachers' chances of adopting a right and a wrong peer majority.
    pub fn adopt_rates(&self) -> (f64, f64) {
        (
            self.teacher_adopt_right
                .unwrap_or(self.teacher_persuadability),
            self.teacher_adopt_wrong
                .unwrap_or(self.teacher_persuadability),
        )
    }

    fn validate(&self) -> anyhow::Result<()> {
        for (key, v) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("layers", self.layers),
            ("heads", self.heads),
            ("tasks", self.tasks),
            ("steps", self.steps),
            ("batch_tokens", self.batch_tokens),
        ] {
            if v == 0 {
                bail!("warm_start.{key} = 0: expected at least 1");
            }
        }
        if !self.hidden_size.is_multiple_of(self.heads)
            || !(self.hidden_size / self.heads).is_multiple_of(2)
        {
            bail!(
                "warm_start.hidden_size = {} must split into warm_start.heads = {} heads of an \
                 even size",
                self.hidden_size,
                self.heads
            );
        }
        for (key, p) in [
            ("teacher_skill", self.teacher_skill),
            ("teacher_persuadability", self.teacher_persuadability),
            ("teacher_adopt_right", self.adopt_rates().0),
            ("teacher_adopt_wrong", self.adopt_rates().1),
        ] {
            if !(0.0..=1.0).contains(&p) {
                bail!("warm_start.{key} = {p}: expected a probability in [0, 1]");
            }
        }
        if self.vocab_size < 260 {
            bail!(
                "warm_start.vocab_size = {}: expected at least 260 (256 bytes, the chat \
                 format's special tokens and some merges)",
                self.vocab_size
            );
        }
        Ok(())
    }
}

/// `$MAPORL_PLUGINS`: a directory that bare plugin names resolve in instead of the
/// built-in reference plugins (a plugin author's build directory, the tests' fixtures).
pub fn plugins_dir_override() -> Option<PathBuf> {
    std::env::var_os("MAPORL_PLUGINS")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
}

/// Sets `a.b.c = value` in `table`; the value is read as TOML, or else taken as a string.
fn apply_override(table: &mut toml::Table, assignment: &str) -> anyhow::Result<()> {
    let (key, raw) = assignment
        .split_once('=')
        .with_context(|| format!("--set {assignment}: expected key=value"))?;
    let key = key.trim();
    let value: toml::Value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts
        .pop()
        .filter(|k| !k.is_empty())
        .with_context(|| format!("--set {assignment}: empty key"))?;
    let mut here = table;
    for (i, part) in parts.iter().enumerate() {
        let entry = here
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        here = entry.as_table_mut().with_context(|| {
            format!(
                "--set {assignment}: `{}` is not a table",
                parts[..=i].join(".")
            )
        })?;
    }
    here.insert(last.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_config_loads_and_the_paper_ones_match_paper_settings() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_some_and(|x| x == "toml") {
                Config::load(&path, &[]).unwrap_or_else(|e| panic!("{e:#}"));
                n += 1;
            }
        }
        assert!(n >= 5, "{n} configs");
        for name in ["gsm8k-maporl.toml", "anli-maporl.toml"] {
            let c = Config::load(&dir.join(name), &[]).unwrap();
            let (t, p) = (&c.train, &c.train.ppo);
            assert_eq!((c.debate.agents, c.debate.turns), (2, 3), "{name}");
            assert_eq!(
                (t.lora_r, t.lora_alpha, t.kl_coef),
                (8, 16.0, 0.002),
                "{name}"
            );
            assert_eq!(
                (p.lr, p.epochs, p.minibatches, p.vf_coef),
                (1e-5, 4, 8, 0.1),
                "{name}"
            );
            assert_eq!(
                t.steps * c.debate.batch_size,
                12_800,
                "{name}: the paper's 12,800"
            );
        }
    }

    #[test]
    fn defaults_fill_everything_and_round_trip() {
        let c = Config::parse("", &[]).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.debate.agents, 2);
        assert_eq!(c.generation.max_new_tokens, 300);
        let again = Config::parse(&c.to_toml(), &[]).unwrap();
        assert_eq!(again, c);
    }

    #[test]
    fn each_agent_may_sample_at_its_own_temperature() {
        let text = "[generation]\ntemperature = 0.7\ntop_p = 0.9\n\n\
                    [[agents]]\ntemperature = 0.2\n\n[[agents]]\ntop_k = 5\n";
        let c = Config::parse(text, &[]).unwrap();
        let (a, b) = (c.agent_sampling(0), c.agent_sampling(1));
        assert_eq!((a.temperature, a.top_p, a.top_k), (0.2, 0.9, 0));
        assert_eq!((b.temperature, b.top_p, b.top_k), (0.7, 0.9, 5));
        // An agent without an [[agents]] entry takes `generation`.
        let c = Config::parse("[generation]\ntemperature = 0.4\n", &[]).unwrap();
        assert_eq!(c.agent_sampling(1).temperature, 0.4);
        for bad in [
            "[[agents]]\ntemperature = -1.0\n",
            "[[agents]]\ntemperature = inf\n",
            "[[agents]]\ntop_p = 0.0\n",
            "[[agents]]\ntop_p = 1.5\n",
        ] {
            let err = format!("{:#}", Config::parse(bad, &[]).unwrap_err());
            assert!(
                err.contains("agents[0]: temperature must be"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn unknown_keys_are_refused_with_line_and_key() {
        let text = "seed = 1\n\n[debate]\nagents = 2\nturnz = 3\n";
        let err = Config::parse(text, &[]).unwrap_err().to_string();
        assert!(err.contains("line 5"), "{err}");
        assert!(err.contains("turnz"), "{err}");
        let err = Config::parse("[plugins.protocol]\npath = \"x\"\nsetings = {}\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 3") && err.contains("setings"), "{err}");
    }

    #[test]
    fn overrides_set_any_key_and_are_checked() {
        let c = Config::parse(
            "[debate]\nagents = 2\n",
            &[
                "debate.agents=3".into(),
                "generation.temperature=0".into(),
                "plugins.protocol.settings.early_stop=true".into(),
                "model.path=/models/x.gguf".into(),
            ],
        )
        .unwrap();
        assert_eq!(c.debate.agents, 3);
        assert_eq!(c.generation.temperature, 0.0);
        assert_eq!(
            c.plugins.protocol.settings_json(),
            serde_json::json!({"early_stop": true})
        );
        assert_eq!(c.model.path, "/models/x.gguf");
        let err = Config::parse("", &["debate.agentz=3".into()])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--set debate.agentz=3") && err.contains("agentz"),
            "{err}"
        );
        let err = Config::parse("", &["seed".into()]).unwrap_err().to_string();
        assert!(err.contains("key=value"), "{err}");
        let err = Config::parse("", &["seed.x=1".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`seed` is not a table"), "{err}");
    }

    #[test]
    fn devices_are_named_per_run_agent_and_verifier_and_opened_or_refused() {
        let c = Config::parse(
            "device = \"cpu\"\n[debate]\nagents = 3\n[[agents]]\n[[agents]]\ndevice = \"cuda:1\"\n\
             [verifier]\ndevice = \"cuda\"\n",
            &[],
        )
        .unwrap();
        assert_eq!(
            (0..3).map(|a| c.agent_device(a)).collect::<Vec<_>>(),
            vec![DeviceChoice::Cpu, DeviceChoice::Cuda(1), DeviceChoice::Cpu]
        );
        assert_eq!(c.verifier.device, Some(DeviceChoice::Cuda(0)));
        // Written back as it was read, so a resumed run compares equal.
        let again = Config::parse(&c.to_toml(), &[]).unwrap();
        assert_eq!(again, c);
        assert_eq!(Config::default().device, DeviceChoice::Auto);
        for bad in ["gpu", "cuda:x", "cuda:-1", "CPU"] {
            let err = Config::parse(&format!("device = \"{bad}\"\n"), &[])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("unknown device `{bad}`")) && err.contains("line 1"),
                "{err}"
            );
        }
        assert!(DeviceChoice::Cpu.open().unwrap().is_cpu());
        if !cfg!(feature = "cuda") {
            // Without CUDA, "auto" is the CPU and a CUDA device is a clear refusal.
            assert!(DeviceChoice::Auto.open().unwrap().is_cpu());
            let err = DeviceChoice::Cuda(1).open().unwrap_err().to_string();
            assert!(
                err.contains("cuda:1") && err.contains("built without CUDA"),
                "{err}"
            );
        }
    }

    #[test]
    fn bad_values_are_named() {
        // A closed set is an enum: a value outside it is refused at its line, with the
        // values it could have been; through --set, naming the override.
        let err = Config::parse("[data]\nsource = \"mnist\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 2")
                && err.contains("source = \"mnist\"")
                && err.contains("`arithmetic`, `gsm8k`, `anli`, `jsonl`"),
            "{err}"
        );
        for (set, expected) in [
            (
                "train.mode=ppo",
                "`maporl`, `single`, `off-the-shelf`, `sft`",
            ),
            ("train.value_heads=one", "`shared` or `per-turn`"),
            ("train.schedule=random", "`joint` or `turn-based`"),
            ("model.dtype=f64", "`f32`, `bf16`, `f16`"),
        ] {
            let err = Config::parse("", &[set.to_string()])
                .unwrap_err()
                .to_string();
            let key = set.split('=').next().unwrap();
            assert!(
                err.contains(&format!("--set {set}"))
                    && err.contains(expected)
                    && err.contains(&format!("in `{key}`")),
                "{err}"
            );
        }
        let err = Config::parse("[data]\nsource = \"gsm8k\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("data.path is required"), "{err}");
        let err = Config::parse("[debate]\non_plugin_error = \"ignore\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("on_plugin_error"), "{err}");
        for (text, expected) in [
            (
                "[data]\ndifficulty = 8\n",
                "data.difficulty = 8: expected 1 (a + b",
            ),
            (
                "[warm_start]\nfamilies = [1, 8]\n",
                "warm_start.families holds 8: expected arithmetic difficulties from 1 to 7",
            ),
            (
                "[data]\ncount = 300000000\n",
                "data.count = 300000000: expected at most 10000000",
            ),
            (
                "[data]\noffset = 9000000\ncount = 2000000\n",
                "data.offset + data.count = 11000000: expected at most 10000000",
            ),
            (
                "[debate]\nagents = 1000\n",
                "debate.agents = 1000: expected at most 64",
            ),
            (
                "[generation]\nmax_new_tokens = 100000000\n",
                "generation.max_new_tokens = 100000000: expected at most 131072",
            ),
            (
                "[warm_start]\nhidden_size = 1048576\nheads = 4\n",
                "warm_start.hidden_size = 1048576: expected at most 16384",
            ),
            (
                "[train.sft]\nlora_dropout = 1.0\n",
                "train.sft.lora_dropout = 1: expected a probability in [0, 1)",
            ),
            (
                "[warm_start]\nteacher_adopt_wrong = 1.5\n",
                "warm_start.teacher_adopt_wrong = 1.5: expected a probability",
            ),
        ] {
            let err = Config::parse(text, &[]).unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
    }

    #[test]
    fn plugin_paths_resolve_against_the_plugins_dir() {
        let c = Config::parse(
            "[plugins]\ndir = \"/opt/plugins\"\n[plugins.verifier]\npath = \"./mine/v.wasm\"\n",
            &[],
        )
        .unwrap();
        assert_eq!(
            c.plugin_path(&c.plugins.protocol),
            PathBuf::from("/opt/plugins/debate.wasm")
        );
        assert_eq!(
            c.plugin_path(&c.plugins.verifier),
            PathBuf::from("./mine/v.wasm")
        );
        // A reference plugin's README name finds its file in a directory.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("final_only.wasm"), b"").unwrap();
        let c = Config::parse(
            &format!(
                "[plugins]\ndir = {:?}\n[plugins.shaper]\npath = \"final-only.wasm\"\n",
                dir.path().to_str().unwrap()
            ),
            &[],
        )
        .unwrap();
        assert_eq!(
            c.plugin_path(&c.plugins.shaper),
            dir.path().join("final_only.wasm")
        );
        // Without a directory, bare names are the built-ins, under either name.
        if plugins_dir_override().is_none() {
            for (given, path) in [
                ("final-only", "builtin:final_only.wasm"),
                ("final_only.wasm", "builtin:final_only.wasm"),
                ("debate.wasm", "builtin:debate.wasm"),
                ("builtin:round-robin", "builtin:round-robin"),
                ("mine.wasm", "builtin:mine.wasm"),
            ] {
                let c =
                    Config::parse(&format!("[plugins.shaper]\npath = {given:?}\n"), &[]).unwrap();
                assert_eq!(
                    c.plugin_path(&c.plugins.shaper),
                    PathBuf::from(path),
                    "{given}"
                );
            }
        }
    }

    #[test]
    fn every_shipped_config_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let c = Config::load(&path, &[])
                    .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
                // The shipped teams have two agents, three in configs/fair.toml.
                assert!((2..=3).contains(&c.debate.agents), "{}", path.display());
                n += 1;
            }
        }
        assert!(n >= 3, "configs/ holds the shipped experiments");
    }
}
