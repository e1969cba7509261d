"""Prompts: the turn-1 prompt per task kind and the debate's follow-up messages, the same
text as the Rust SDK's `prompts` module. Agents are numbered from 1 in prompt text."""

from typing import List, Optional, Sequence, Tuple

from .text import trim
from .transcript import PluginError, find
from .types import ASSISTANT, SYSTEM, USER, ChatMessage, Task, Transcript

NUMERIC, NLI, GENERIC = "numeric", "nli", "generic"


def task_kind(task: Task) -> str:
    kind = trim(task.kind).lower()
    if kind in ("gsm8k", "arith"):
        return NUMERIC
    if kind == "anli":
        return NLI
    return GENERIC


def field(task: Task, name: str) -> Optional[str]:
    for k, v in task.fields:
        if k == name:
            v = trim(v)
            return v or None
    return None


def question_block(task: Task) -> str:
    if task_kind(task) == NLI:
        p, h = field(task, "premise"), field(task, "hypothesis")
        if p is not None and h is not None:
            return f"Premise: {p}\nHypothesis: {h}"
        return trim(task.question)
    return f"Question: {trim(task.question)}"


INSTRUCTION = {
    NUMERIC: "Provide a reasoning for your solution. At the end, write the answer as "
    "`Answer: \\boxed{N}` where N is an integer.",
    NLI: "Does the premise entail the hypothesis? Choose one of entailment / neutral / "
    "contradiction, reason briefly, and conclude with `Answer: \\boxed{label}` where "
    "label is entailment, neutral or contradiction.",
    GENERIC: "Answer briefly and end with `Answer: \\boxed{...}`.",
}


def first_turn_prompt(task: Task) -> str:
    return f"{question_block(task)}\n{INSTRUCTION[task_kind(task)]}"


REVISE_WITH_PEERS = (
    "Consider your previous solution and the other agents' answers. If you believe your "
    "previous answer was wrong, revise it; otherwise keep it. Avoid merely repeating earlier "
    "reasoning, and keep the reasoning short."
)
REVISE_ALONE = (
    "Consider your previous solution. If you believe it was wrong, revise it; otherwise keep "
    "it. Avoid merely repeating earlier reasoning, and keep the reasoning short."
)


def agent_label(agent: int) -> str:
    return f"Agent {agent + 1}"


def score_note(score: float) -> str:
    verdict = "correct" if score >= 0.5 else "incorrect"
    return (
        f"Reward: {score:.3f} out of 1.0, which means the verifier thinks this answer is "
        f"likely {verdict}."
    )


def render_shown(shown: Sequence[Tuple[str, str, Optional[float]]]) -> str:
    """(label, text, score or None) per shown answer, one paragraph each."""
    return "\n\n".join(
        f"{label}: {trim(text)}" if score is None else f"{label}: {trim(text)}\n{score_note(score)}"
        for label, text, score in shown
    )


def followup_message(task: Task, peers: Sequence[Tuple[str, str, Optional[float]]]) -> str:
    question = first_turn_prompt(task)
    if not peers:
        return f"{REVISE_ALONE}\n\n{question}"
    return (
        "These are the other agents' answers from the previous turn:\n\n"
        f"{render_shown(peers)}\n\n{REVISE_WITH_PEERS}\n\n{question}"
    )


def system_message(system: Optional[str]) -> List[ChatMessage]:
    if system is None or not trim(system):
        return []
    return [ChatMessage(SYSTEM, system)]


def peers_of(participants: Sequence[int], agent: int, limit: Optional[int]) -> List[int]:
    """At most `limit` (all when None) other participants, cyclically after `agent`."""
    n = len(participants)
    if agent not in participants:
        return []
    pos = list(participants).index(agent)
    count = n - 1 if limit is None else min(limit, n - 1)
    return [participants[(pos + 1 + i) % n] for i in range(count)]


def debate_messages(
    plugin: str,
    task: Task,
    transcript: Transcript,
    agent: int,
    turn: int,
    participants: Sequence[int],
    peers: Optional[int] = None,
    show_scores: bool = False,
    system: Optional[str] = None,
) -> List[ChatMessage]:
    """The conversation `agent` sees at `turn`: the question, then for each earlier turn its
    own answer and a follow-up showing its peers' answers."""
    shown_peers = peers_of(participants, agent, peers)
    messages = system_message(system)
    messages.append(ChatMessage(USER, first_turn_prompt(task)))
    for k in range(1, turn):
        own = find(transcript, k, agent)
        if own is None:
            raise PluginError(
                f"{plugin}: task `{task.id}`: agent {agent} has no utterance at turn {k}, so its "
                f"turn-{turn} conversation cannot be built (the transcript does not follow "
                "this protocol)"
            )
        messages.append(ChatMessage(ASSISTANT, own.text))
        shown = []
        for p in shown_peers:
            u = find(transcript, k, p)
            if u is not None:
                shown.append((agent_label(u.agent), u.text, u.score if show_scores else None))
        messages.append(ChatMessage(USER, followup_message(task, shown)))
    return messages
