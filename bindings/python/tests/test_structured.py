"""Constrained output: response_format and GBNF grammars."""

import json

import pytest

import kiln

ASK = [{"role": "user", "content": "Describe a cat named Tom who is 3 years old, as JSON."}]


def test_json_object(engine):
    q = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
    r = engine.chat(q, response_format={"type": "json_object"}, max_tokens=120, temperature=0)
    assert r.finish_reason == "eog"
    assert isinstance(json.loads(r.text), dict)


def test_json_schema(engine):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "cat", "schema": schema}}
    for kw in (dict(temperature=0), dict(temperature=1.0, seed=3)):
        r = engine.chat(ASK, response_format=fmt, max_tokens=200, **kw)
        obj = json.loads(r.text)
        assert set(obj) == {"name", "age"} and isinstance(obj["age"], int)
    # Streamed, the pieces are the same constrained text.
    s = engine.chat(ASK, response_format=fmt, max_tokens=200, temperature=0, stream=True)
    assert json.loads("".join(p.text for p in s)) == json.loads(engine.chat(ASK, response_format=fmt, max_tokens=200, temperature=0).text)


def test_gbnf_grammar_on_complete_and_session(engine):
    g = 'root ::= ("yes" | "no") "."'
    for seed in range(3):
        r = engine.complete("Is the sky blue? Answer:", grammar=g, temperature=1.0, seed=seed, max_tokens=10)
        assert r.text in ("yes.", "no.") and r.finish_reason == "eog"
    s = engine.session()
    s.append_text("Is water wet? Answer:")
    assert s.generate(grammar=g, max_tokens=10).text in ("yes.", "no.")
    assert engine.chat(ASK, response_format={"type": "text"}, max_tokens=4).finish_reason == "length"


def test_bad_structured_arguments(engine):
    with pytest.raises(kiln.GrammarError):
        engine.complete("Hi", grammar='root ::= "unclosed')
    with pytest.raises(kiln.InvalidArgumentError, match="'type' must be"):
        engine.chat(ASK, response_format={"type": "xml"})
    with pytest.raises(TypeError, match="response_format must be a dict"):
        engine.chat(ASK, response_format="json")
    with pytest.raises(kiln.InvalidArgumentError, match="not both"):
        engine.complete("Hi", grammar='root ::= "a"', response_format={"type": "json_object"})
    with pytest.raises(kiln.GrammarError):
        bad = {"type": "json_schema", "json_schema": {"schema": {"type": "object", "patternProperties": 5}}}
        engine.chat(ASK, response_format=bad)
