"""Write maporl plugins in Python.

A plugin is a class derived from `Protocol`, `Verifier` or `RewardShaper`, exported with
`export` under the name componentize-py looks for, and built into a WebAssembly component
with `python -m maporl_plugin build`:

    from maporl_plugin import Verifier, Verdict, export, answers

    class Exact(Verifier):
        NAME = "exact"
        SETTINGS = {}
        def extract(self, task, text):
            return answers.last_boxed(text)
        def score(self, task, responses):
            ...

    Verification = export(Exact)

Helpers, with the Rust SDK's meaning to the byte: `answers` (boxed answers, integers, NLI
labels), `transcript` (look-ups, checks, `majority`), `prompts` (the debate's messages),
`reward` (rewards from named parts, rounded as the host keeps them), `host` (`log`,
`judge`, `limits`). Everything a plugin needs must be imported at the top of its module:
a component has no files to import from later.
"""

from . import answers, host, prompts, reward, text, transcript
from .transcript import PluginError
from .types import (
    ASSISTANT,
    SYSTEM,
    USER,
    ChatMessage,
    Prompt,
    Reward,
    Task,
    Transcript,
    Utterance,
    Verdict,
)
from .worlds import Protocol, RewardShaper, Verifier, export, parse_settings

__all__ = [
    "ASSISTANT",
    "SYSTEM",
    "USER",
    "ChatMessage",
    "PluginError",
    "Prompt",
    "Protocol",
    "Reward",
    "RewardShaper",
    "Task",
    "Transcript",
    "Utterance",
    "Verdict",
    "Verifier",
    "answers",
    "export",
    "host",
    "parse_settings",
    "prompts",
    "reward",
    "text",
    "transcript",
]
