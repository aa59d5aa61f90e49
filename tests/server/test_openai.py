"""`minfer serve` driven by the official `openai` Python client (and raw HTTP where the client
cannot express a request), against real server processes.

Run by tests/server_openai.rs (`cargo test --release`), which passes:
  MINFER_BIN     the minfer binary
  MINFER_MODEL   the Qwen2.5-Coder-0.5B Q4_K_M model
  MINFER_DATA    tests/data (llama.cpp's greedy reference)
  MINFER_REPORT  optional: where the load run writes its figures (JSON)

References are independent of the server: `minfer run` (the CLI's generation loop) and
llama.cpp's greedy continuations in tests/data.
"""

import base64
import concurrent.futures
import http.client
import json
import os
import re
import socket
import statistics
import struct
import subprocess
import tempfile
import threading
import time
import unittest

import ollama
import openai

BIN = os.environ["MINFER_BIN"]
MODEL = os.environ["MINFER_MODEL"]
DATA = os.environ["MINFER_DATA"]
KEY = "sk-minfer-test"
MAGIC = "PLEASE-PANIC-7f3a"  # MINFER_INJECT_PANIC: a prompt containing it panics in inference
THREADS = "2"


class Server:
    """A `minfer serve` process on a free port, stopped by `stop()`."""

    def __init__(self, *args, env=None, key=None):
        cmd = [BIN, "serve", "-m", MODEL, "--port", "0", "-t", THREADS, *args]
        if key:
            cmd += ["--api-key", key]
        self.key = key
        full_env = dict(os.environ, **(env or {}))
        full_env.pop("MINFER_API_KEY", None)
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=full_env, text=True)
        self.log = []
        self.port = None
        got_port = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"listening on http://[^:]+:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    got_port.set()
            got_port.set()

        threading.Thread(target=drain, daemon=True).start()
        if not got_port.wait(30) or self.port is None:
            raise RuntimeError("server did not start: " + "".join(self.log))
        deadline = time.time() + 60
        while time.time() < deadline:
            status, _ = self.http("GET", "/health")
            if status == 200:
                return
            assert status == 503, status
            time.sleep(0.05)
        raise RuntimeError("model did not load: " + "".join(self.log))

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stderr.close()

    def client(self, key="default"):
        return openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.port}/v1",
            api_key=(self.key or "no-key") if key == "default" else key,
            max_retries=0,
            timeout=300,
        )

    def http(self, method, path, body=None, headers=None, timeout=300):
        """Raw request: (status, parsed JSON or text)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = dict(headers or {})
        if self.key and "Authorization" not in h:
            h["Authorization"] = f"Bearer {self.key}"
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
            h["Content-Type"] = "application/json"
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read().decode()
        c.close()
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, data

    def metrics(self):
        _, text = self.http("GET", "/metrics")
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def wait_idle(self, within):
        """Seconds until no slot is busy and nothing is queued; fails after `within`."""
        t0 = time.time()
        while time.time() - t0 < within:
            m = self.metrics()
            if m["minfer_slots_busy"] == 0 and m["minfer_queue_depth"] == 0:
                return time.time() - t0
            time.sleep(0.01)
        raise AssertionError(f"server still busy after {within} s: {self.metrics()}")


def minfer_run(messages, n):
    """`minfer run --messages` greedy: the CLI's answer for the same conversation."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(messages, f)
    try:
        out = subprocess.run(
            [BIN, "run", "-m", MODEL, "--messages", f.name, "--temp", "0", "-n", str(n), "--json", "-t", THREADS],
            capture_output=True, text=True, check=True,
        )
    finally:
        os.unlink(f.name)
    return json.loads(out.stdout)


def reference(record_id):
    with open(os.path.join(DATA, "qwen2.5-0.5b.greedy.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r["id"] == record_id:
                return r
    raise KeyError(record_id)


def user(text):
    return [{"role": "user", "content": text}]


SERVER = None


def setUpModule():
    global SERVER
    SERVER = Server("--slots", "2", "--ctx", "4096", env={"MINFER_INJECT_PANIC": MAGIC}, key=KEY)


def tearDownModule():
    SERVER.stop()


class Chat(unittest.TestCase):
    def test_greedy_equals_minfer_run_and_llama_cpp(self):
        c = SERVER.client()
        for rid in ["chat_math", "chat_system", "chat_multiturn"]:
            ref = reference(rid)
            cli = minfer_run(ref["messages"], 64)
            r = c.chat.completions.create(model="any", messages=ref["messages"], temperature=0, max_tokens=64, logprobs=True)
            choice = r.choices[0]
            self.assertEqual(choice.message.content, cli["text"], rid)
            self.assertEqual(choice.message.content, ref["generated_text"], rid)
            self.assertEqual(r.usage.prompt_tokens, len(cli["prompt_ids"]), rid)
            self.assertEqual(r.usage.prompt_tokens, len(ref["prompt_ids"]), rid)
            self.assertEqual(r.usage.completion_tokens, len(cli["generated_ids"]), rid)
            self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
            self.assertEqual(choice.finish_reason, "stop")
            # Token for token: the logprobs entries are the generated tokens (the final
            # end-of-generation token is not shown).
            shown = cli["generated_ids"][:-1]
            got = [bytes(t.bytes) for t in choice.logprobs.content]
            want = []
            for tid in shown:
                _, d = SERVER.http("POST", "/detokenize", {"tokens": [tid]})
                want.append(d["content"].encode())
            self.assertEqual(got, want, rid)

    def test_greedy_long_answer_equals_minfer_run(self):
        msgs = [{"role": "system", "content": "You are a helpful assistant."}, *user("Explain what a hash map is.")]
        cli = minfer_run(msgs, 48)
        r = SERVER.client().chat.completions.create(model="m", messages=msgs, temperature=0, max_completion_tokens=48)
        self.assertEqual(r.choices[0].message.content, cli["text"])
        self.assertEqual(r.usage.completion_tokens, 48)
        self.assertEqual(r.choices[0].finish_reason, "length")

    def test_stream_text_equals_non_stream_text(self):
        c = SERVER.client()
        msgs = user("Write a haiku about Rust.")
        whole = c.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=40)
        chunks = list(c.chat.completions.create(
            model="m", messages=msgs, temperature=0, max_tokens=40, stream=True, stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        self.assertEqual(text, whole.choices[0].message.content)
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        self.assertEqual(finals, [whole.choices[0].finish_reason])
        # usage only on the last chunk, which has no choices
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, whole.usage.completion_tokens)
        self.assertEqual(chunks[-1].usage.prompt_tokens, whole.usage.prompt_tokens)
        self.assertTrue(all(ch.usage is None for ch in chunks[:-1]))
        # without include_usage: no usage anywhere
        plain = list(c.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=40, stream=True))
        self.assertTrue(all(ch.usage is None for ch in plain))
        self.assertEqual("".join(ch.choices[0].delta.content or "" for ch in plain), text)

    def test_stop_sequences(self):
        c = SERVER.client()
        msgs = user("Count from 1 to 20, separated by commas.")
        full = c.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=60).choices[0].message.content
        self.assertIn("5", full)
        cut = full.index("5")
        for stop in ["5", ["zzz", "5"]]:
            r = c.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=60, stop=stop)
            self.assertEqual(r.choices[0].message.content, full[:cut])
            self.assertEqual(r.choices[0].finish_reason, "stop")
            s = c.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=60, stop=stop, stream=True)
            self.assertEqual("".join(ch.choices[0].delta.content or "" for ch in s if ch.choices), full[:cut])

    def test_seed_reproduces_at_positive_temperature(self):
        c = SERVER.client()
        msgs = user("Invent a name for a cat.")

        def ask(seed):
            return c.chat.completions.create(
                model="m", messages=msgs, temperature=1.0, top_p=1.0, max_tokens=24, seed=seed).choices[0].message.content

        a = [ask(1234) for _ in range(2)]
        self.assertEqual(a[0], a[1])
        others = {ask(s) for s in range(1, 6)}
        self.assertGreater(len(others), 1, "different seeds should give different samples")

    def test_logprobs_are_a_distribution(self):
        r = SERVER.client().chat.completions.create(
            model="m", messages=user("Say yes."), temperature=0, max_tokens=5, logprobs=True, top_logprobs=5)
        for t in r.choices[0].logprobs.content:
            self.assertEqual(len(t.top_logprobs), 5)
            # greedy: the chosen token is the most likely one
            self.assertEqual(t.top_logprobs[0].token, t.token)
            self.assertAlmostEqual(t.top_logprobs[0].logprob, t.logprob, places=5)
            lps = [x.logprob for x in t.top_logprobs]
            self.assertEqual(lps, sorted(lps, reverse=True))
            self.assertLessEqual(sum(2.718281828 ** x for x in lps), 1.0 + 1e-4)

    def test_parallel_requests_over_two_slots_equal_sequential(self):
        c = SERVER.client()
        prompts = [f"Name {k} fruits." for k in range(2, 8)]

        def ask(p):
            r = c.chat.completions.create(model="m", messages=user(p), temperature=0, max_tokens=24)
            return r.choices[0].message.content

        sequential = [ask(p) for p in prompts]
        before = SERVER.metrics()
        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            parallel = list(ex.map(ask, prompts))
        self.assertEqual(parallel, sequential)
        self.assertEqual(SERVER.metrics()["minfer_slots_total"], 2)
        self.assertEqual(SERVER.metrics().get('minfer_requests_total{status="200"}', 0)
                         - before.get('minfer_requests_total{status="200"}', 0), 6)


def answer(srv, prompt, n, cache=True):
    """Greedy completion with the top-5 log-probabilities of every token: (text, token
    log-probs, top log-probs), the floats as the server printed them (shortest round trip of
    the f32, so equal floats are equal bits)."""
    status, r = srv.http("POST", "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                     "logprobs": 5, "cache_prompt": cache})
    assert status == 200, r
    lp = r["choices"][0]["logprobs"]
    return r["choices"][0]["text"], lp["token_logprobs"], lp["top_logprobs"], r["usage"]


LONG = "Here is a list of words to remember: " + ", ".join(f"item{k} apple river stone" for k in range(60)) + ". Now count:"
PROMPTS = [("1, 2, 3,", 24), ("The capital of France is", 20), (LONG, 12), ("def fib(n):", 28)]


class Batched(unittest.TestCase):
    """--batch on with 4 slots: every sequence's tokens and log-probabilities are the same
    floats as the prompt sent alone to a 1-slot server, with prompts prefilled in chunks
    (--ubatch 32) beside other sequences' decode steps, and with the prompt cache missed and
    hit."""

    @classmethod
    def setUpClass(cls):
        alone = Server("--slots", "1", "--batch", "off", "--ubatch", "32")
        try:
            cls.alone = [answer(alone, p, n, cache=False)[:3] for p, n in PROMPTS]
        finally:
            alone.stop()
        cls.srv = Server("--slots", "4", "--batch", "on", "--ubatch", "32", "--ctx", "8192",
                         env={"MINFER_INJECT_PANIC": MAGIC})

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def parallel(self, items, delay=0.0):
        def go(k):
            time.sleep(delay * k)
            p, n = items[k]
            return answer(self.srv, p, n)
        with concurrent.futures.ThreadPoolExecutor(len(items)) as ex:
            return list(ex.map(go, range(len(items))))

    def test_4_parallel_equal_alone_with_cache_missed_and_hit(self):
        self.srv.wait_idle(30)
        before = self.srv.metrics()
        first = self.parallel(PROMPTS)
        for k, got in enumerate(first):
            self.assertEqual(got[:3], self.alone[k], f"prompt {k}, batched, cache cold")
        # The same prompts again: each finds a slot holding all but its last token.
        second = self.parallel(PROMPTS)
        for k, got in enumerate(second):
            self.assertEqual(got[:3], self.alone[k], f"prompt {k}, batched, cache hit")
            self.assertEqual(got[3]["prompt_tokens_details"]["cached_tokens"], got[3]["prompt_tokens"] - 1)
        after = self.srv.metrics()
        cached = sum(g[3]["prompt_tokens_details"]["cached_tokens"] for g in first + second)
        self.assertEqual(after["minfer_prompt_cached_tokens_total"] - before["minfer_prompt_cached_tokens_total"], cached)
        prompt = sum(g[3]["prompt_tokens"] for g in first + second)
        self.assertEqual(after["minfer_prompt_tokens_total"] - before["minfer_prompt_tokens_total"], prompt - cached)

    def test_long_prefill_joins_sequences_that_are_decoding(self):
        self.srv.wait_idle(30)
        # Short prompts start first and decode while the long one is prefilled in chunks of 32.
        order = [0, 1, 3, 2]
        got = self.parallel([PROMPTS[k] for k in order], delay=0.15)
        for k, g in zip(order, got):
            self.assertEqual(g[:3], self.alone[k], f"prompt {k}, joining mid-flight")

    def test_panic_and_disconnect_in_a_batch_leave_the_others_unchanged(self):
        self.srv.wait_idle(30)
        before = self.srv.metrics()
        sock = socket.create_connection(("127.0.0.1", self.srv.port))
        body = json.dumps({"prompt": "Write a very long story about a dragon.", "max_tokens": 400, "temperature": 0})
        sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n{body}").encode())

        def panicking():
            time.sleep(0.3)
            return self.srv.http("POST", "/v1/completions", {"prompt": f"{MAGIC} go", "max_tokens": 8})

        def leave():
            time.sleep(1.0)
            sock.close()

        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            bad = ex.submit(panicking)
            ex.submit(leave)
            good = [ex.submit(answer, self.srv, p, n) for p, n in (PROMPTS[0], PROMPTS[3])]
            self.assertEqual(bad.result()[0], 500)
            self.assertEqual(good[0].result()[:3], self.alone[0])
            self.assertEqual(good[1].result()[:3], self.alone[3])
        self.srv.wait_idle(30)
        after = self.srv.metrics()
        self.assertEqual(after["minfer_panics_total"] - before["minfer_panics_total"], 1)
        self.assertEqual(after["minfer_cancelled_total"] - before["minfer_cancelled_total"], 1)
        self.assertEqual(answer(self.srv, *PROMPTS[1])[:3], self.alone[1], "the server answers as before")

    def test_timeout_in_a_batch_leaves_the_other_unchanged(self):
        srv = Server("--slots", "2", "--batch", "on", "--timeout", "5")
        try:
            alone = answer(srv, "1, 2, 3,", 8, cache=False)[:3]
            with concurrent.futures.ThreadPoolExecutor(2) as ex:
                long = ex.submit(srv.http, "POST", "/v1/completions",
                                 {"prompt": "Write a very long story about a dragon.", "max_tokens": 2000, "temperature": 0})
                time.sleep(0.3)
                short = ex.submit(answer, srv, "1, 2, 3,", 8, False)
                self.assertEqual(short.result()[:3], alone, "the sequence beside a timed-out one")
                self.assertEqual(long.result()[0], 504)
            self.assertEqual(srv.metrics()["minfer_timeouts_total"], 1)
        finally:
            srv.stop()

    def test_three_turn_chat_prefills_only_each_new_turn(self):
        self.srv.wait_idle(30)
        c = self.srv.client()
        turns = ["Name a color.", "Now name a fruit of that color.", "And an animal?"]

        def converse(cache):
            msgs, out = [], []
            for t in turns:
                msgs.append({"role": "user", "content": t})
                before = self.srv.metrics()["minfer_prompt_tokens_total"]
                r = c.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=24,
                                              extra_body={"cache_prompt": cache})
                evaluated = self.srv.metrics()["minfer_prompt_tokens_total"] - before
                msgs.append({"role": "assistant", "content": r.choices[0].message.content})
                out.append((r.choices[0].message.content, r.usage.prompt_tokens,
                            r.usage.prompt_tokens_details.cached_tokens, evaluated))
            return out

        cold = converse(False)
        warm = converse(True)
        self.assertEqual([w[0] for w in warm], [c_[0] for c_ in cold], "answers are the same with and without the cache")
        self.assertEqual([c_[2] for c_ in cold], [0, 0, 0])
        for k in (1, 2):
            text, prompt, cached, evaluated = warm[k]
            # the whole previous turn (its prompt and answer) comes from the slot's KV
            self.assertGreaterEqual(cached, warm[k - 1][1], f"turn {k + 1}")
            self.assertEqual(evaluated, prompt - cached, f"turn {k + 1}: only the new turn is evaluated")


class Completions(unittest.TestCase):
    def test_token_id_prompt_equals_llama_cpp(self):
        # "count": every step's top-1/top-2 margin is >= 1.19, so the whole continuation must match.
        ref = reference("count")
        c = SERVER.client()
        r = c.completions.create(model="m", prompt=ref["prompt_ids"], temperature=0, max_tokens=64)
        self.assertEqual(r.choices[0].text, ref["generated_text"])
        self.assertEqual(r.usage.prompt_tokens, len(ref["prompt_ids"]))
        self.assertEqual(r.usage.completion_tokens, 64)
        self.assertEqual(r.choices[0].finish_reason, "length")
        # the same prompt as text, streamed
        s = c.completions.create(model="m", prompt=ref["prompt_text"], temperature=0, max_tokens=64, stream=True)
        self.assertEqual("".join(ch.choices[0].text for ch in s if ch.choices), ref["generated_text"])

    def test_echo_and_legacy_logprobs(self):
        c = SERVER.client()
        r = c.completions.create(model="m", prompt="def add(a, b):", temperature=0, max_tokens=8, echo=True)
        plain = c.completions.create(model="m", prompt="def add(a, b):", temperature=0, max_tokens=8)
        self.assertEqual(r.choices[0].text, "def add(a, b):" + plain.choices[0].text)
        lp = c.completions.create(model="m", prompt="def add(a, b):", temperature=0, max_tokens=8, logprobs=3).choices[0]
        self.assertEqual("".join(lp.logprobs.tokens), lp.text)
        self.assertEqual(len(lp.logprobs.top_logprobs), len(lp.logprobs.tokens))
        self.assertEqual(lp.logprobs.text_offset[0], 0)

    def test_invalid_token_ids_are_400(self):
        with self.assertRaises(openai.BadRequestError) as e:
            SERVER.client().completions.create(model="m", prompt=[1, 2, 10**9], max_tokens=4)
        self.assertEqual(e.exception.body["param"], "prompt[2]")


class Endpoints(unittest.TestCase):
    def test_models_health_tokenize(self):
        models = SERVER.client().models.list().data
        self.assertEqual([m.id for m in models], ["qwen2.5-coder-0.5b-instruct-q4_k_m"])
        self.assertEqual(SERVER.http("GET", "/health"), (200, {"status": "ok"}))
        ref = reference("capital")
        status, v = SERVER.http("POST", "/tokenize", {"content": ref["prompt_text"]})
        self.assertEqual((status, v["tokens"]), (200, ref["prompt_ids"]))
        status, v = SERVER.http("POST", "/detokenize", {"tokens": ref["generated_ids"]})
        self.assertEqual((status, v["content"]), (200, ref["generated_text"]))


class Choices(unittest.TestCase):
    def test_n_choices_are_the_single_answers_of_their_seeds(self):
        """`n=2`: choice i is what a single request with seed + i answers (greedy: the same)."""
        c = SERVER.client()
        msgs = user("Invent a name for a dog.")
        one = lambda seed, t: c.chat.completions.create(model="m", messages=msgs, temperature=t, max_tokens=12, seed=seed)
        r = c.chat.completions.create(model="m", messages=msgs, temperature=1.0, max_tokens=12, seed=77, n=2)
        self.assertEqual([ch.index for ch in r.choices], [0, 1])
        for i, ch in enumerate(r.choices):
            single = one(77 + i, 1.0)
            self.assertEqual(ch.message.content, single.choices[0].message.content, i)
            self.assertEqual(ch.finish_reason, single.choices[0].finish_reason)
        self.assertEqual(r.usage.prompt_tokens, single.usage.prompt_tokens)
        self.assertEqual(r.usage.completion_tokens, sum(one(77 + i, 1.0).usage.completion_tokens for i in range(2)))
        g = c.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=12, n=2)
        self.assertEqual(g.choices[0].message.content, g.choices[1].message.content)
        self.assertEqual(g.choices[0].message.content, one(1, 0).choices[0].message.content)


class Responses(unittest.TestCase):
    """The Responses API through the official client, against the chat endpoint's answers (the
    same conversation, greedy), which the Chat tests hold to llama.cpp's."""

    def chat(self, messages, n):
        r = SERVER.client().chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=n)
        return r.choices[0].message.content, r.choices[0].finish_reason

    def test_create_and_stream_equal_chat(self):
        c = SERVER.client()
        want, why = self.chat([{"role": "system", "content": "Answer in one word."}, *user("What color is the sky?")], 16)
        r = c.responses.create(model="m", instructions="Answer in one word.", input="What color is the sky?", max_output_tokens=16, temperature=0)
        self.assertTrue(r.id.startswith("resp_"))
        self.assertEqual(r.output[0].type, "message")
        self.assertEqual(r.output_text, want)
        self.assertEqual(r.status, "completed" if why == "stop" else "incomplete")
        self.assertGreater(r.usage.input_tokens, 0)
        self.assertGreater(r.usage.output_tokens, 0)
        events = list(c.responses.create(model="m", instructions="Answer in one word.", input="What color is the sky?",
                                          max_output_tokens=16, temperature=0, stream=True))
        kinds = [e.type for e in events]
        self.assertEqual(kinds[:4], ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"])
        self.assertIn(kinds[-1], ["response.completed", "response.incomplete"])
        self.assertEqual(kinds[-4:-1], ["response.output_text.done", "response.content_part.done", "response.output_item.done"])
        self.assertEqual("".join(e.delta for e in events if e.type == "response.output_text.delta"), want)
        self.assertEqual(events[-1].response.output_text, want)
        self.assertEqual([e.sequence_number for e in events], list(range(len(events))))

    def test_previous_response_id_continues_the_conversation(self):
        c = SERVER.client()
        first = c.responses.create(model="m", input="My name is Ada. Say hi.", max_output_tokens=12, temperature=0)
        second = c.responses.create(model="m", input="What is my name?", previous_response_id=first.id, max_output_tokens=12, temperature=0)
        want, _ = self.chat([*user("My name is Ada. Say hi."), {"role": "assistant", "content": first.output_text}, *user("What is my name?")], 12)
        self.assertEqual(second.output_text, want)
        self.assertEqual(second.previous_response_id, first.id)
        with self.assertRaises(openai.BadRequestError):
            c.responses.create(model="m", input="x", previous_response_id="resp_unknown")
        with self.assertRaises(openai.BadRequestError):
            c.responses.create(model="m", input="x", tools=[{"type": "function", "name": "f", "parameters": {}}])


class Ollama(unittest.TestCase):
    """Ollama's API through the official `ollama` client, against the OpenAI endpoints' answers
    (greedy, the same conversation or prompt)."""

    def client(self):
        return ollama.Client(host=f"http://127.0.0.1:{SERVER.port}", headers={"Authorization": f"Bearer {KEY}"})

    def test_chat_generate_stream_list_show(self):
        o, c = self.client(), SERVER.client()
        msgs = user("Name three primary colors.")
        want = c.chat.completions.create(model="m", messages=msgs, temperature=0, max_tokens=20)
        r = o.chat(model="minfer", messages=msgs, stream=False, options={"temperature": 0, "num_predict": 20})
        self.assertEqual(r.message.role, "assistant")
        self.assertEqual(r.message.content, want.choices[0].message.content)
        self.assertTrue(r.done)
        self.assertEqual(r.done_reason, "stop" if want.choices[0].finish_reason == "stop" else "length")
        self.assertEqual(r.eval_count, want.usage.completion_tokens)
        self.assertEqual(r.prompt_eval_count, want.usage.prompt_tokens)
        parts = list(o.chat(model="minfer", messages=msgs, stream=True, options={"temperature": 0, "num_predict": 20}))
        self.assertEqual("".join(p.message.content for p in parts), r.message.content)
        self.assertTrue(parts[-1].done and not any(p.done for p in parts[:-1]))
        g = o.generate(model="minfer", prompt="Name three primary colors.", options={"temperature": 0, "num_predict": 20})
        self.assertEqual(g.response, want.choices[0].message.content)
        raw = o.generate(model="minfer", prompt="def fibonacci(n):", raw=True, options={"temperature": 0, "num_predict": 16})
        plain = c.completions.create(model="m", prompt="def fibonacci(n):", temperature=0, max_tokens=16)
        self.assertEqual(raw.response, plain.choices[0].text)
        models = o.list().models
        self.assertEqual(len(models), 1)
        self.assertEqual(models[0].model, SERVER.client().models.list().data[0].id)
        self.assertEqual(models[0].details.format, "gguf")
        info = o.show(models[0].model)
        self.assertEqual(info.details.family, "qwen2")
        self.assertIn("im_start", info.template)
        self.assertEqual(len(o.ps().models), 1)

    def test_format_json_and_refusals(self):
        o = self.client()
        r = o.chat(model="m", messages=user("Give a JSON object with a name."), format="json", options={"temperature": 0, "num_predict": 60})
        self.assertIsInstance(json.loads(r.message.content), dict)
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
        r = o.generate(model="m", prompt="Pick a number.", format=schema, options={"temperature": 0, "num_predict": 30})
        self.assertIsInstance(json.loads(r.response)["n"], int)
        for bad in [dict(options={"mirostat": 1}), dict(options={"num_ctx": 10**9}), dict(think=True)]:
            with self.assertRaises(ollama.ResponseError) as e:
                o.chat(model="m", messages=user("hi"), **bad)
            self.assertEqual(e.exception.status_code, 400, bad)


class Embeddings(unittest.TestCase):
    """Embeddings through the official clients and llama-server's native route, against llama.cpp's
    own final hidden states (tests/data/qwen2.5-0.5b.embeddings.json, one token per decode:
    scripts/make_embedding_reference.sh). The model has no pooling of its own, so the server
    pools the last token's state; OpenAI's and Ollama's /api/embed vectors have unit length."""

    TOL = 1e-6  # of the vector's largest magnitude (measured: ~6e-8, the file's 8 digits)

    @classmethod
    def setUpClass(cls):
        with open(os.path.join(DATA, "qwen2.5-0.5b.embeddings.json")) as f:
            cls.cases = json.load(f)["cases"]

    def close(self, got, want, what):
        self.assertEqual(len(got), len(want), what)
        scale = max(abs(x) for x in want)
        worst = max(abs(a - b) for a, b in zip(got, want)) / scale
        self.assertLessEqual(worst, self.TOL, what)

    @staticmethod
    def unit(v):
        n = sum(x * x for x in v) ** 0.5
        return [x / n for x in v]

    def test_openai_client_float_and_base64_equal_llama_cpp(self):
        c = SERVER.client()
        texts = [case["text"] for case in self.cases]
        before = SERVER.metrics()["minfer_prompt_tokens_total"]
        # Unless told, the client asks for base64 and decodes it; told base64, it leaves the text.
        for fmt in [None, "float", "base64"]:
            r = c.embeddings.create(model="m", input=texts, **({"encoding_format": fmt} if fmt else {}))
            self.assertEqual([d.index for d in r.data], list(range(len(texts))))
            for d, case in zip(r.data, self.cases):
                v = d.embedding
                if fmt == "base64":
                    raw = base64.b64decode(v)
                    v = list(struct.unpack(f"<{len(raw) // 4}f", raw))
                self.close(v, self.unit(case["last"]), f"{fmt} {case['text']!r}")
            self.assertEqual(r.usage.prompt_tokens, sum(len(case["tokens"]) for case in self.cases))
        self.assertEqual(SERVER.metrics()["minfer_prompt_tokens_total"] - before, 3 * r.usage.prompt_tokens)
        ids = c.embeddings.create(model="m", input=[self.cases[1]["tokens"]], encoding_format="float")
        self.close(ids.data[0].embedding, self.unit(self.cases[1]["last"]), "token ids")

    def test_native_route_gives_raw_states(self):
        case = self.cases[3]
        status, body = SERVER.http("POST", "/embedding", {"content": case["text"], "embd_normalize": -1})
        self.assertEqual(status, 200, body)
        self.assertEqual(body[0]["index"], 0)
        self.close(body[0]["embedding"][0], case["last"], "native raw")

    def test_ollama_embed_and_embeddings(self):
        o = ollama.Client(host=f"http://127.0.0.1:{SERVER.port}", headers={"Authorization": f"Bearer {KEY}"})
        r = o.embed(model="m", input=[self.cases[0]["text"], self.cases[1]["text"]])
        self.assertEqual(len(r.embeddings), 2)
        for got, case in zip(r.embeddings, self.cases):
            self.close(got, self.unit(case["last"]), f"ollama embed {case['text']!r}")
        self.assertEqual(r.prompt_eval_count, len(self.cases[0]["tokens"]) + len(self.cases[1]["tokens"]))
        legacy = o.embeddings(model="m", prompt=self.cases[2]["text"])
        self.close(legacy.embedding, self.cases[2]["last"], "ollama embeddings (raw)")

    def test_bad_embedding_requests_are_400(self):
        for body, param in [({"input": ""}, "input"), ({"input": []}, "input"), ({"input": "x", "dimensions": 3}, "dimensions"),
                            ({"input": "x", "encoding_format": "hex"}, "encoding_format"), ({"input": [10**9]}, "input[0]"),
                            ({"input": "x", "pooling": "mean"}, "pooling"), ({}, "input")]:
            status, r = SERVER.http("POST", "/v1/embeddings", body)
            self.assertEqual(status, 400, body)
            self.assertEqual(r["error"]["param"], param, body)

    def test_pooling_flag(self):
        server = Server("--slots", "1", "--ctx", "512", "--pooling", "mean", key=KEY)
        try:
            case = self.cases[1]
            _, body = server.http("POST", "/embedding", {"content": case["text"], "embd_normalize": -1})
            self.close(body[0]["embedding"][0], case["mean"], "mean")
        finally:
            server.stop()
        server = Server("--slots", "1", "--ctx", "512", "--pooling", "none", key=KEY)
        try:
            case = self.cases[1]
            _, body = server.http("POST", "/embedding", {"content": case["text"]})
            rows = body[0]["embedding"]
            self.assertEqual(len(rows), len(case["none"]))
            for i, (got, want) in enumerate(zip(rows, case["none"])):
                self.close(got, want, f"none row {i}")
            status, r = server.http("POST", "/v1/embeddings", {"input": case["text"]})
            self.assertEqual(status, 400)
            self.assertIn("none", r["error"]["message"])
        finally:
            server.stop()


class Slots(unittest.TestCase):
    """llama-server's slot actions: a slot's KV saved to a file, erased, restored into another
    slot; the restored prefix is reused (cached_tokens) and the answer equals one computed
    without any cache."""

    def test_save_erase_restore(self):
        with tempfile.TemporaryDirectory() as d:
            server = Server("--slots", "2", "--ctx", "1024", "--slot-save-path", d, key=KEY)
            try:
                prompt = "Write a haiku about the sea."
                body = {"prompt": prompt, "n_predict": 12, "temperature": 0, "id_slot": 1}
                status, first = server.http("POST", "/completion", body)
                self.assertEqual(status, 200, first)
                status, saved = server.http("POST", "/slots/1?action=save", {"filename": "sea.bin"})
                self.assertEqual(status, 200, saved)
                self.assertEqual((saved["id_slot"], saved["filename"]), (1, "sea.bin"))
                self.assertEqual(saved["n_written"], os.path.getsize(os.path.join(d, "sea.bin")))
                self.assertGreater(saved["n_saved"], first["tokens_evaluated"])
                status, erased = server.http("POST", "/slots/1?action=erase", {})
                self.assertEqual((status, erased["n_erased"]), (200, saved["n_saved"]), erased)
                status, restored = server.http("POST", "/slots/0?action=restore", {"filename": "sea.bin"})
                self.assertEqual(status, 200, restored)
                self.assertEqual(restored["n_restored"], saved["n_saved"])
                c = server.client()
                cached = c.completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0, extra_body={"id_slot": 0})
                self.assertEqual(cached.usage.prompt_tokens_details.cached_tokens, cached.usage.prompt_tokens - 1)
                fresh = c.completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0, extra_body={"cache_prompt": False})
                self.assertEqual(cached.choices[0].text, fresh.choices[0].text)
                self.assertEqual(cached.choices[0].text, first["content"])
                # A damaged file is refused and the slot keeps what it had.
                with open(os.path.join(d, "sea.bin"), "r+b") as f:
                    f.seek(100)
                    b = f.read(1)
                    f.seek(100)
                    f.write(bytes([b[0] ^ 1]))
                status, r = server.http("POST", "/slots/0?action=restore", {"filename": "sea.bin"})
                self.assertEqual((status, r["error"]["param"]), (400, "filename"), r)
                self.assertIn("checksum", r["error"]["message"])
                again = c.completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0, extra_body={"id_slot": 0})
                self.assertEqual(again.usage.prompt_tokens_details.cached_tokens, cached.usage.prompt_tokens - 1)
                self.assertEqual(again.choices[0].text, first["content"])
                for path, body, param in [("/slots/0?action=save", {"filename": "../escape.bin"}, "filename"),
                                          ("/slots/0?action=save", {"filename": "a/b"}, "filename"),
                                          ("/slots/0?action=restore", {"filename": "missing.bin"}, "filename"),
                                          ("/slots/0?action=save", {}, "filename"),
                                          ("/slots/0?action=fly", {}, "action"),
                                          ("/slots/9?action=erase", {}, "id_slot")]:
                    status, r = server.http("POST", path, body)
                    self.assertEqual((status, r["error"]["param"]), (400, param), (path, body, r))
                self.assertEqual(sorted(os.listdir(d)), ["sea.bin"])
            finally:
                server.stop()
        status, r = SERVER.http("POST", "/slots/0?action=erase", {})
        self.assertEqual(status, 501, r)


class Errors(unittest.TestCase):
    def check(self, status_body, status, kind, param=None):
        got_status, body = status_body
        self.assertEqual(got_status, status, body)
        self.assertEqual(body["error"]["type"], kind, body)
        self.assertEqual(set(body["error"]) >= {"message", "type", "param", "code"}, True)
        if param is not None:
            self.assertEqual(body["error"]["param"], param, body)
        return body["error"]

    def test_bad_requests_name_the_parameter(self):
        msgs = user("hi")
        post = lambda body: SERVER.http("POST", "/v1/chat/completions", body)
        self.check(SERVER.http("POST", "/v1/chat/completions", "{not json"), 400, "invalid_request_error")
        self.check(post({"messages": msgs, "temperature": "warm"}), 400, "invalid_request_error", "temperature")
        self.check(post({"messages": msgs, "temperature": 7}), 400, "invalid_request_error", "temperature")
        self.check(post({"messages": msgs, "top_p": -1}), 400, "invalid_request_error", "top_p")
        self.check(post({"messages": msgs, "max_tokens": "ten"}), 400, "invalid_request_error", "max_tokens")
        self.check(post({"messages": "hi"}), 400, "invalid_request_error", "messages")
        self.check(post({}), 400, "invalid_request_error", "messages")
        err = self.check(post({"messages": msgs, "n": 17}), 400, "invalid_request_error", "n")
        self.assertIn("16", err["message"])
        self.check(post({"messages": msgs, "n": 2, "stream": True}), 400, "invalid_request_error", "n")
        self.check(post({"messages": msgs, "stop": 5}), 400, "invalid_request_error", "stop")

    def test_prompt_longer_than_the_slot_is_400_even_for_streams(self):
        long = "hello " * 2500  # > 2048 tokens, the context of one of the two slots
        for stream in [False, True]:
            status, body = SERVER.http("POST", "/v1/chat/completions",
                                       {"messages": user(long), "stream": stream})
            err = self.check((status, body), 400, "exceed_context_size_error")
            self.assertEqual(err["n_ctx"], 2048)
            self.assertGreater(err["n_prompt_tokens"], 2048)
        with self.assertRaises(openai.BadRequestError):
            list(SERVER.client().chat.completions.create(model="m", messages=user(long), stream=True))

    def test_api_key(self):
        with self.assertRaises(openai.AuthenticationError):
            SERVER.client(key="wrong").models.list()
        status, body = SERVER.http("GET", "/v1/models", headers={"Authorization": "Bearer nope"})
        self.check((status, body), 401, "authentication_error")
        c = http.client.HTTPConnection("127.0.0.1", SERVER.port)
        c.request("GET", "/v1/models")  # no header at all
        self.assertEqual(c.getresponse().status, 401)
        c.close()
        # llama-server's and Anthropic's header carries the key too
        for key, status in [(KEY, 200), ("nope", 401)]:
            c = http.client.HTTPConnection("127.0.0.1", SERVER.port)
            c.request("GET", "/v1/models", headers={"X-Api-Key": key})
            self.assertEqual(c.getresponse().status, status, key)
            c.close()
        # the scheme is case-insensitive (RFC 7235)
        self.assertEqual(SERVER.http("GET", "/v1/models", headers={"Authorization": f"bearer {KEY}"})[0], 200)
        # probes stay open
        self.assertEqual(SERVER.http("GET", "/health", headers={"Authorization": "x"})[0], 200)

    def test_unknown_route_is_404(self):
        self.check(SERVER.http("GET", "/v1/nope"), 404, "not_found_error")
        self.check(SERVER.http("POST", "/v2/chat/completions", {}), 404, "not_found_error")

    def test_errors_never_echo_unbounded_input(self):
        big = "A" * 100_000
        cases = [
            ("/v1/chat/completions", {"messages": user("x"), "temperature": big}),
            ("/v1/chat/completions", {"messages": [{"role": big, "content": "x"}]}),
            ("/v1/chat/completions", {"messages": user("x"), big: 1, "stop": [big, 3]}),
            ("/v1/completions", {"prompt": [1, big]}),
            ("/v1/" + big[:4000], {}),
            ("/v1/chat/completions", '{"messages": "' + big),
        ]
        for path, body in cases:
            status, resp = SERVER.http("POST", path, body)
            self.assertIn(status, (400, 404))
            self.assertLess(len(json.dumps(resp)), 600, json.dumps(resp)[:300])
        status, resp = SERVER.http("X" * 20_000, "/nope")
        self.assertEqual(status, 404)
        self.assertLess(len(json.dumps(resp)), 600, json.dumps(resp)[:300])

    def test_panic_is_500_and_the_server_stays_usable(self):
        before = SERVER.metrics()["minfer_panics_total"]
        c = SERVER.client()
        with self.assertRaises(openai.InternalServerError) as e:
            c.chat.completions.create(model="m", messages=user(f"{MAGIC} now"), max_tokens=4)
        self.assertEqual(e.exception.status_code, 500)
        # both slots still answer (three requests in parallel use both)
        with concurrent.futures.ThreadPoolExecutor(3) as ex:
            answers = list(ex.map(lambda i: c.chat.completions.create(
                model="m", messages=user("What is 12 * 7? Answer with the number only."), temperature=0,
                max_tokens=8).choices[0].message.content, range(3)))
        self.assertEqual(answers, ["84"] * 3)
        self.assertEqual(SERVER.metrics()["minfer_panics_total"], before + 1)
        # a panic in a stream before its first token is also a 500
        with self.assertRaises(openai.InternalServerError):
            list(c.chat.completions.create(model="m", messages=user(MAGIC), max_tokens=4, stream=True))
        SERVER.wait_idle(5)


class Disconnect(unittest.TestCase):
    """A client that goes away frees its slot within one decode step: counted in tokens
    generated after the close, not in seconds, so a slow machine does not matter."""

    def check_freed(self, close, before):
        m = SERVER.metrics()
        close()
        waited = SERVER.wait_idle(30)
        after = SERVER.metrics()
        self.assertEqual(after["minfer_cancelled_total"], before + 1)
        # the step that may finish between the metrics read and the close, the step in flight
        # when the client left, and (streams) the one whose frame found the socket closed
        extra = after["minfer_generated_tokens_total"] - m["minfer_generated_tokens_total"]
        self.assertLessEqual(extra, 3)
        return waited, extra

    def test_stream_disconnect_frees_the_slot(self):
        SERVER.wait_idle(30)
        before = SERVER.metrics()["minfer_cancelled_total"]
        s = SERVER.client().chat.completions.create(
            model="m", messages=user("Write a very long story about a dragon."), temperature=0, max_tokens=2000, stream=True)
        for i, _ in enumerate(s):
            if i == 3:
                break
        self.assertEqual(SERVER.metrics()["minfer_slots_busy"], 1)
        waited, extra = self.check_freed(s.close, before)
        print(f"\nstream disconnect: slot free after {waited * 1000:.0f} ms, {extra:.0f} tokens after the close")

    def test_non_stream_disconnect_frees_the_slot(self):
        SERVER.wait_idle(30)
        before = SERVER.metrics()["minfer_cancelled_total"]
        sock = socket.create_connection(("127.0.0.1", SERVER.port))
        body = json.dumps({"messages": user("Write a very long story about a dragon."), "temperature": 0, "max_tokens": 2000})
        sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
        t0 = time.time()
        generated = SERVER.metrics()["minfer_generated_tokens_total"]
        # wait until it is decoding (past the prompt), a few tokens in
        while SERVER.metrics()["minfer_generated_tokens_total"] < generated + 3:
            self.assertLess(time.time() - t0, 60)
            time.sleep(0.01)
        waited, extra = self.check_freed(sock.close, before)
        print(f"\nnon-stream disconnect: slot free after {waited * 1000:.0f} ms, {extra:.0f} tokens after the close")


class Limits(unittest.TestCase):
    def test_queue_full_is_503_and_timeout_is_504(self):
        srv = Server("--slots", "1", "--queue", "1", "--timeout", "8")
        try:
            c = srv.client()
            long = user("Write a very long story about a dragon.")
            held = c.chat.completions.create(model="m", messages=long, temperature=0, max_tokens=2000, stream=True)
            next(iter(held))  # generating in the only slot
            queued = threading.Thread(target=lambda: srv.http("POST", "/v1/chat/completions",
                                                              {"messages": long, "max_tokens": 2000}))
            queued.start()
            t0 = time.time()
            while srv.metrics()["minfer_queue_depth"] != 1:
                self.assertLess(time.time() - t0, 10)
                time.sleep(0.01)
            status, body = srv.http("POST", "/v1/chat/completions", {"messages": user("hi")})
            self.assertEqual(status, 503)
            self.assertEqual(body["error"]["type"], "unavailable_error")
            with self.assertRaises(openai.APIStatusError) as e:
                c.completions.create(model="m", prompt="hi")
            self.assertEqual(e.exception.status_code, 503)
            # --timeout 8: the held stream ends with an error event, the queued request with a 504
            with self.assertRaises(openai.APIError):
                for _ in held:
                    pass
            queued.join(20)
            self.assertEqual(srv.metrics()["minfer_timeouts_total"], 2)
            self.assertGreaterEqual(srv.metrics()['minfer_requests_total{status="504"}'], 1)
            srv.wait_idle(2)
            r = c.chat.completions.create(model="m", messages=user("What is 12 * 7? Answer with the number only."),
                                          temperature=0, max_tokens=8)
            self.assertEqual(r.choices[0].message.content, "84")
        finally:
            srv.stop()


class Load(unittest.TestCase):
    def test_load_60_requests_from_4_clients(self):
        before = SERVER.metrics()
        n_requests, n_clients = 60, 4
        topics = ["cats", "rivers", "compilers", "tea", "mountains", "trains", "bees", "rain", "maps", "clocks"]
        results, errors = [], []
        lock = threading.Lock()

        def client_loop(k):
            c = SERVER.client()
            for i in range(k, n_requests, n_clients):
                t0 = time.time()
                try:
                    if i % 3 == 2:
                        r = c.completions.create(model="m", prompt=f"A fact about {topics[i % 10]}:", max_tokens=16,
                                                 temperature=0.7, seed=i)
                    else:
                        r = c.chat.completions.create(model="m", messages=user(f"One sentence about {topics[i % 10]}."),
                                                      max_tokens=16, temperature=0.7, seed=i)
                    with lock:
                        results.append((i, time.time() - t0, r.usage.prompt_tokens, r.usage.completion_tokens))
                except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                    with lock:
                        errors.append((i, repr(e)))

        t0 = time.time()
        threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(n_clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - t0
        after = SERVER.metrics()
        self.assertEqual(errors, [])
        self.assertEqual(sorted(r[0] for r in results), list(range(n_requests)))
        delta = lambda k: after.get(k, 0) - before.get(k, 0)
        prompt = sum(r[2] for r in results)
        generated = sum(r[3] for r in results)
        self.assertEqual(delta('minfer_requests_total{status="200"}'), n_requests)
        self.assertEqual(sum(delta(k) for k in after if k.startswith("minfer_requests_total")), n_requests)
        self.assertEqual(delta("minfer_prompt_tokens_total") + delta("minfer_prompt_cached_tokens_total"), prompt)
        self.assertEqual(delta("minfer_generated_tokens_total"), generated)
        lat = sorted(r[1] for r in results)
        report = {
            "requests": n_requests, "clients": n_clients, "errors": len(errors),
            "latency_p50_s": round(statistics.median(lat), 3),
            "latency_p95_s": round(lat[int(0.95 * (len(lat) - 1))], 3),
            "wall_s": round(wall, 2), "prompt_tokens": prompt, "generated_tokens": generated,
            "generated_tokens_per_s": round(generated / wall, 1),
            "server_decode_tokens_per_s": after["minfer_generated_tokens_per_second"],
        }
        print("\nload run: " + json.dumps(report))
        if os.environ.get("MINFER_REPORT"):
            with open(os.environ["MINFER_REPORT"], "w") as f:
                json.dump(report, f)


if __name__ == "__main__":
    unittest.main(verbosity=2)
