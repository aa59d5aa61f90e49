"""`minfer serve` with the Llama and Gemma 3 models, driven by the official `openai` client.

Run by tests/server_openai.rs, which passes:
  MINFER_BIN     the minfer binary
  MINFER_SMOLLM2 SmolLM2-135M-Instruct Q4_1 (arch llama, ChatML template)
  MINFER_GEMMA3  Gemma-3-270M Q4_K_M (arch gemma3, no chat template in the file)
  MINFER_DATA    tests/data (llama.cpp's greedy references)
  MINFER_GEMMA_TEMPLATE  a Jinja chat template for Gemma 3 turns

The expected texts are llama.cpp's greedy continuations (tests/data/*.greedy.jsonl).
"""

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import test_openai as base  # noqa: E402  (the Server helper)

DATA = os.environ["MINFER_DATA"]


def records(name):
    with open(os.path.join(DATA, name)) as f:
        return {r["id"]: r for r in map(json.loads, f)}


class SmolLM2(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        base.MODEL = os.environ["MINFER_SMOLLM2"]
        cls.server = base.Server("--ctx", "2048")
        cls.refs = records("smollm2-135m.greedy.jsonl")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_chat_equals_llama_cpp(self):
        c = self.server.client()
        for rid in ["chat_math", "chat_system", "chat_multiturn"]:
            ref = self.refs[rid]
            r = c.chat.completions.create(model="smollm2", messages=ref["messages"], temperature=0, max_tokens=64)
            self.assertEqual(r.choices[0].message.content, ref["generated_text"], rid)
            self.assertEqual(r.usage.prompt_tokens, len(ref["prompt_ids"]), rid)
            self.assertEqual(r.choices[0].finish_reason, "stop", rid)

    def test_completion_of_text_equals_llama_cpp(self):
        c = self.server.client()
        for rid in ["fib", "count"]:
            ref = self.refs[rid]
            r = c.completions.create(model="smollm2", prompt=ref["prompt_text"], temperature=0, max_tokens=64)
            self.assertEqual(r.choices[0].text, ref["generated_text"], rid)
            self.assertEqual(r.usage.prompt_tokens, len(ref["prompt_ids"]), rid)

    def test_stream_equals_non_stream(self):
        c = self.server.client()
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        whole = c.chat.completions.create(model="smollm2", messages=msgs, temperature=0, max_tokens=24)
        parts = c.chat.completions.create(model="smollm2", messages=msgs, temperature=0, max_tokens=24, stream=True)
        text = "".join(ch.choices[0].delta.content or "" for ch in parts if ch.choices)
        self.assertEqual(text, whole.choices[0].message.content)


class Gemma3(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        base.MODEL = os.environ["MINFER_GEMMA3"]
        cls.server = base.Server("--ctx", "2048")
        cls.refs = records("gemma3-270m.greedy.jsonl")

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_completion_of_text_equals_llama_cpp(self):
        c = self.server.client()
        for rid in ["capital", "fib", "unicode_ja"]:
            ref = self.refs[rid]
            r = c.completions.create(model="gemma3", prompt=ref["prompt_text"], temperature=0, max_tokens=64)
            self.assertEqual(r.choices[0].text, ref["generated_text"], rid)
            # BOS is added, as llama.cpp does for this model.
            self.assertEqual(r.usage.prompt_tokens, len(ref["prompt_ids"]), rid)

    def test_long_prompt_past_the_window_equals_llama_cpp(self):
        ref = self.refs["long_700"]
        r = self.server.client().completions.create(model="gemma3", prompt=ref["prompt_ids"], temperature=0, max_tokens=64)
        self.assertEqual(r.choices[0].text, ref["generated_text"])

    def test_chat_without_a_template_is_400(self):
        status, body = self.server.http("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        self.assertEqual(status, 400)
        self.assertIn("this model has no chat template; use --chat-template FILE or a raw prompt", body["error"]["message"])
        self.assertEqual(body["error"]["param"], "messages")

    def test_chat_with_a_template_file(self):
        server = base.Server("--ctx", "1024", "--chat-template", os.environ["MINFER_GEMMA_TEMPLATE"])
        try:
            msgs = [{"role": "user", "content": "Say hello."}]
            r = server.client().chat.completions.create(model="gemma3", messages=msgs, temperature=0, max_tokens=8)
            # BOS + "<start_of_turn>user\nSay hello.<end_of_turn>\n<start_of_turn>model\n"
            _, tok = server.http("POST", "/tokenize", {"content": "<start_of_turn>user\nSay hello.<end_of_turn>\n<start_of_turn>model\n", "add_special": True, "parse_special": True})
            self.assertEqual(r.usage.prompt_tokens, len(tok["tokens"]))
            self.assertEqual(r.usage.completion_tokens, 8)
        finally:
            server.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
