"""The host's functions (`maporl:plugin/host`). Inside a component they call the host;
run natively (a plugin's own tests) `log` writes to stderr, `judge` fails as a run without
a learned verifier does, and `limits` gives the host's defaults."""

import sys
from dataclasses import dataclass
from typing import List

try:  # Inside a component: the bindings componentize-py generated for the world.
    from componentize_py_types import Err as _Err
    from wit_world.imports import host as _host

    _IN_COMPONENT = True
except ImportError:  # Natively.
    _host = _Err = None
    _IN_COMPONENT = False

DEBUG, INFO, WARN, ERROR = "debug", "info", "warn", "error"


def log(level: str, message: str) -> None:
    """Writes a line to the run's plugin log (bounded and sanitised by the host)."""
    if _IN_COMPONENT:
        levels = {
            DEBUG: _host.Level.DEBUG,
            INFO: _host.Level.INFO,
            WARN: _host.Level.WARN,
            ERROR: _host.Level.ERROR,
        }
        _host.log(levels[level], message)
    else:
        print(f"[{level}] {message}", file=sys.stderr)


def debug(message: str) -> None:
    log(DEBUG, message)


def info(message: str) -> None:
    log(INFO, message)


def warn(message: str) -> None:
    log(WARN, message)


def error(message: str) -> None:
    log(ERROR, message)


NO_VERIFIER = "no verifier model configured"


def judge(question: str, responses: List[str]) -> List[float]:
    """The run's learned verifier: the probability that each response answers `question`
    correctly. Raises `JudgeError` with the host's reason when it refuses or has none."""
    if not _IN_COMPONENT:
        raise JudgeError(NO_VERIFIER + " (run natively, outside a component)")
    try:
        return list(_host.judge(question, list(responses)))
    except _Err as e:
        raise JudgeError(e.value) from None


class JudgeError(Exception):
    """The host's refusal of a `judge` call; its message is the host's."""


@dataclass
class Limits:
    fuel: int
    deadline_ms: int
    memory_bytes: int
    max_result_bytes: int
    max_prompt_bytes: int
    max_answer_bytes: int
    max_abs_reward: float
    max_reward_parts: int
    max_part_name_bytes: int
    judge_responses_left: int


def limits() -> Limits:
    """The bounds this plugin runs under in this run (contract 0.2.0)."""
    if not _IN_COMPONENT:
        return Limits(2_000_000_000, 5_000, 64 << 20, 4096 << 10, 256 << 10, 1024, 1000.0, 32, 64, 1024)
    l = _host.limits()
    return Limits(
        l.fuel,
        l.deadline_ms,
        l.memory_bytes,
        l.max_result_bytes,
        l.max_prompt_bytes,
        l.max_answer_bytes,
        l.max_abs_reward,
        l.max_reward_parts,
        l.max_part_name_bytes,
        l.judge_responses_left,
    )
