//! LLM agents on candle: one decoder for the llama family (Llama 2/3, Qwen2/2.5, Phi-3,
//! Mistral, SmolLM2), loading from Hugging Face folders and GGUF files, tokenizers and chat
//! templates, seeded sampling, batched generation with a KV cache, log-probs and values on
//! response positions, LoRA adapters and value heads over a shared frozen base.
//!
//! Device-generic: every entry point takes the `Device` (CPU, or CUDA with the `cuda` feature).

mod agent;
mod attention;
mod chat;
mod config;
mod decoder;
mod frozen;
mod fused;
mod generate;
pub mod hub;
mod load;
mod lora;
mod memory;
mod prefix;
mod rows;
mod threads;

pub use agent::Agent;
pub use chat::{ChatMessage, ChatTemplate};
pub use config::{Act, Arch, Config, RopeScaling};
pub use decoder::{Base, Checkpoint, Kernels, KvCache, Pass, Target, ROPE_POSITIONS};
#[doc(hidden)]
pub use generate::{
    generate, generate_observed, generate_sharing, generate_together, generate_traced, score,
    score_at_temperature, score_checkpointed, score_shared_prefixes, GenerateOptions, Generation,
    PolicyTrace, PrefixScored, RngState, Sampler, SamplingParams, Scored, Speaker,
};
pub use hub::resolve_model;
pub use load::{load, random, Loaded};
pub use lora::{Lora, LoraConfig, ValueHead};
pub use memory::{keep_freed_memory, resident_mib, Resident};
pub use prefix::{speaker_key, PrefixCache, PrefixStats};
pub use threads::elementwise_ops_inline;
