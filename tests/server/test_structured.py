"""Structured output of `minfer serve` (response_format, json_schema, grammar, forced tool
calls), checked by validators independent of the server: Python's `jsonschema` (with format
checks of its own below for the formats jsonschema leaves unchecked), `json`, regular
expressions and a recursive-descent parser written here.

Run by tests/server_openai.rs (`cargo test --release`), which passes MINFER_BIN, MINFER_MODEL
(the Qwen2.5-Coder-0.5B) and MINFER_SCHEMAS (structured_schemas.json: the suite of schemas).
"""

import concurrent.futures
import datetime
import ipaddress
import json
import os
import re
import unittest
import uuid

import jsonschema

from test_openai import Server

SCHEMAS = json.load(open(os.environ.get("MINFER_SCHEMAS", os.path.join(os.path.dirname(__file__), "structured_schemas.json"))))
SEEDS = (1, 2, 3)
MAX_TOKENS = 400
SERVER = None


def setUpModule():
    global SERVER
    SERVER = Server("--slots", "4", "--ctx", "8192")


def tearDownModule():
    SERVER.stop()


# Formats checked here, not by the server's code nor left to jsonschema's optional checkers.
DATE = re.compile(r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$")
TIME = re.compile(r"^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$", re.I)
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")
HOSTNAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


def valid_date(s):
    if not DATE.match(s):
        return False
    try:
        datetime.date.fromisoformat(s)
        return True
    except ValueError:
        return False


def valid_uuid(s):
    try:
        return str(uuid.UUID(s)) == s.lower() and len(s) == 36
    except ValueError:
        return False


def valid_ipv4(s):
    try:
        ipaddress.IPv4Address(s)
        return True
    except ValueError:
        return False


FORMATS = jsonschema.FormatChecker()
for name, check in {
    "date": valid_date,
    "time": lambda s: bool(TIME.match(s)),
    "date-time": lambda s: len(s) > 11 and s[10] in "Tt" and valid_date(s[:10]) and bool(TIME.match(s[11:])),
    "email": lambda s: bool(EMAIL.match(s)),
    "uuid": valid_uuid,
    "ipv4": valid_ipv4,
    "hostname": lambda s: bool(HOSTNAME.match(s)),
}.items():
    FORMATS.checks(name)(check)


def validate(schema, text):
    """Parses `text` as JSON and validates it; raises with what was wrong."""
    value = json.loads(text)
    jsonschema.Draft202012Validator(schema, format_checker=FORMATS).validate(value)
    return value


def chat_body(prompt, extra, temperature=0.0, seed=None, stream=False):
    body = {
        "messages": [{"role": "system", "content": "You answer with JSON only."}, {"role": "user", "content": prompt}],
        "temperature": temperature, "max_tokens": MAX_TOKENS, "stream": stream,
    }
    if seed is not None:
        body["seed"] = seed
    body.update(extra)
    return body


def chat(body):
    """(text, finish_reason) of a chat completion; streams are joined chunk by chunk."""
    c = SERVER.client()
    if body.get("stream"):
        args = {k: v for k, v in body.items() if k not in ("messages", "stream")}
        stream = c.chat.completions.create(model="m", messages=body["messages"], stream=True, extra_body=_extra(args))
        text, reason = "", None
        for chunk in stream:
            for ch in chunk.choices:
                text += ch.delta.content or ""
                reason = ch.finish_reason or reason
        return text, reason
    args = {k: v for k, v in body.items() if k not in ("messages", "stream")}
    r = c.chat.completions.create(model="m", messages=body["messages"], extra_body=_extra(args))
    return r.choices[0].message.content, r.choices[0].finish_reason


def _extra(args):
    return args


class JsonSchemas(unittest.TestCase):
    def test_every_schema_greedy_sampled_and_streamed(self):
        """Each schema: greedy, temperature 1 with three seeds, and the greedy and seed-1 runs
        streamed; every text parses and validates, every stream equals its whole answer."""
        self.assertGreaterEqual(len(SCHEMAS), 40)
        jobs = []
        for s in SCHEMAS:
            rf = {"response_format": {"type": "json_schema", "json_schema": {"name": s["name"], "schema": s["schema"], "strict": True}}}
            jobs.append((s, "greedy", chat_body(s["prompt"], rf)))
            jobs.append((s, "greedy-stream", chat_body(s["prompt"], rf, stream=True)))
            for seed in SEEDS:
                jobs.append((s, f"seed{seed}", chat_body(s["prompt"], rf, temperature=1.0, seed=seed)))
            jobs.append((s, "seed1-stream", chat_body(s["prompt"], rf, temperature=1.0, seed=1, stream=True)))
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda j: (j[0], j[1], chat(j[2])), jobs))
        failures, texts = [], {}
        for s, kind, (text, reason) in results:
            texts[(s["name"], kind)] = text
            try:
                self.assertEqual(reason, "stop", "the answer did not end by itself")
                validate(s["schema"], text)
            except Exception as e:  # noqa: BLE001 - every failure is collected and shown
                failures.append(f"{s['name']} {kind}: {type(e).__name__}: {str(e)[:300]}\n  text: {text[:300]!r}")
        for s in SCHEMAS:
            for whole, streamed in (("greedy", "greedy-stream"), ("seed1", "seed1-stream")):
                if texts[(s["name"], whole)] != texts[(s["name"], streamed)]:
                    failures.append(f"{s['name']}: {streamed} differs from {whole}: {texts[(s['name'], streamed)]!r} vs {texts[(s['name'], whole)]!r}")
        n_tokens = sum(len(t) for t in texts.values())
        print(f"\n{len(jobs)} structured answers over {len(SCHEMAS)} schemas, {n_tokens} characters")
        self.assertEqual(failures, [], "\n".join(failures))

    def test_llama_server_json_schema_field_on_both_endpoints(self):
        schema = next(s for s in SCHEMAS if s["name"] == "order")["schema"]
        for seed in SEEDS:
            st, r = SERVER.http("POST", "/v1/completions", {"prompt": "An order as JSON:", "json_schema": schema, "temperature": 1, "seed": seed, "max_tokens": MAX_TOKENS})
            self.assertEqual(st, 200, r)
            validate(schema, r["choices"][0]["text"])
            st, r = SERVER.http("POST", "/v1/chat/completions", chat_body("Create an order.", {"json_schema": schema}, temperature=1.0, seed=seed))
            self.assertEqual(st, 200, r)
            validate(schema, r["choices"][0]["message"]["content"])

    def test_schema_with_logprobs_and_stop(self):
        schema = next(s for s in SCHEMAS if s["name"] == "book")["schema"]
        rf = {"response_format": {"type": "json_schema", "json_schema": {"name": "book", "schema": schema}}}
        st, r = SERVER.http("POST", "/v1/chat/completions", chat_body("Describe a famous novel.", dict(rf, logprobs=True, top_logprobs=3)))
        self.assertEqual(st, 200, r)
        text = r["choices"][0]["message"]["content"]
        validate(schema, text)
        pieces = r["choices"][0]["logprobs"]["content"]
        self.assertEqual("".join(p["token"] for p in pieces), text)
        for p in pieces:
            self.assertLessEqual(p["logprob"], 0.0)
        # A stop string ends the answer early, as without a schema.
        st, r = SERVER.http("POST", "/v1/chat/completions", chat_body("Describe a famous novel.", dict(rf, stop=["author"])))
        self.assertEqual(st, 200, r)
        self.assertEqual(r["choices"][0]["finish_reason"], "stop")
        self.assertTrue(text.startswith(r["choices"][0]["message"]["content"]), r)
        self.assertNotIn("author", r["choices"][0]["message"]["content"])


class JsonObject(unittest.TestCase):
    def test_json_object_always_parses_as_an_object(self):
        prompts = ["Describe a cat with its name, color and age.", "List three colors.", "What is 2 + 2?", "Say hello.", "Give me a pancake recipe: a title and its four ingredients."]
        jobs = [(p, seed) for p in prompts for seed in (None, 1, 2, 3)]

        def one(job):
            p, seed = job
            body = chat_body(p, {"response_format": {"type": "json_object"}}, temperature=0.0 if seed is None else 1.0, seed=seed)
            return chat(body)

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for (p, seed), (text, reason) in zip(jobs, pool.map(one, jobs)):
                self.assertEqual(reason, "stop", (p, seed, text))
                self.assertIsInstance(json.loads(text), dict, (p, seed, text))


ARITH = r"""
root   ::= expr
expr   ::= term (ws ("+" | "-") ws term)*
term   ::= factor (ws ("*" | "/") ws factor)*
factor ::= number | "(" ws expr ws ")"
number ::= [0-9]+
ws     ::= " "?
"""


def parse_arith(s):
    """A recursive-descent parser of ARITH's language, written for this test: True when the
    whole string is an expression."""
    pos = 0

    def ws():
        nonlocal pos
        if pos < len(s) and s[pos] == " ":
            pos += 1

    def number():
        nonlocal pos
        start = pos
        while pos < len(s) and s[pos].isdigit() and s[pos] in "0123456789":
            pos += 1
        return pos > start

    def factor():
        nonlocal pos
        if pos < len(s) and s[pos] == "(":
            pos += 1
            ws()
            if not expr():
                return False
            ws()
            if pos < len(s) and s[pos] == ")":
                pos += 1
                return True
            return False
        return number()

    def chain(item, ops):
        nonlocal pos
        if not item():
            return False
        while True:
            save = pos
            ws()
            if pos < len(s) and s[pos] in ops:
                pos += 1
                ws()
                if item():
                    continue
            pos = save
            return True

    def term():
        return chain(factor, "*/")

    def expr():
        return chain(term, "+-")

    return expr() and pos == len(s)


class Grammars(unittest.TestCase):
    def test_gbnf_arithmetic_and_date_always_match(self):
        date = 'root ::= [0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01])'
        date_re = re.compile(r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$")
        cases = [
            (ARITH, "Write an arithmetic expression that equals 42:", parse_arith),
            (ARITH, "Compute the area of a 3 by 4 rectangle plus 7, as an expression:", parse_arith),
            (date, "The Berlin Wall fell on", lambda t: bool(date_re.match(t))),
            (date, "Today's date in ISO format:", lambda t: bool(date_re.match(t))),
        ]
        self.assertTrue(parse_arith("(1 + 2)*3-4/5") and not parse_arith("1 +") and not parse_arith("(1"))
        for grammar, prompt, matches in cases:
            for seed in (None, 1, 2, 3):
                temp = 0.0 if seed is None else 1.0
                st, r = SERVER.http("POST", "/v1/completions", {"prompt": prompt, "grammar": grammar, "temperature": temp, "seed": seed, "max_tokens": 60})
                self.assertEqual(st, 200, r)
                text = r["choices"][0]["text"]
                # An unbounded grammar may be cut by max_tokens; a cut text is a prefix that
                # still parses only if it ended by itself, so only finished ones are checked.
                if r["choices"][0]["finish_reason"] == "stop":
                    self.assertTrue(matches(text), (prompt, seed, text))
                else:
                    self.assertEqual(grammar, ARITH, (prompt, seed, text))
                st, r = SERVER.http("POST", "/v1/chat/completions", chat_body(prompt, {"grammar": grammar}, temperature=temp, seed=seed))
                self.assertEqual(st, 200, r)
                self.assertTrue(matches(r["choices"][0]["message"]["content"]), (prompt, seed, r))


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather", "description": "The current weather in a city.", "strict": True,
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "unit", "days"], "additionalProperties": False},
    },
}
STOCK = {
    "type": "function",
    "function": {
        "name": "get_stock_price", "strict": True,
        "parameters": {"type": "object", "properties": {"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"}}, "required": ["ticker"], "additionalProperties": False},
    },
}


class ToolCalls(unittest.TestCase):
    def check_calls(self, msg, allowed):
        self.assertTrue(msg.tool_calls, msg)
        for call in msg.tool_calls:
            tool = next(t for t in (WEATHER, STOCK) if t["function"]["name"] == call.function.name)
            self.assertIn(call.function.name, allowed)
            jsonschema.Draft202012Validator(tool["function"]["parameters"], format_checker=FORMATS).validate(json.loads(call.function.arguments))

    def test_required_tool_calls_validate_through_the_openai_client(self):
        c = SERVER.client()
        prompts = ["What's the weather in Paris for the next 3 days?", "How is Apple's stock doing?", "Tell me a joke."]
        for prompt in prompts:
            for seed in (None, 1, 2, 3):
                r = c.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": prompt}], tools=[WEATHER, STOCK], tool_choice="required",
                    temperature=0.0 if seed is None else 1.0, seed=seed, max_tokens=MAX_TOKENS,
                )
                self.assertEqual(r.choices[0].finish_reason, "tool_calls", r)
                self.check_calls(r.choices[0].message, ("get_weather", "get_stock_price"))

    def test_named_function_and_stream(self):
        c = SERVER.client()
        choice = {"type": "function", "function": {"name": "get_stock_price"}}
        args = dict(model="m", messages=[{"role": "user", "content": "What's the weather in Oslo?"}], tools=[WEATHER, STOCK], tool_choice=choice, temperature=0.0, max_tokens=MAX_TOKENS)
        r = c.chat.completions.create(**args)
        self.check_calls(r.choices[0].message, ("get_stock_price",))
        self.assertEqual(len(r.choices[0].message.tool_calls), 1)
        calls, reason = {}, None
        for chunk in c.chat.completions.create(stream=True, **args):
            for ch in chunk.choices:
                reason = ch.finish_reason or reason
                for tc in ch.delta.tool_calls or []:
                    entry = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                    entry["name"] += tc.function.name or ""
                    entry["arguments"] += tc.function.arguments or ""
        self.assertEqual(reason, "tool_calls")
        self.assertEqual([(v["name"], v["arguments"]) for v in calls.values()], [(t.function.name, t.function.arguments) for t in r.choices[0].message.tool_calls])


class Errors(unittest.TestCase):
    """Invalid schemas and grammars are 400s that name the place, never 500s."""

    def test_invalid_schemas_and_grammars_name_the_place(self):
        msgs = [{"role": "user", "content": "hi"}]
        rf = lambda schema: {"messages": msgs, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
        P = "response_format.json_schema.schema"
        cases = [
            (rf({"type": "object", "properties": {"age": {"type": "integr"}}}), f"{P}.properties.age.type", "integr"),
            (rf({"type": "object", "properties": {"age": {"type": "integer", "minimum": 10, "maximum": 5}}}), f"{P}.properties.age.minimum", "maximum"),
            (rf({"type": "array", "items": {"type": "string"}, "uniqueItems": True}), f"{P}.uniqueItems", "uniqueItems"),
            (rf({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}), f"{P}.properties.a.not", "not"),
            (rf({"type": "object", "propertyNames": {"pattern": "^a"}}), f"{P}.propertyNames", "propertyNames"),
            (rf({"type": "string", "format": "phone"}), f"{P}.format", "phone"),
            (rf({"type": "string", "pattern": "(abc"}), P, "regex"),
            (rf({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "pattern": "[a-"}}}}), f"{P}.properties.tags.items", "regex"),
            (rf({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}), f"{P}.properties.x", "missing"),
            (rf({"type": "object", "nullable": True}), f"{P}.nullable", "nullable"),
            (rf({"type": "string", "minLength": 5, "maxLength": 2}), f"{P}.minLength", "maxLength"),
            (rf({"type": "object", "properties": {"a": 5}}), f"{P}.properties.a", "schema"),
            (rf({"anyOf": []}), f"{P}.anyOf", "non-empty"),
            (rf({"type": "object", "required": ["b"], "properties": {"a": {}}, "additionalProperties": False}), f"{P}.required", "'b'"),
            (rf(False), P, "false"),
            ({"messages": msgs, "json_schema": {"type": "object", "properties": {"n": {"type": "number", "exclusiveMinimum": 3, "maximum": 3}}}}, "json_schema.properties.n.exclusiveMinimum", "maximum"),
            ({"messages": msgs, "response_format": {"type": "json_object", "schema": {"type": "strin"}}}, "response_format.schema.type", "strin"),
            ({"messages": msgs, "grammar": 'root ::= "a" missing'}, "grammar", "line 1, column 14"),
            ({"messages": msgs, "grammar": 'root ::= "a\n'}, "grammar", "unterminated"),
            ({"messages": msgs, "grammar": 'expr ::= "a"'}, "grammar", "root"),
            ({"messages": msgs, "grammar": 'root ::= [z-a]'}, "grammar", "backwards"),
            ({"messages": msgs, "tools": [dict(WEATHER, function=dict(WEATHER["function"], parameters={"type": "object", "properties": {"city": {"type": "text"}}}))], "tool_choice": "required"}, "tools[0].function.parameters.properties.city.type", "text"),
        ]
        for body, param, says in cases:
            for path in ("/v1/chat/completions",) + (("/v1/completions",) if "messages" in body and ("grammar" in body or "json_schema" in body) else ()):
                b = dict(body)
                if path == "/v1/completions":
                    b.pop("messages")
                    b["prompt"] = "hi"
                st, r = SERVER.http("POST", path, b)
                self.assertEqual(st, 400, (path, body, r))
                self.assertEqual(r["error"]["param"], param, (body, r))
                self.assertIn(says, r["error"]["message"], (body, r))
                self.assertNotIn("\n", r["error"]["message"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
