//! The records a debate is made of: tasks, chat messages, utterances, transcripts, and what
//! plugins say about them (plans, verdicts, rewards).
//!
//! These are the host's own types. They mirror the records of the WIT contract
//! (`wit/maporl.wit`) field for field, so that every other module (data, debate, eval, ppo)
//! can use them without knowing anything about WebAssembly.

use serde::{Deserialize, Serialize};

/// One question the agents work on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// Unique within its dataset; errors about this task name it.
    pub id: String,
    /// The task family, e.g. "gsm8k", "anli", "arith".
    #[serde(default)]
    pub kind: String,
    /// The question as a person would read it.
    pub question: String,
    /// The gold answer, normalised by the dataset loader.
    #[serde(default)]
    pub reference: String,
    /// Further dataset fields, e.g. ("premise", ...).
    #[serde(default)]
    pub fields: Vec<(String, String)>,
}

/// Who wrote a chat message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    /// The role's name in chat templates.
    pub fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One message of the conversation an agent is prompted with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
}

/// One response by one agent at one turn, after the verifier has read it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Utterance {
    /// 1-based turn.
    pub turn: u32,
    /// 0-based agent index.
    pub agent: u32,
    pub text: String,
    /// The extracted answer; `None` is "invalid".
    #[serde(default)]
    pub answer: Option<String>,
    /// Verifier score in [0, 1].
    #[serde(default)]
    pub score: f32,
    /// Whether `answer` matches the task's reference.
    #[serde(default)]
    pub correct: bool,
}

/// Everything said in one debate so far.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    /// Number of agents; agents are `0..agents`.
    pub agents: u32,
    /// The most turns this debate may have.
    pub turns: u32,
    /// Every utterance so far, by turn then agent.
    #[serde(default)]
    pub utterances: Vec<Utterance>,
}

impl Transcript {
    /// An empty debate between `agents` agents over at most `turns` turns.
    pub fn new(agents: u32, turns: u32) -> Self {
        Transcript {
            agents,
            turns,
            utterances: Vec::new(),
        }
    }

    /// The utterance of `agent` at `turn`, if it was said.
    pub fn utterance(&self, turn: u32, agent: u32) -> Option<&Utterance> {
        self.utterances
            .iter()
            .find(|u| u.turn == turn && u.agent == agent)
    }
}

/// What one agent is asked to say at one turn: the protocol's plan for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prompt {
    pub agent: u32,
    pub messages: Vec<ChatMessage>,
}

/// What the verifier concluded about one response.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub answer: Option<String>,
    pub score: f32,
    pub correct: bool,
}

/// The reward for one utterance, with its named parts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reward {
    pub turn: u32,
    pub agent: u32,
    pub total: f32,
    pub parts: Vec<(String, f32)>,
}
