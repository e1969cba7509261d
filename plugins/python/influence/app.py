"""The paper's influence-aware reward in Python (Definition 1): an utterance's reward is its
own score and the discounted mean scores of the turns after it,

    R = [V(t, a) + sum_{t' > t} gamma^(t'-t) mean_j V(t', j)] / sum_{t' >= t} gamma^(t'-t),

with the paper's incentives when their coefficients are set. The same rewards as the Rust
reference `influence` for these settings (tests/python_plugins.rs diffs them).

Settings: `gamma` (0.3), `alpha_0`, `alpha_1`, `beta_0`, `beta_1` (0: off).

    python3 -m maporl_plugin build app.py --world reward-shaper -o influence.wasm
"""

from maporl_plugin import PluginError, RewardShaper, export
from maporl_plugin.reward import reward
from maporl_plugin.transcript import at_turn, check, find, last_turn, mean_score

NAME = "influence-py"
COEFFICIENTS = ("alpha_0", "alpha_1", "beta_0", "beta_1")


def influence(transcript, u, last, gamma):
    num, den = float(u.score), 1.0
    for t in range(u.turn + 1, last + 1):
        m = mean_score(transcript, t)
        if m is not None:
            d = gamma ** (t - u.turn)
            num += d * m
            den += d
    return num / den


def incentives(transcript, u, last, c):
    """(alpha-0, alpha-1, beta-0, beta-1) of one utterance, the paper's signs."""
    a0 = a1 = b0 = b1 = 0.0
    if u.turn >= 2:
        prev = find(transcript, u.turn - 1, u.agent)
        others = [o.correct for o in at_turn(transcript, u.turn - 1) if o.agent != u.agent]
        if prev is not None and others:
            others_right = sum(others) / len(others) >= 0.5
            if not prev.correct and u.correct:
                if others_right:
                    a1 = c["alpha_1"]
                else:
                    a0 = c["alpha_0"]
            elif prev.correct and not u.correct:
                if others_right:
                    a0 = -c["alpha_0"]
                else:
                    a1 = -c["alpha_1"]
    if u.turn < last:
        moves = []
        for o in at_turn(transcript, u.turn):
            if o.agent != u.agent:
                nxt = find(transcript, u.turn + 1, o.agent)
                if nxt is not None:
                    moves.append(not o.correct and nxt.correct)
        if moves:
            f = sum(moves) / len(moves)
            if u.correct:
                b1 = c["beta_1"] * f
            else:
                b0 = c["beta_0"] * f
    return [a0, a1, b0, b1]


class Influence(RewardShaper):
    NAME = NAME
    SETTINGS = {"gamma": 0.3, "alpha_0": 0.0, "alpha_1": 0.0, "beta_0": 0.0, "beta_1": 0.0}

    def __init__(self, settings):
        super().__init__(settings)
        if not 0.0 <= settings.gamma <= 1.0:
            raise PluginError(f"{NAME}: gamma = {settings.gamma}: expected a number in [0, 1]")

    def shape(self, task, transcript):
        check(NAME, transcript)
        last = last_turn(transcript)
        if last is None:
            return []
        c = {k: float(getattr(self.settings, k)) for k in COEFFICIENTS}
        on = [k for k in COEFFICIENTS if c[k] != 0.0]
        rewards = []
        for u in transcript.utterances:
            parts = [("influence", influence(transcript, u, last, float(self.settings.gamma)))]
            if on:
                terms = dict(zip(COEFFICIENTS, incentives(transcript, u, last, c)))
                parts += [(k.replace("_", "-"), terms[k]) for k in COEFFICIENTS if k in on]
            rewards.append(reward(u.turn, u.agent, parts))
        return rewards


RewardShaping = export(Influence)
