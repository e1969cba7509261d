//! maporl: multi-agent post-co-training of LLMs with reinforcement learning (MAPoRL).
//!
//! Data flows one way: data -> debate (protocol, agents, verifier) -> reward shaper -> ppo ->
//! checkpoint + metrics. [`train`] holds the loop that drives it; [`session`] loads what
//! every command needs. Collaboration protocols, verifiers and reward shapers are
//! WebAssembly components run in a sandbox ([`plugin`]).

pub mod bundle;
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod debate;
pub mod distributed;
pub mod eval;
pub mod files;
pub mod model;
pub mod net;
pub mod optim;
pub mod plugin;
pub mod report;
mod run_log;
pub mod serve;
pub mod session;
pub mod suggest;
pub mod tensorboard;
pub mod toy;
pub mod train;
pub mod transcript;
pub mod verifier;
pub mod warm_start;
