"""The paper's debate protocol in Python: every agent answers every turn, seeing its own
earlier answers and its peers'; the team's answer is the majority vote. The same prompts, to
the byte, as the Rust reference `debate` (tests/python_plugins.rs diffs them).

Settings: `peers` (int or null: show at most this many other agents), `show_scores` (bool),
`early_stop` (bool: an empty plan once every agent gave the same valid answer), `system`
(str or null: a system prompt).

    python3 -m maporl_plugin build app.py --world protocol -o debate.wasm
"""

from maporl_plugin import PluginError, Prompt, Protocol, export
from maporl_plugin.prompts import debate_messages
from maporl_plugin.transcript import at_turn, check, check_turn, find, majority

NAME = "debate-py"


def all_agree(transcript, turn):
    answers = []
    for a in range(transcript.agents):
        u = find(transcript, turn, a)
        answers.append(None if u is None else u.answer)
    return all(a is not None for a in answers) and len(set(answers)) <= 1


class Debate(Protocol):
    NAME = NAME
    SETTINGS = {"peers": None, "show_scores": False, "early_stop": False, "system": None}

    def __init__(self, settings):
        super().__init__(settings)
        peers, system = settings.peers, settings.system
        if peers is not None and (isinstance(peers, bool) or not isinstance(peers, int) or peers < 0):
            raise PluginError(f"{NAME}: peers = {peers!r}: expected a whole number >= 0, or null")
        if system is not None and not isinstance(system, str):
            raise PluginError(f"{NAME}: system = {system!r}: expected a string, or null")

    def plan_turn(self, task, turn, transcript):
        check_turn(NAME, turn)
        check(NAME, transcript)
        s = self.settings
        if turn >= 2 and s.early_stop and all_agree(transcript, turn - 1):
            return []
        participants = list(range(transcript.agents))
        return [
            Prompt(
                agent,
                debate_messages(
                    NAME, task, transcript, agent, turn, participants, s.peers, s.show_scores, s.system
                ),
            )
            for agent in participants
        ]

    def decide(self, task, turn, transcript):
        check_turn(NAME, turn)
        check(NAME, transcript)
        return majority(u.answer for u in at_turn(transcript, turn))


Collaboration = export(Debate)
