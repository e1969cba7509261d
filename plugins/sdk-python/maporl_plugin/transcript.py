"""Look-ups and checks on a transcript, as the Rust SDK's `transcript` module does."""

from typing import Iterable, List, Optional

from .types import Transcript, Utterance


class PluginError(Exception):
    """An error a plugin returns as its world's error (the message as it is)."""


def check(plugin: str, transcript: Transcript) -> None:
    """What the host promises: agents, turns from 1, one utterance per (turn, agent)."""
    if transcript.agents == 0:
        raise PluginError(f"{plugin}: the transcript has no agents (agents = 0)")
    seen = set()
    for u in transcript.utterances:
        if u.turn == 0:
            raise PluginError(f"{plugin}: utterance at turn 0")
        if u.agent >= transcript.agents:
            raise PluginError(
                f"{plugin}: agent {u.agent} out of range (the team has {transcript.agents})"
            )
        if (u.turn, u.agent) in seen:
            raise PluginError(f"{plugin}: two utterances of agent {u.agent} at turn {u.turn}")
        seen.add((u.turn, u.agent))


def check_turn(plugin: str, turn: int) -> None:
    if turn == 0:
        raise PluginError(f"{plugin}: turns are 1-based, got turn 0")


def find(transcript: Transcript, turn: int, agent: int) -> Optional[Utterance]:
    for u in transcript.utterances:
        if u.turn == turn and u.agent == agent:
            return u
    return None


def at_turn(transcript: Transcript, turn: int) -> List[Utterance]:
    return [u for u in transcript.utterances if u.turn == turn]


def last_turn(transcript: Transcript) -> Optional[int]:
    return max((u.turn for u in transcript.utterances), default=None)


def latest(transcript: Transcript, agent: int, turn: int) -> Optional[Utterance]:
    best = None
    for u in transcript.utterances:
        if u.agent == agent and u.turn <= turn and (best is None or u.turn >= best.turn):
            best = u
    return best


def mean_score(transcript: Transcript, turn: int) -> Optional[float]:
    # Added in order, as Rust adds: `sum()` of floats is compensated from Python 3.12 on
    # (componentize-py 0.25.1 bundles 3.14), which can differ in the last bit.
    total, n = 0.0, 0
    for u in at_turn(transcript, turn):
        total += u.score
        n += 1
    return total / n if n else None


def majority(votes: Iterable[Optional[str]]) -> List[str]:
    """The answers with the most votes, sorted; none when no answer is valid or "invalid"
    (`None`) outvotes every answer (the paper's tie rule)."""
    counts, invalid = {}, 0
    for v in votes:
        if v is None:
            invalid += 1
        else:
            counts[v] = counts.get(v, 0) + 1
    best = max(counts.values(), default=0)
    if best == 0 or invalid > best:
        return []
    return sorted(a for a, n in counts.items() if n == best)
