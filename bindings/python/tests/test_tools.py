"""Tool calling: tools, tool_choice and parallel_tool_calls on Engine.chat and
Session.append_chat. smollm2's template takes no tools, so this is kiln's generic format
(the whole reply constrained to calls or a response); the template formats are tested in
the engine's and the server's suites."""

import json

import pytest

import kiln

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]
ASK = [{"role": "user", "content": "What's the weather in Paris?"}]


def check_call(call, names=("get_weather", "get_time")):
    """An OpenAI-shaped call with a fresh id and arguments that match the tool's schema."""
    assert set(call) == {"id", "type", "function"}
    assert call["id"].startswith("call_") and len(call["id"]) == 29
    assert call["type"] == "function"
    name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
    assert name in names
    params = {"get_weather": WEATHER, "get_time": TIME}[name]["function"]["parameters"]
    assert isinstance(args, dict) and set(params["required"]) <= set(args) <= set(params["properties"])
    assert all(isinstance(v, str) for v in args.values())
    if "unit" in args:
        assert args["unit"] in ("celsius", "fahrenheit")
    return name, args


def test_required_and_named_calls(engine):
    for kw in (dict(temperature=0), dict(temperature=1.0, seed=5)):
        # smollm2 may repeat calls until max_tokens: a call cut short is left out.
        r = engine.chat(ASK, tools=TOOLS, tool_choice="required", max_tokens=128, **kw)
        assert r.finish_reason in ("eog", "length") and r.tool_calls and r.text == ""
        for c in r.tool_calls:
            check_call(c)
    named = {"type": "function", "function": {"name": "get_time"}}
    r = engine.chat(ASK, tools=TOOLS, tool_choice=named, max_tokens=128, temperature=0)
    assert [check_call(c)[0] for c in r.tool_calls] == ["get_time"] * len(r.tool_calls) and r.tool_calls
    ids = [c["id"] for c in r.tool_calls]
    assert len(set(ids)) == len(ids)
    r = engine.chat(ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=128, temperature=0)
    assert len(r.tool_calls) == 1 and r.finish_reason == "eog"


def test_none_and_no_tools_give_text(engine):
    for kw in (dict(tools=TOOLS, tool_choice="none"), dict()):
        r = engine.chat(ASK, max_tokens=16, temperature=0, **kw)
        assert r.tool_calls == [] and r.text
    plain = engine.chat(ASK, max_tokens=16, temperature=0)
    assert engine.chat(ASK, tools=TOOLS, tool_choice="none", max_tokens=16, temperature=0).text == plain.text


def test_streamed_deltas_add_up_to_the_calls(engine):
    # Enough tokens for two calls and a third cut short: its first delta (id and name) was
    # streamed, but the completion leaves it out.
    s = engine.chat(ASK, tools=TOOLS, tool_choice="required", max_tokens=80, temperature=0, stream=True)
    calls, text = {}, ""
    for p in s:
        text += p.text
        for d in p.tool_calls:
            if "id" in d:
                assert d["index"] not in calls and d["function"]["arguments"] == ""
                calls[d["index"]] = {"id": d["id"], "type": d["type"],
                                     "function": {"name": d["function"]["name"], "arguments": ""}}
            else:
                assert set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
                calls[d["index"]]["function"]["arguments"] += d["function"]["arguments"]
    assert text == "" and calls
    done = s.result.tool_calls
    assert len(done) >= 1 and [calls[i] for i in sorted(calls)][: len(done)] == done
    for c in done:
        check_call(c)
    whole = engine.chat(ASK, tools=TOOLS, tool_choice="required", max_tokens=80, temperature=0)
    strip = lambda cs: [c["function"] for c in cs]  # noqa: E731 (ids are fresh per reply)
    assert strip(s.result.tool_calls) == strip(whole.tool_calls)


def test_session_feeds_the_result_back(engine):
    s = engine.session()
    s.append_chat(ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                  parallel_tool_calls=False)
    r = s.generate(max_tokens=128, temperature=0)
    assert len(r.tool_calls) == 1
    check_call(r.tool_calls[0], names=("get_weather",))
    assert s.history[-1]["role"] == "assistant" and s.history[-1]["tool_calls"] == r.tool_calls
    result = {"role": "tool", "tool_call_id": r.tool_calls[0]["id"], "content": '{"temp_c": 18, "sky": "clear"}'}
    s.append_chat([result], tools=TOOLS, tool_choice="none")
    answer = s.generate(max_tokens=32, temperature=0)
    assert answer.tool_calls == [] and answer.text
    # Engine.chat takes the same history, the calls as the completion gave them.
    q = ASK + [{"role": "assistant", "content": r.text, "tool_calls": r.tool_calls}, result]
    assert engine.chat(q, tools=TOOLS, tool_choice="none", max_tokens=32, temperature=0).text == answer.text


def test_bad_tools_raise(engine):
    with pytest.raises(kiln.InvalidArgumentError, match="not among the tools"):
        engine.chat(ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    with pytest.raises(kiln.InvalidArgumentError, match="needs at least one tool"):
        engine.chat(ASK, tool_choice="required")
    with pytest.raises(kiln.InvalidArgumentError, match=r"tools\[0\]"):
        engine.chat(ASK, tools=[{"type": "function", "function": {"name": "bad name"}}])
    with pytest.raises(kiln.InvalidArgumentError, match="tool_choice"):
        engine.chat(ASK, tools=TOOLS, tool_choice="sometimes")
    with pytest.raises(TypeError, match="list of dicts"):
        engine.chat(ASK, tools={"type": "function"})
    bad_schema = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integr"}}}}}
    with pytest.raises(kiln.KilnError, match="'f'"):
        engine.chat(ASK, tools=[bad_schema], tool_choice="required", max_tokens=8)
    with pytest.raises(kiln.InvalidArgumentError, match="grammar"):
        engine.chat(ASK, tools=TOOLS, response_format={"type": "json_object"}, max_tokens=8)
    # The engine is unharmed.
    assert engine.chat(ASK, tools=TOOLS, tool_choice="required", max_tokens=128, temperature=0).tool_calls
