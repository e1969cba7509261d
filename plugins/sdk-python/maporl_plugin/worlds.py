"""One base class per world, and `export`, which turns a plugin class into the class
componentize-py looks for in the app module (`Collaboration`, `Verification` or
`RewardShaping`):

    class Gsm8k(Verifier):
        NAME = "gsm8k-py"
        SETTINGS = {"strict": False}
        def extract(self, task, text): ...
        def score(self, task, responses): ...

    Verification = export(Gsm8k)

The glue parses `configure`'s JSON into `self.settings` (unknown keys and wrong types are
refused by name), converts the records both ways, and turns every exception into the world's
error with its message and where it was raised, so a failure never becomes a bare trap.
Inside a component, `print` writes to the plugin log (level info).
"""

import json
import os
import sys
import traceback
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

from . import host

if host._IN_COMPONENT:
    # Imported now, while componentize-py snapshots the module: a component cannot import
    # later (it has no files).
    from componentize_py_types import Err as _Err
    from wit_world.imports import types as _w
from .transcript import PluginError
from .types import ASSISTANT, SYSTEM, USER, Prompt, Reward, Task, Transcript, Utterance, Verdict


class Plugin:
    """What every world's plugin has: a name for its errors and its settings' defaults."""

    NAME = "plugin"
    # Every setting the plugin takes, with its default; `configure` refuses any other key,
    # and a value whose type differs from its default's (an int is taken for a float; a
    # default of None takes anything).
    SETTINGS: Dict[str, Any] = {}

    def __init__(self, settings: SimpleNamespace):
        self.settings = settings


class Protocol(Plugin):
    def plan_turn(self, task: Task, turn: int, transcript: Transcript) -> List[Prompt]:
        raise NotImplementedError

    def decide(self, task: Task, turn: int, transcript: Transcript) -> List[str]:
        raise NotImplementedError


class Verifier(Plugin):
    def extract(self, task: Task, text: str) -> Optional[str]:
        raise NotImplementedError

    def score(self, task: Task, responses: List[str]) -> List[Verdict]:
        raise NotImplementedError


class RewardShaper(Plugin):
    def shape(self, task: Task, transcript: Transcript) -> List[Reward]:
        raise NotImplementedError


def parse_settings(cls, document: str) -> SimpleNamespace:
    """`configure`'s JSON as the plugin's settings: its defaults, overridden by the keys the
    document gives; refuses unknown keys and wrong types, naming them."""
    try:
        given = json.loads(document) if document.strip() else {}
    except json.JSONDecodeError as e:
        raise ValueError(f"{cls.NAME}: settings are not JSON: {e}") from None
    if not isinstance(given, dict):
        raise ValueError(f"{cls.NAME}: settings must be a JSON object, not {type(given).__name__}")
    values = dict(cls.SETTINGS)
    for key, value in given.items():
        if key not in cls.SETTINGS:
            known = ", ".join(sorted(cls.SETTINGS)) or "none"
            raise ValueError(f"{cls.NAME}: unknown setting `{key}` (the settings: {known})")
        default = cls.SETTINGS[key]
        if default is not None and value is not None:
            want = type(default)
            ok = (
                isinstance(value, bool)
                if want is bool
                else isinstance(value, (int, float)) and not isinstance(value, bool)
                if want is float
                else isinstance(value, want) and not (want is int and isinstance(value, bool))
            )
            if not ok:
                kinds = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}
                raise ValueError(
                    f"{cls.NAME}: setting `{key}` must be {kinds.get(want, want.__name__)}, "
                    f"got {json.dumps(value)}"
                )
        values[key] = value
    return SimpleNamespace(**values)


def _reason(cls, e: BaseException) -> str:
    """An exception as the world's error: the plugin, the exception and where it was raised
    (the innermost frame: the plugin's line, or the SDK's or the standard library's when it
    was raised there)."""
    if isinstance(e, PluginError):
        return str(e)
    frames = traceback.extract_tb(e.__traceback__)
    where = ""
    if frames:
        f = frames[-1]
        where = f" (at {os.path.basename(f.filename)}:{f.lineno}, in {f.name})"
    return f"{cls.NAME}: {type(e).__name__}: {e}{where}"


class _LogLines:
    """A text stream whose lines go to the plugin log."""

    def __init__(self, level: str):
        self.level, self.pending = level, ""

    def write(self, text: str) -> int:
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            host.log(self.level, line)
        return len(text)

    def flush(self) -> None:
        if self.pending:
            host.log(self.level, self.pending)
            self.pending = ""


if host._IN_COMPONENT:
    sys.stdout = _LogLines(host.INFO)


def _task(t) -> Task:
    return Task(t.id, t.kind, t.question, t.reference, [tuple(f) for f in t.fields])


def _transcript(t) -> Transcript:
    return Transcript(
        t.agents,
        t.turns,
        [Utterance(u.turn, u.agent, u.text, u.answer, u.score, u.correct) for u in t.utterances],
    )


def export(cls):
    """The class componentize-py calls for `cls`'s world; assign it to `Collaboration`,
    `Verification` or `RewardShaping` in the app module."""
    state = {}

    def call(fn):
        try:
            plugin = state.get("plugin")
            if plugin is None:
                raise ValueError("called before `configure`")
            return fn(plugin)
        except BaseException as e:  # noqa: BLE001: every failure is the world's error.
            _raise_err(_reason(cls, e))
        finally:
            if host._IN_COMPONENT:
                sys.stdout.flush()

    def configure(self, settings: str) -> None:
        try:
            state["plugin"] = cls(parse_settings(cls, settings))
        except BaseException as e:  # noqa: BLE001
            _raise_err(_reason(cls, e))

    if issubclass(cls, Protocol):

        class Collaboration:
            def plan_turn(self, task, turn, transcript):
                plan = call(lambda p: p.plan_turn(_task(task), turn, _transcript(transcript)))
                return _wit_plan(cls, plan)

            def decide(self, task, turn, transcript):
                return call(lambda p: [str(a) for a in p.decide(_task(task), turn, _transcript(transcript))])

        Collaboration.configure = configure
        return Collaboration
    if issubclass(cls, Verifier):

        class Verification:
            def extract(self, task, text):
                return call(lambda p: p.extract(_task(task), text))

            def score(self, task, responses):
                verdicts = call(lambda p: p.score(_task(task), list(responses)))
                return _wit_verdicts(cls, verdicts)

        Verification.configure = configure
        return Verification
    if issubclass(cls, RewardShaper):

        class RewardShaping:
            def shape(self, task, transcript):
                rewards = call(lambda p: p.shape(_task(task), _transcript(transcript)))
                return _wit_rewards(cls, rewards)

        RewardShaping.configure = configure
        return RewardShaping
    raise TypeError(f"{cls.__name__} is not a Protocol, Verifier or RewardShaper")


def _raise_err(message: str):
    if host._IN_COMPONENT:
        raise _Err(message)
    raise RuntimeError(message)


def _converted(cls, what: str, convert):
    try:
        return convert()
    except BaseException as e:  # noqa: BLE001
        _raise_err(f"{cls.NAME}: {what} has the wrong shape: {type(e).__name__}: {e}")


def _wit_plan(cls, plan):
    w = _w

    roles = {SYSTEM: w.Role.SYSTEM, USER: w.Role.USER, ASSISTANT: w.Role.ASSISTANT}
    return _converted(
        cls,
        "the plan",
        lambda: [
            w.Prompt(int(p.agent), [w.ChatMessage(roles[m.role], str(m.content)) for m in p.messages])
            for p in plan
        ],
    )


def _wit_verdicts(cls, verdicts):
    w = _w

    return _converted(
        cls,
        "a verdict",
        lambda: [w.Verdict(v.answer, float(v.score), bool(v.correct)) for v in verdicts],
    )


def _wit_rewards(cls, rewards):
    w = _w

    return _converted(
        cls,
        "a reward",
        lambda: [
            w.Reward(int(r.turn), int(r.agent), float(r.total), [(str(n), float(v)) for n, v in r.parts])
            for r in rewards
        ],
    )
