"""Tool calling and structured output through the official `openai` client against a real
`kiln serve` on qwen2.5-coder-0.5b (a template that takes tools, Hermes format) and
smollm2 (one that does not: kiln's generic JSON format). Every call's arguments are
validated against their schema with the `jsonschema` package.

Run with scripts/test-server.sh.
"""

import json
import os
import sys
import threading
import unittest

import jsonschema
import openai
import pydantic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kiln_server import Server, error_of  # noqa: E402

MODEL = "qwen2.5-coder-0.5b"
SERVER = None

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a time zone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "description": "IANA zone"}},
                   "required": ["timezone"], "additionalProperties": False}}}
BOOK = {"type": "function", "function": {
    "name": "book_flight", "description": "Book a flight",
    "parameters": {"type": "object", "properties": {
        "origin": {"type": "string"}, "destination": {"type": "string"},
        "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
        "cabin": {"type": "string", "enum": ["economy", "business"]},
        "extras": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
        "required": ["origin", "destination", "passengers"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME, BOOK]


def setUpModule():
    global SERVER
    SERVER = Server("-m", MODEL, "-c", "2048", "--parallel", "4", "--queue", "16")


def tearDownModule():
    if SERVER:
        SERVER.close()


def client(url=None):
    return openai.OpenAI(base_url=(url or SERVER.url) + "/v1", api_key="unused", max_retries=0, timeout=120)


def ask(content, tools=TOOLS, url=None, model=MODEL, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 128)
    return client(url).chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], tools=tools, **kw)


def stream_calls(chunks):
    """(content, calls, finish_reason) reassembled from chunks, checking OpenAI's delta shape."""
    content, calls, finish = "", {}, None
    for ch in chunks:
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            if tc.index not in calls:
                # A call's first delta: its index, id, type and name (arguments may start empty).
                assert tc.id and tc.id.startswith("call_"), tc
                assert tc.type == "function" and tc.function.name, tc
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments or ""}
            else:
                assert tc.id is None and tc.function.name is None, tc
                calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


class Checks(unittest.TestCase):
    def assert_valid(self, calls, tools=TOOLS):
        """Every call names a given tool, has a unique call_ id and schema-valid arguments."""
        ids = set()
        for c in calls:
            name, args, cid = (c.function.name, c.function.arguments, c.id) if hasattr(c, "function") else (
                c["name"], c["arguments"], c["id"])
            self.assertTrue(cid.startswith("call_") and len(cid) > 5, cid)
            self.assertNotIn(cid, ids)
            ids.add(cid)
            self.assertIsInstance(args, str)
            schema = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == name)
            jsonschema.validate(json.loads(args), schema)


class Tools(Checks):
    def test_required_whole_and_streamed(self):
        for q in ["What's the weather in Paris?", "Book a flight from Oslo to Rome for 2 people.", "Tell me a joke."]:
            r = ask(q, tool_choice="required")
            msg = r.choices[0].message
            self.assertEqual(r.choices[0].finish_reason, "tool_calls", msg)
            self.assertIsNone(msg.content)
            self.assertGreater(len(msg.tool_calls), 0)
            self.assert_valid(msg.tool_calls)
            content, calls, finish = stream_calls(ask(q, tool_choice="required", stream=True))
            self.assertEqual(finish, "tool_calls")
            self.assertEqual(content, "")
            self.assert_valid(calls)
            # Greedy: the stream makes the same calls (ids are fresh per reply).
            self.assertEqual([(c["name"], c["arguments"]) for c in calls],
                             [(c.function.name, c.function.arguments) for c in msg.tool_calls])

    def test_named_function_is_enforced(self):
        choice = {"type": "function", "function": {"name": "get_time"}}
        for stream in (False, True):
            r = ask("What's the weather in Paris?", tool_choice=choice, stream=stream, parallel_tool_calls=False)
            if stream:
                _, calls, finish = stream_calls(r)
            else:
                calls, finish = r.choices[0].message.tool_calls, r.choices[0].finish_reason
                calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in calls]
            self.assertEqual(finish, "tool_calls")
            self.assertEqual([c["name"] for c in calls], ["get_time"])
            self.assert_valid(calls)

    def test_auto_calls_when_asked_and_answers_otherwise(self):
        r = ask("What's the weather in Berlin?")
        msg = r.choices[0].message
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.assertEqual(msg.tool_calls[0].function.name, "get_weather")
        self.assert_valid(msg.tool_calls)
        content, calls, finish = stream_calls(ask("What's the weather in Berlin?", stream=True))
        self.assertEqual([(c["name"], c["arguments"]) for c in calls],
                         [(c.function.name, c.function.arguments) for c in msg.tool_calls])
        self.assertNotIn("tool_call", content)
        r = ask("Write a haiku about the sea.", tools=[TIME])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertFalse(r.choices[0].message.tool_calls)
        self.assertTrue(r.choices[0].message.content)

    def test_none_never_calls(self):
        for stream in (False, True):
            r = ask("What's the weather in Paris?", tool_choice="none", stream=stream)
            if stream:
                content, calls, finish = stream_calls(r)
            else:
                content, calls, finish = (r.choices[0].message.content, r.choices[0].message.tool_calls or [],
                                          r.choices[0].finish_reason)
            self.assertEqual(calls, [])
            self.assertIn(finish, ("stop", "length"))
            self.assertTrue(content)

    def test_multi_turn_feeds_the_result_back(self):
        c = client()
        msgs = [{"role": "user", "content": "What's the weather in Paris? Answer in one sentence."}]
        first = c.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, temperature=0, max_tokens=64,
                                          tool_choice={"type": "function", "function": {"name": "get_weather"}})
        call = first.choices[0].message.tool_calls[0]
        msgs.append(first.choices[0].message.model_dump(exclude_none=True))
        msgs.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 31, "sky": "clear"})})
        second = c.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, temperature=0, max_tokens=64,
                                           tool_choice="none")
        answer = second.choices[0].message.content
        self.assertEqual(second.choices[0].finish_reason, "stop")
        self.assertIn("31", answer)

    def test_constrained_requests_batch_with_others(self):
        """A constrained greedy reply is the same alone and beside other requests."""
        q = "Book a flight from Oslo to Rome for 2 people."
        alone = ask(q, tool_choice="required").choices[0].message.tool_calls
        out = {}
        jobs = {
            "tools": lambda: ask(q, tool_choice="required").choices[0].message.tool_calls,
            "plain": lambda: ask("Name three rivers.", tools=None, max_tokens=24).choices[0].message.content,
            "json": lambda: client().chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "A cat as JSON."}], temperature=0, max_tokens=48,
                response_format={"type": "json_object"}).choices[0].message.content,
            "named": lambda: ask("Hi!", tool_choice={"type": "function", "function": {"name": "get_time"}})
            .choices[0].message.tool_calls,
        }
        threads = [threading.Thread(target=lambda k=k, f=f: out.__setitem__(k, f())) for k, f in jobs.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual([(c.function.name, c.function.arguments) for c in out["tools"]],
                         [(c.function.name, c.function.arguments) for c in alone])
        self.assert_valid(out["named"])
        self.assertTrue(out["plain"])

    def test_parallel_off_means_one_call(self):
        r = ask("What's the weather in Paris and in Rome?", tool_choice="required", parallel_tool_calls=False)
        self.assertEqual(len(r.choices[0].message.tool_calls), 1)


class Structured(Checks):
    def test_parse_returns_the_pydantic_object(self):
        class City(pydantic.BaseModel):
            name: str
            country: str
            population: int

        r = client().beta.chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": "Describe Paris."}], response_format=City,
            temperature=0, max_tokens=96)
        city = r.choices[0].message.parsed
        self.assertIsInstance(city, City)
        self.assertTrue(city.name)

    def test_json_object_and_schema_on_both_routes(self):
        r = client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "A dog, as JSON."}],
                                             response_format={"type": "json_object"}, temperature=0, max_tokens=96)
        self.assertIn(r.choices[0].finish_reason, ("stop",))
        self.assertIsInstance(json.loads(r.choices[0].message.content), dict)
        schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
                  "additionalProperties": False}
        r = client().completions.create(model=MODEL, prompt="2 + 2 =", max_tokens=32, temperature=0,
                                        extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                            "name": "sum", "schema": schema, "strict": False}}})
        jsonschema.validate(json.loads(r.choices[0].text), schema)

    def test_grammar_field(self):
        r = client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Is water wet?"}],
                                             max_tokens=8, temperature=0, extra_body={"grammar": 'root ::= "yes" | "no"'})
        self.assertIn(r.choices[0].message.content, ("yes", "no"))


class BadInput(Checks):
    def assert_400(self, param, **kw):
        with self.assertRaises(openai.BadRequestError) as ctx:
            client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=4, **kw)
        err = ctx.exception.body
        self.assertEqual(err.get("param"), param, err)
        return err["message"]

    def test_clear_errors_and_the_server_goes_on(self):
        m = self.assert_400("tool_choice", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
        self.assertIn("nope", m)
        bad_tool = {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "integr"}}}}}
        m = self.assert_400("tools", tools=[bad_tool], tool_choice="required")
        self.assertIn("'f'", m)
        self.assert_400("tools", tools=[{"type": "function", "function": {"name": "bad name"}}])
        self.assert_400("tool_choice", tool_choice="required")
        m = self.assert_400("response_format", response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strng"}}}}})
        self.assertIn("strng", m)
        m = self.assert_400("grammar", extra_body={"grammar": "root ::= missing"})
        self.assertIn("missing", m)
        self.assert_400("response_format", tools=TOOLS, response_format={"type": "json_object"})
        # Other requests are unaffected.
        r = ask("What's the weather in Paris?", tool_choice="required")
        self.assert_valid(r.choices[0].message.tool_calls)


class Generic(Checks):
    """smollm2's template takes no tools: kiln's generic JSON format."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server("-m", "smollm2-135m", "-c", "1024", "--parallel", "2")

    @classmethod
    def tearDownClass(cls):
        cls.server.close()

    def test_required_auto_and_streamed(self):
        url = self.server.url
        r = ask("What's the weather in Paris?", url=url, model="smollm2-135m", tool_choice="required")
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.assert_valid(r.choices[0].message.tool_calls)
        content, calls, finish = stream_calls(
            ask("What's the weather in Paris?", url=url, model="smollm2-135m", tool_choice="required", stream=True))
        self.assertEqual(content, "")
        self.assert_valid(calls)
        r = ask("Say hello.", url=url, model="smollm2-135m", max_tokens=64)
        msg = r.choices[0].message
        if msg.tool_calls:
            self.assert_valid(msg.tool_calls)
        else:
            self.assertNotIn('"response"', msg.content or "")


if __name__ == "__main__":
    unittest.main(verbosity=2)
