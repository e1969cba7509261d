//! maporl: multi-agent post-co-training of LLMs with reinforcement learning (MAPoRL).

pub mod model;
