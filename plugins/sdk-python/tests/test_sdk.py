"""The Python SDK natively (no component): settings, errors, rewards, text helpers.

    cd plugins/sdk-python && python3 -m unittest discover -s tests
"""

import os
import tempfile
import unittest

from maporl_plugin import Task, Transcript, Utterance, Verifier, export, parse_settings
from maporl_plugin.answers import last_boxed, parse_integer
from maporl_plugin.build import source_sha256, with_section
from maporl_plugin.reward import f32, reward
from maporl_plugin.text import split_whitespace, trim
from maporl_plugin.transcript import majority, mean_score


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

    def test_a_turns_mean_adds_its_scores_in_order_as_rust_does(self):
        # f32 scores whose in-order f64 sum differs in the last bit from the exactly rounded
        # one (Python's `sum()` from 3.12 on, inside every componentize-py component).
        scores = [3.343334181553359e-13, 0.6113917231559753, 7.232753350232268e-14]
        t = Transcript(3, 1, [Utterance(1, a, "", "1", s) for a, s in enumerate(scores)])
        self.assertEqual(mean_score(t, 1), ((scores[0] + scores[1]) + scores[2]) / 3)
        self.assertEqual(mean_score(t, 1), 0.6113917231563819 / 3)
        self.assertIsNone(mean_score(t, 2))
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


class Source(unittest.TestCase):
    """The source hash a build records: the same for the same files wherever they are, and
    another for any change in what the build reads."""

    def app(self, root, files):
        for rel, text in files.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        return root

    def test_the_same_source_anywhere_gives_the_same_hash_and_any_change_another(self):
        wit = os.path.join(os.path.dirname(__file__), "..", "maporl_plugin", "wit")
        files = {"app.py": "X = 1\n", "lib/helpers.py": "Y = 2\n", "notes.txt": "not read"}
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            h = source_sha256(self.app(a, files), "verifier", wit, "componentize-py 0.25.1")
            self.assertEqual(len(h), 64)
            self.assertEqual(h, source_sha256(self.app(b, files), "verifier", wit, "componentize-py 0.25.1"))
            # Caches and files the build does not read change nothing.
            self.app(b, {"__pycache__/app.cpython-314.pyc": "x", "notes.txt": "other"})
            self.assertEqual(h, source_sha256(b, "verifier", wit, "componentize-py 0.25.1"))
            others = [
                source_sha256(b, "protocol", wit, "componentize-py 0.25.1"),
                source_sha256(b, "verifier", wit, "componentize-py 0.26.0"),
                source_sha256(self.app(b, {"lib/helpers.py": "Y = 3\n"}), "verifier", wit, "componentize-py 0.25.1"),
                source_sha256(self.app(b, {"lib/more.py": ""}), "verifier", wit, "componentize-py 0.25.1"),
            ]
            self.assertEqual(len(set(others + [h])), 5, others)

    def test_the_section_is_appended_with_its_sizes(self):
        out = with_section(b"\0asm\x0d\0\x01\0", "maporl:source", b"a" * 200)
        # id 0, size 214 as two LEB bytes, name length 13, name, contents.
        self.assertEqual(out[8:12], bytes([0, 0xD6, 0x01, 13]))
        self.assertEqual(out[12:25], b"maporl:source")
        self.assertEqual(out[25:], b"a" * 200)


if __name__ == "__main__":
    unittest.main()
