"""The records of the contract (`maporl:plugin/types`), as plain dataclasses.

A plugin works on these, natively testable without any wasm; the export glue converts from
and to the generated bindings at the component's edge.
"""

from dataclasses import dataclass, field
from typing import List, Optional, Tuple

SYSTEM, USER, ASSISTANT = "system", "user", "assistant"
ROLES = (SYSTEM, USER, ASSISTANT)


@dataclass
class Task:
    id: str
    kind: str
    question: str
    reference: str = ""
    fields: List[Tuple[str, str]] = field(default_factory=list)


@dataclass
class Utterance:
    turn: int
    agent: int
    text: str
    answer: Optional[str] = None
    score: float = 0.0
    correct: bool = False


@dataclass
class Transcript:
    agents: int
    turns: int
    utterances: List[Utterance] = field(default_factory=list)


@dataclass
class ChatMessage:
    role: str
    content: str


@dataclass
class Prompt:
    agent: int
    messages: List[ChatMessage]


@dataclass
class Verdict:
    answer: Optional[str]
    score: float
    correct: bool


@dataclass
class Reward:
    turn: int
    agent: int
    total: float
    parts: List[Tuple[str, float]]
