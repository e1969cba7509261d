//! Prompts: the turn-1 prompt per task kind and the debate's follow-up messages.
//!
//! Agents are numbered from 1 in prompt text ("Agent 2" is agent index 1).
//!
//! The builders write each message into one buffer sized up front, and [`agent_label`],
//! [`push_number`] and [`concat`] do the same for a protocol's own text: in a component,
//! `format!`'s machinery and every extra allocation are guest code, a large share of a
//! plugin call.

use crate::transcript::find;
use crate::{ChatMessage, Role, Task, Transcript};

/// How a task's answer looks, from `task.kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskKind {
    /// "gsm8k", "arith": an integer.
    Numeric,
    /// "anli": entailment / neutral / contradiction.
    Nli,
    /// Anything else: a short free-form answer.
    Generic,
}

/// The kind of a task (case-insensitive).
pub fn task_kind(task: &Task) -> TaskKind {
    // Without lowering a copy: every prompt builder asks, several times a call.
    let kind = task.kind.trim();
    let is = |name: &str| kind.eq_ignore_ascii_case(name);
    if is("gsm8k") || is("arith") {
        TaskKind::Numeric
    } else if is("anli") {
        TaskKind::Nli
    } else {
        TaskKind::Generic
    }
}

/// A non-empty extra field of the task.
pub fn field<'a>(task: &'a Task, name: &str) -> Option<&'a str> {
    task.fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// The question as shown to the agents: "Question: ..." or, for ANLI, "Premise: ...\n
/// Hypothesis: ..." from the `premise` and `hypothesis` fields (the question as given when
/// either is missing).
pub fn question_block(task: &Task) -> String {
    let kind = task_kind(task);
    let mut out = String::with_capacity(first_turn_prompt_len(task, kind));
    push_question_block(&mut out, task, kind);
    out
}

/// Appends [`question_block`] to `out`. The builders below write each message into one
/// buffer sized up front: in a component, every allocation and every `format!` is guest
/// code, and they were most of a plugin call's time. They take the task's kind, found once
/// per prompt: a debate's prompts asked for it dozens of times a call.
fn push_question_block(out: &mut String, task: &Task, kind: TaskKind) {
    match kind {
        TaskKind::Nli => match (field(task, "premise"), field(task, "hypothesis")) {
            (Some(p), Some(h)) => {
                out.push_str("Premise: ");
                out.push_str(p);
                out.push_str("\nHypothesis: ");
                out.push_str(h);
            }
            _ => out.push_str(task.question.trim()),
        },
        _ => {
            out.push_str("Question: ");
            out.push_str(task.question.trim());
        }
    }
}

/// What the agent is asked to do with the question at turn 1.
pub fn task_instruction(task: &Task) -> &'static str {
    instruction_for(task_kind(task))
}

fn instruction_for(kind: TaskKind) -> &'static str {
    match kind {
        TaskKind::Numeric => {
            "Provide a reasoning for your solution. At the end, write the answer as \
             `Answer: \\boxed{N}` where N is an integer."
        }
        TaskKind::Nli => {
            "Does the premise entail the hypothesis? Choose one of entailment / neutral / \
             contradiction, reason briefly, and conclude with `Answer: \\boxed{label}` where \
             label is entailment, neutral or contradiction."
        }
        TaskKind::Generic => "Answer briefly and end with `Answer: \\boxed{...}`.",
    }
}

/// The answer-format reminder alone.
pub fn answer_format(task: &Task) -> &'static str {
    match task_kind(task) {
        TaskKind::Numeric => {
            "At the end, write the answer as `Answer: \\boxed{N}` where N is an integer."
        }
        TaskKind::Nli => {
            "Conclude with `Answer: \\boxed{label}` where label is entailment, neutral or \
             contradiction."
        }
        TaskKind::Generic => "End with `Answer: \\boxed{...}`.",
    }
}

/// The turn-1 user message: the question block, then the task instruction.
pub fn first_turn_prompt(task: &Task) -> String {
    first_turn_prompt_for(task, task_kind(task))
}

fn first_turn_prompt_for(task: &Task, kind: TaskKind) -> String {
    let mut out = String::with_capacity(first_turn_prompt_len(task, kind));
    push_first_turn_prompt(&mut out, task, kind);
    out
}

/// An upper bound on [`first_turn_prompt`]'s (and so [`question_block`]'s) length, for
/// sizing buffers.
fn first_turn_prompt_len(task: &Task, kind: TaskKind) -> usize {
    let fields: usize = task.fields.iter().map(|(_, v)| v.len()).sum();
    task.question.len() + fields + instruction_for(kind).len() + 32
}

fn push_first_turn_prompt(out: &mut String, task: &Task, kind: TaskKind) {
    push_question_block(out, task, kind);
    out.push('\n');
    out.push_str(instruction_for(kind));
}

/// `n` in decimal, appended without `format!` (whose machinery is most of the cost of a
/// short label in a component).
pub fn push_number(out: &mut String, n: u32) {
    if n < 10 {
        // Agent numbers, nearly always.
        out.push(char::from(b'0' + n as u8));
        return;
    }
    let mut digits = [0u8; 10];
    let mut start = digits.len();
    let mut rest = n;
    loop {
        start -= 1;
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    for &d in &digits[start..] {
        out.push(char::from(d));
    }
}

/// "Agent N" for the 0-based `agent`: agents are numbered from 1 in prompts.
pub fn agent_label(agent: u32) -> String {
    let mut out = String::with_capacity(16);
    out.push_str("Agent ");
    push_number(&mut out, agent.saturating_add(1));
    out
}

/// The pieces written one after another into one buffer sized up front: `format!` for
/// plain text, without its machinery.
pub fn concat(pieces: &[&str]) -> String {
    let mut out = String::with_capacity(pieces.iter().map(|p| p.len()).sum());
    for piece in pieces {
        out.push_str(piece);
    }
    out
}

/// The revise instruction at turns >= 2 when other agents' answers are shown.
pub const REVISE_WITH_PEERS: &str = "Consider your previous solution and the other agents' \
     answers. If you believe your previous answer was wrong, revise it; otherwise keep it. \
     Avoid merely repeating earlier reasoning, and keep the reasoning short.";

/// The revise instruction when no other agent is shown.
pub const REVISE_ALONE: &str = "Consider your previous solution. If you believe it was \
     wrong, revise it; otherwise keep it. Avoid merely repeating earlier reasoning, and keep \
     the reasoning short.";

/// The score note shown under an answer when scores are shown.
pub fn score_note(score: f32) -> String {
    let mut out = String::new();
    push_score_note(&mut out, score);
    out
}

fn push_score_note(out: &mut String, score: f32) {
    use std::fmt::Write;
    let verdict = if score >= 0.5 { "correct" } else { "incorrect" };
    write!(
        out,
        "Reward: {score:.3} out of 1.0, which means the verifier thinks this answer is likely {verdict}."
    )
    .expect("writing to a String cannot fail");
}

/// The longest score note: a finite score of up to 39 integer digits, or "NaN"/"inf".
const SCORE_NOTE_LEN: usize = 128;

/// One earlier response shown to an agent.
#[derive(Clone, Debug)]
pub struct Shown<'a> {
    /// "Agent 2", "Agent 1 (turn 1)", ...
    pub label: String,
    /// The response as generated.
    pub text: &'a str,
    /// Its verifier score, when scores are shown.
    pub score: Option<f32>,
}

/// Renders shown responses, one paragraph each: "Agent 2: text" and, with a score, the
/// score note on the next line.
pub fn render_shown(shown: &[Shown<'_>]) -> String {
    let mut out = String::with_capacity(shown_len(shown));
    push_shown(&mut out, shown);
    out
}

/// An upper bound on [`render_shown`]'s length.
fn shown_len(shown: &[Shown<'_>]) -> usize {
    shown
        .iter()
        .map(|s| s.label.len() + s.text.len() + 4 + s.score.map_or(0, |_| SCORE_NOTE_LEN + 1))
        .sum()
}

fn push_shown(out: &mut String, shown: &[Shown<'_>]) {
    for (i, s) in shown.iter().enumerate() {
        if i > 0 {
            out.push_str("\n\n");
        }
        out.push_str(&s.label);
        out.push_str(": ");
        out.push_str(s.text.trim());
        if let Some(score) = s.score {
            out.push('\n');
            push_score_note(out, score);
        }
    }
}

/// The follow-up user message of a debate turn >= 2: the other agents' previous answers (if
/// any), the revise instruction, then the question again with its instruction.
pub fn followup_message(task: &Task, peers: &[Shown<'_>]) -> String {
    followup_message_for(task, task_kind(task), peers)
}

fn followup_message_for(task: &Task, kind: TaskKind, peers: &[Shown<'_>]) -> String {
    const SHOWN: &str = "These are the other agents' answers from the previous turn:\n\n";
    let question = first_turn_prompt_len(task, kind);
    if peers.is_empty() {
        let mut out = String::with_capacity(REVISE_ALONE.len() + 2 + question);
        out.push_str(REVISE_ALONE);
        out.push_str("\n\n");
        push_first_turn_prompt(&mut out, task, kind);
        return out;
    }
    let mut out = String::with_capacity(
        SHOWN.len() + shown_len(peers) + REVISE_WITH_PEERS.len() + 4 + question,
    );
    out.push_str(SHOWN);
    push_shown(&mut out, peers);
    out.push_str("\n\n");
    out.push_str(REVISE_WITH_PEERS);
    out.push_str("\n\n");
    push_first_turn_prompt(&mut out, task, kind);
    out
}

/// A system message from the `system` setting (none when unset or blank).
pub fn system_message(system: Option<&str>) -> Option<ChatMessage> {
    system
        .filter(|s| !s.trim().is_empty())
        .map(|s| message(Role::System, s))
}

/// A chat message.
pub fn message(role: Role, content: impl Into<String>) -> ChatMessage {
    ChatMessage {
        role,
        content: content.into(),
    }
}

/// The other agents `agent` sees: at most `limit` (all when `None`) of `participants`,
/// taken cyclically starting after `agent`'s position in `participants`.
pub fn peers_of(participants: &[u32], agent: u32, limit: Option<u32>) -> Vec<u32> {
    peers(participants, agent, limit).collect()
}

/// [`peers_of`] without the `Vec` (in a component, an allocation per prompt).
fn peers(
    participants: &[u32],
    agent: u32,
    limit: Option<u32>,
) -> impl Iterator<Item = u32> + Clone + '_ {
    let n = participants.len();
    let (pos, count) = match participants.iter().position(|p| *p == agent) {
        Some(pos) => (pos, limit.map_or(n - 1, |l| (l as usize).min(n - 1))),
        None => (0, 0),
    };
    (0..count).map(move |i| participants[(pos + 1 + i) % n])
}

/// `text.trim()`, without the call when `text` starts and ends with a visible ASCII
/// character (as a response usually does): in a component, the generic trim is a call and
/// a UTF-8 decoding at each end, for each answer shown.
fn trimmed(text: &str) -> &str {
    match (text.as_bytes().first(), text.as_bytes().last()) {
        (Some(a), Some(z)) if a.is_ascii_graphic() && z.is_ascii_graphic() => text,
        _ => text.trim(),
    }
}

/// How a debate shows earlier turns to a debater.
#[derive(Clone, Copy, Debug)]
pub struct DebateView<'a> {
    /// The agents taking part in the debate, in order.
    pub participants: &'a [u32],
    /// Show at most this many other participants (all when `None`).
    pub peers: Option<u32>,
    /// Show each shown answer's verifier score.
    pub show_scores: bool,
    /// The system prompt, if any.
    pub system: Option<&'a str>,
}

/// The conversation debater `agent` sees at `turn` (paper §1): its own history as a chat
/// (user turn-1 prompt, assistant its turn-1 text, user follow-up, assistant its turn-2 text,
/// ...), where the follow-up before its turn-k answer shows its peers' turn-(k-1) answers.
///
/// The text is [`first_turn_prompt`]'s and [`followup_message`]'s (with [`Shown`] peers
/// labelled by [`agent_label`]), written without their intermediate values: the turn-1
/// prompt is built once and copied into every follow-up, and the peers' answers go straight
/// into the follow-up's buffer (no label strings, no list of peers or of shown answers): in
/// a component, 12% fewer instructions for a 3-agent turn-3 plan (BENCHMARKS.md).
pub fn debate_messages(
    plugin: &str,
    task: &Task,
    transcript: &Transcript,
    agent: u32,
    turn: u32,
    view: DebateView<'_>,
) -> Result<Vec<ChatMessage>, String> {
    let kind = task_kind(task);
    let peers = peers(view.participants, agent, view.peers);
    let system = system_message(view.system);
    // Turns past the transcript fail below; the bound keeps an absurd `turn` from
    // reserving memory first.
    let earlier = (turn.saturating_sub(1) as usize).min(transcript.utterances.len());
    let mut messages = Vec::with_capacity(usize::from(system.is_some()) + 1 + 2 * earlier);
    messages.extend(system);
    let first = messages.len();
    messages.push(message(Role::User, first_turn_prompt_for(task, kind)));
    for k in 1..turn {
        let own = find(transcript, k, agent).ok_or_else(|| {
            format!(
                "{plugin}: task `{}`: agent {agent} has no utterance at turn {k}, so its \
                 turn-{turn} conversation cannot be built (the transcript does not follow \
                 this protocol)",
                task.id
            )
        })?;
        messages.push(message(Role::Assistant, own.text.clone()));
        let shown = || {
            peers
                .clone()
                .filter_map(|p| find(transcript, k, p))
                .map(|u| (u.agent, u.text.as_str(), u.score))
        };
        let followup = peers_followup(&messages[first].content, shown, view.show_scores);
        messages.push(message(Role::User, followup));
    }
    Ok(messages)
}

/// [`followup_message`] for peers given as (agent, text, score), after `first` (the
/// task's [`first_turn_prompt`]).
fn peers_followup<'a, I>(first: &str, shown: impl Fn() -> I, show_scores: bool) -> String
where
    I: Iterator<Item = (u32, &'a str, f32)>,
{
    const SHOWN: &str = "These are the other agents' answers from the previous turn:\n\n";
    const LABEL_LEN: usize = "Agent 4294967295: ".len();
    let mut any = false;
    let mut len = 0;
    for (_, text, _) in shown() {
        any = true;
        len += 2 + LABEL_LEN + text.len() + if show_scores { SCORE_NOTE_LEN + 1 } else { 0 };
    }
    if !any {
        let mut out = String::with_capacity(REVISE_ALONE.len() + 2 + first.len());
        out.push_str(REVISE_ALONE);
        out.push_str("\n\n");
        out.push_str(first);
        return out;
    }
    let mut out =
        String::with_capacity(SHOWN.len() + len + REVISE_WITH_PEERS.len() + 4 + first.len());
    out.push_str(SHOWN);
    for (i, (agent, text, score)) in shown().enumerate() {
        if i > 0 {
            out.push_str("\n\n");
        }
        out.push_str("Agent ");
        push_number(&mut out, agent.saturating_add(1));
        out.push_str(": ");
        out.push_str(trimmed(text));
        if show_scores {
            out.push('\n');
            push_score_note(&mut out, score);
        }
    }
    out.push_str("\n\n");
    out.push_str(REVISE_WITH_PEERS);
    out.push_str("\n\n");
    out.push_str(first);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{task, transcript, utt};

    #[test]
    fn turn_one_prompts_per_kind() {
        let gsm = task("gsm8k", " What is 2+2? ", "4");
        assert_eq!(
            first_turn_prompt(&gsm),
            "Question: What is 2+2?\nProvide a reasoning for your solution. At the end, write \
             the answer as `Answer: \\boxed{N}` where N is an integer."
        );
        assert_eq!(task_kind(&task("ARITH", "", "")), TaskKind::Numeric);
        assert_eq!(task_kind(&task(" GSM8k\t", "", "")), TaskKind::Numeric);
        assert_eq!(task_kind(&task("\nAnLi ", "", "")), TaskKind::Nli);
        for generic in ["", "gsm8kx", "an li", "arithmetic", "ANLİ"] {
            assert_eq!(
                task_kind(&task(generic, "", "")),
                TaskKind::Generic,
                "{generic}"
            );
        }

        let mut nli = task("anli", "P / H", "e");
        assert!(first_turn_prompt(&nli).starts_with("P / H\nDoes the premise entail"));
        nli.fields = vec![
            ("premise".into(), "A dog runs.".into()),
            ("hypothesis".into(), "An animal moves.".into()),
        ];
        let p = first_turn_prompt(&nli);
        assert!(
            p.starts_with("Premise: A dog runs.\nHypothesis: An animal moves.\n"),
            "{p}"
        );
        assert!(p.contains("entailment / neutral / contradiction"));
        assert!(p.contains("`Answer: \\boxed{label}`"));

        let other = task("trivia", "Capital of France?", "Paris");
        assert_eq!(
            first_turn_prompt(&other),
            "Question: Capital of France?\nAnswer briefly and end with `Answer: \\boxed{...}`."
        );
    }

    /// The builders write into sized buffers; they must say what the plain `format!`
    /// composition says (the prompts' text is part of every run's transcripts).
    #[test]
    fn buffered_builders_say_what_format_says() {
        fn reference_shown(shown: &[Shown<'_>]) -> String {
            shown
                .iter()
                .map(|s| match s.score {
                    Some(score) => {
                        let verdict = if score >= 0.5 { "correct" } else { "incorrect" };
                        format!(
                            "{}: {}\nReward: {score:.3} out of 1.0, which means the verifier \
                             thinks this answer is likely {verdict}.",
                            s.label,
                            s.text.trim()
                        )
                    }
                    None => format!("{}: {}", s.label, s.text.trim()),
                })
                .collect::<Vec<_>>()
                .join("\n\n")
        }
        let mut nli = task("anli", " P / H ", "e");
        let mut tasks = vec![
            task("gsm8k", "  What is 2+2?\n", "4"),
            task("trivia", "Capital?", "Paris"),
            nli.clone(),
        ];
        nli.fields = vec![
            ("premise".into(), " A dog runs. ".into()),
            ("hypothesis".into(), "An animal moves.".into()),
        ];
        tasks.push(nli);
        let long = "x".repeat(5000);
        let texts = [
            "  first answer \\boxed{4}\n",
            "",
            long.as_str(),
            "é – ünïcode",
        ];
        let scores = [None, Some(0.734_f32), Some(0.0), Some(1e30), Some(f32::NAN)];
        for t in &tasks {
            let question = format!(
                "{}\n{}",
                match (task_kind(t), field(t, "premise"), field(t, "hypothesis")) {
                    (TaskKind::Nli, Some(p), Some(h)) => format!("Premise: {p}\nHypothesis: {h}"),
                    (TaskKind::Nli, _, _) => t.question.trim().to_string(),
                    _ => format!("Question: {}", t.question.trim()),
                },
                task_instruction(t)
            );
            assert_eq!(first_turn_prompt(t), question);
            assert_eq!(
                followup_message(t, &[]),
                format!("{REVISE_ALONE}\n\n{question}")
            );
            for n in 1..=texts.len() {
                let shown: Vec<Shown<'_>> = (0..n)
                    .map(|i| Shown {
                        label: format!("Agent {}", i + 2),
                        text: texts[i],
                        score: scores[(i + n) % scores.len()],
                    })
                    .collect();
                assert_eq!(render_shown(&shown), reference_shown(&shown));
                assert_eq!(
                    followup_message(t, &shown),
                    format!(
                        "These are the other agents' answers from the previous turn:\n\n{}\n\n\
                         {REVISE_WITH_PEERS}\n\n{question}",
                        reference_shown(&shown)
                    )
                );
            }
        }
    }

    #[test]
    fn numbers_and_labels_say_what_format_says() {
        let mut rng = crate::testing::Xorshift::new(7);
        let mut samples = vec![0, 1, 9, 10, 99, 100, 4_294_967_294, u32::MAX];
        // Every digit count, from one to ten.
        samples.extend((0..2_000).map(|_| (rng.next_u64() >> (32 + rng.below(32))) as u32));
        for n in samples {
            let mut out = String::from("x");
            push_number(&mut out, n);
            assert_eq!(out, format!("x{n}"));
            if n < u32::MAX {
                assert_eq!(agent_label(n), format!("Agent {}", n + 1));
            }
        }
        assert_eq!(agent_label(0), "Agent 1");
        // The last agent number a u32 holds, not a wrap to "Agent 0".
        assert_eq!(agent_label(u32::MAX), "Agent 4294967295");
        assert_eq!(concat(&[]), "");
        assert_eq!(concat(&["a", "", "bc", "é"]), "abcé");
    }

    #[test]
    fn trimmed_is_trim() {
        let ends = [
            "", " ", "\t", "\n", "x", "é", "\u{a0}", "\u{2003}", "~", "!", "\u{7f}", "\0",
        ];
        for a in ends {
            for z in ends {
                for middle in ["", "y", " mid dle "] {
                    let text = format!("{a}{middle}{z}");
                    assert_eq!(trimmed(&text), text.trim(), "{text:?}");
                }
            }
        }
    }

    #[test]
    fn score_notes() {
        assert_eq!(
            score_note(0.734),
            "Reward: 0.734 out of 1.0, which means the verifier thinks this answer is likely correct."
        );
        assert!(score_note(0.2).ends_with("likely incorrect."));
    }

    #[test]
    fn peers_are_cyclic_and_limited() {
        let all = [0, 1, 2, 3];
        assert_eq!(peers_of(&all, 0, None), vec![1, 2, 3]);
        assert_eq!(peers_of(&all, 2, None), vec![3, 0, 1]);
        assert_eq!(peers_of(&all, 2, Some(2)), vec![3, 0]);
        assert_eq!(peers_of(&all, 3, Some(1)), vec![0]);
        assert_eq!(peers_of(&all, 3, Some(9)), vec![0, 1, 2]);
        assert!(peers_of(&all, 1, Some(0)).is_empty());
        assert!(peers_of(&[0, 1], 5, None).is_empty());
    }

    #[test]
    fn system_prompt_only_when_set() {
        assert!(system_message(None).is_none());
        assert!(system_message(Some("  ")).is_none());
        assert_eq!(
            system_message(Some("Be brief.")).unwrap().role,
            Role::System
        );
    }

    /// `debate_messages` writes its follow-ups without the public builders' intermediate
    /// values; on random debates it must say what they say, message for message.
    #[test]
    fn debate_messages_say_what_the_public_builders_say() {
        fn composed(
            task: &Task,
            transcript: &Transcript,
            agent: u32,
            turn: u32,
            view: DebateView<'_>,
        ) -> Option<Vec<ChatMessage>> {
            let peers = peers_of(view.participants, agent, view.peers);
            let mut messages: Vec<ChatMessage> = system_message(view.system).into_iter().collect();
            messages.push(message(Role::User, first_turn_prompt(task)));
            for k in 1..turn {
                messages.push(message(
                    Role::Assistant,
                    find(transcript, k, agent)?.text.clone(),
                ));
                let shown: Vec<Shown<'_>> = peers
                    .iter()
                    .filter_map(|p| find(transcript, k, *p))
                    .map(|u| Shown {
                        label: agent_label(u.agent),
                        text: &u.text,
                        score: view.show_scores.then_some(u.score),
                    })
                    .collect();
                messages.push(message(Role::User, followup_message(task, &shown)));
            }
            Some(messages)
        }
        let long = "long ".repeat(700);
        let texts = [
            "  padded \\boxed{4}\n",
            "",
            "x",
            "é – ünïcode\t",
            long.as_str(),
            "\n\n",
        ];
        let scores = [0.0, 0.5, 0.734, 1.0, f32::NAN, 1e30, -0.0];
        let mut nli = task("anli", "P / H", "e");
        nli.fields = vec![
            ("premise".into(), " A dog runs. ".into()),
            ("hypothesis".into(), "An animal moves.".into()),
        ];
        let tasks = [
            task("gsm8k", " What is 2+2?\n", "4"),
            task("trivia", "Q?", "a"),
            nli,
        ];
        let mut rng = crate::testing::Xorshift::new(11);
        let mut compared = 0;
        for round in 0..600 {
            let agents = 1 + rng.below(5) as u32;
            let turns = 1 + rng.below(4) as u32;
            // Some peers' utterances missing, never the speaker's own (else both fail).
            let speaker = rng.below(u64::from(agents)) as u32;
            let mut utterances = Vec::new();
            for k in 1..turns {
                for a in 0..agents {
                    if a == speaker || rng.below(5) > 0 {
                        let text = texts[rng.below(texts.len() as u64) as usize];
                        let score = scores[rng.below(scores.len() as u64) as usize];
                        utterances.push(utt(k, a, text, Some("4"), score));
                    }
                }
            }
            let tr = transcript(agents, turns, utterances);
            // All agents, or a subset that holds the speaker (as the judge protocol passes).
            let participants: Vec<u32> = (0..agents)
                .filter(|a| *a == speaker || round % 3 != 0 || rng.below(2) == 0)
                .collect();
            let view = DebateView {
                participants: &participants,
                peers: (rng.below(3) == 0).then(|| rng.below(6) as u32),
                show_scores: rng.below(2) == 0,
                system: [None, Some("sys"), Some("  ")][rng.below(3) as usize],
            };
            let t = &tasks[round % tasks.len()];
            let got = debate_messages("debate", t, &tr, speaker, turns, view).unwrap();
            assert_eq!(
                Some(got),
                composed(t, &tr, speaker, turns, view),
                "round {round}"
            );
            compared += 1;
        }
        assert_eq!(compared, 600);
    }

    #[test]
    fn debate_history_is_a_chat() {
        let t = task("gsm8k", "Q?", "4");
        let tr = transcript(
            2,
            3,
            vec![
                utt(1, 0, "mine 1", Some("4"), 0.9),
                utt(1, 1, "theirs 1", Some("5"), 0.1),
                utt(2, 0, "mine 2", Some("4"), 0.8),
                utt(2, 1, "theirs 2", Some("4"), 0.7),
            ],
        );
        let view = DebateView {
            participants: &[0, 1],
            peers: None,
            show_scores: false,
            system: Some("sys"),
        };
        let m = debate_messages("debate", &t, &tr, 0, 3, view).unwrap();
        let roles: Vec<Role> = m.iter().map(|m| m.role).collect();
        use Role::*;
        assert_eq!(roles, vec![System, User, Assistant, User, Assistant, User]);
        assert_eq!(m[2].content, "mine 1");
        assert!(m[3].content.contains("Agent 2: theirs 1"));
        assert_eq!(m[4].content, "mine 2");
        assert!(m[5].content.contains("Agent 2: theirs 2"));
        assert!(!m[5].content.contains("theirs 1"));
        assert!(!m[5].content.contains("Reward:"));

        let err = debate_messages("debate", &t, &tr, 0, 4, view).unwrap_err();
        assert!(err.contains("agent 0 has no utterance at turn 3"), "{err}");
    }
}
