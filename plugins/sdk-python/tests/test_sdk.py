"""The Python SDK natively (no component): settings, errors, rewards, text helpers.

    cd plugins/sdk-python && python3 -m unittest discover -s tests
"""

import unittest

from maporl_plugin import Task, Transcript, Utterance, Verifier, export, parse_settings
from maporl_plugin.answers import last_boxed, parse_integer
from maporl_plugin.reward import f32, reward
from maporl_plugin.text import split_whitespace, trim
from maporl_plugin.transcript import majority


class Demo(Verifier):
    NAME = "demo"
    SETTINGS = {"strict": False, "gamma": 0.5, "name": "x", "limit": 3, "anything": None}

    def extract(self, task, text):
        return str(1 // int(text))  # ZeroDivisionError on "0"

    def score(self, task, responses):
        return []


class Settings(unittest.TestCase):
    def test_defaults_overrides_and_refusals_by_name(self):
        s = parse_settings(Demo, '{"gamma": 1, "anything": [1]}')
        self.assertEqual((s.strict, s.gamma, s.name, s.limit, s.anything), (False, 1, "x", 3, [1]))
        self.assertEqual(parse_settings(Demo, "").gamma, 0.5)
        for doc, says in [
            ('{"strictt": true}', "unknown setting `strictt` (the settings: anything, gamma, limit, name, strict)"),
            ('{"strict": 1}', "setting `strict` must be true or false, got 1"),
            ('{"limit": true}', "setting `limit` must be a whole number, got true"),
            ('{"limit": 2.5}', "setting `limit` must be a whole number, got 2.5"),
            ('{"gamma": "1"}', 'setting `gamma` must be a number, got "1"'),
            ("[1]", "settings must be a JSON object, not list"),
            ("{", "settings are not JSON"),
        ]:
            with self.assertRaises(ValueError) as e:
                parse_settings(Demo, doc)
            self.assertIn(says, str(e.exception), doc)


class Errors(unittest.TestCase):
    def test_an_unexpected_exception_says_its_type_message_and_line(self):
        glue = export(Demo)()
        glue.configure("{}")
        self.assertEqual(glue.extract(Task("t", "k", "q"), "1"), "1")
        with self.assertRaises(RuntimeError) as e:
            glue.extract(Task("t", "k", "q"), "0")
        said = str(e.exception)
        self.assertIn("demo: ZeroDivisionError: integer division or modulo by zero", said)
        self.assertRegex(said, r"\(at test_sdk\.py:\d+, in extract\)")

    def test_a_call_before_configure_and_a_bad_setting_are_errors(self):
        glue = export(Demo)()
        with self.assertRaises(RuntimeError) as e:
            glue.extract(Task("t", "k", "q"), "1")
        self.assertIn("called before `configure`", str(e.exception))
        with self.assertRaises(RuntimeError) as e:
            glue.configure('{"nope": 1}')
        self.assertIn("demo: unknown setting `nope`", str(e.exception))


class Helpers(unittest.TestCase):
    def test_rewards_round_like_the_host(self):
        r = reward(1, 0, [("a", 0.1), ("b", 0.2)])
        self.assertEqual(r.parts, [("a", f32(0.1)), ("b", f32(0.2))])
        self.assertEqual(r.total, f32(f32(0.1) + f32(0.2)))
        self.assertNotEqual(r.total, 0.1 + 0.2)
        self.assertEqual(str(reward(1, 0, [("z", -0.0)]).total), "-0.0")

    def test_text_has_rusts_whitespace(self):
        self.assertEqual(trim("\x1c a \u2003"), "\x1c a")
        self.assertEqual(split_whitespace("a\x1fb c\u00a0d"), ["a\x1fb", "c", "d"])

    def test_answers_and_votes(self):
        self.assertEqual(last_boxed("\\boxed{1} \\boxed{\\frac{1}{2}} \\boxed{3"), "\\frac{1}{2}")
        self.assertEqual(parse_integer("\u22127"), -7)
        self.assertIsNone(parse_integer("99999999999999999999"))
        self.assertEqual(majority(["7", None, "8", "7"]), ["7"])
        self.assertEqual(majority([None, None, "7"]), [])
        self.assertEqual(majority(["8", "7"]), ["7", "8"])
        t = Transcript(2, 3, [Utterance(1, 0, "x", "7", 1.0, True)])
        self.assertEqual(t.utterances[0].answer, "7")


if __name__ == "__main__":
    unittest.main()
