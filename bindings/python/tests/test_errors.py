"""Bad arguments raise clear exceptions, and change nothing."""

import pytest

import kiln


def test_unknown_keyword(engine):
    with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
        engine.complete("Hi", temprature=0.5)
    with pytest.raises(TypeError, match="unexpected keyword"):
        engine.session().generate(foo=1)
    with pytest.raises(TypeError):
        kiln.Engine("smollm2-135m", context=512)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"max_tokens": "8"}, "max_tokens must be an int, not str"),
        ({"max_tokens": 8.0}, "max_tokens must be an int"),
        ({"temperature": "hot"}, "temperature must be a number, not str"),
        ({"top_k": True}, "top_k must be an int, not bool"),
        ({"stop": 5}, "stop must be a string or a list of strings"),
        ({"logit_bias": [1, 2]}, "logit_bias must be a dict"),
        ({"stream": "yes"}, "stream must be a bool"),
    ],
)
def test_wrong_type(engine, kw, match):
    with pytest.raises(TypeError, match=match):
        engine.complete("Hi", **kw)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"top_p": 1.5}, "top_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"temperature": -1}, "temperature must be >= 0"),
        ({"max_tokens": -1}, "max_tokens must be >= 0"),
        ({"repeat_penalty": 0}, "repeat_penalty"),
        ({"logit_bias": {"999999": 1}}, "logit_bias"),
        ({"logit_bias": {"x": 1}}, "not a token id"),
        ({"logprobs": 21}, "logprobs must be between 0 and 20"),
        ({"stop": [""]}, "must not be empty"),
    ],
)
def test_value_out_of_range(engine, kw, match):
    with pytest.raises(kiln.InvalidArgumentError, match=match) as e:
        engine.complete("Hi", **kw)
    assert isinstance(e.value, ValueError) and isinstance(e.value, kiln.KilnError)


def test_missing_model():
    with pytest.raises(kiln.KilnError, match="no-such-model.gguf: no such file, and not a catalog model"):
        kiln.Engine("no-such-model.gguf")


def test_bad_engine_options(engine):
    with pytest.raises(kiln.InvalidArgumentError, match="unknown device"):
        kiln.Engine(engine.path, device="tpu")
    with pytest.raises(kiln.InvalidArgumentError, match="trained context"):
        kiln.Engine(engine.path, n_ctx=10**7)
    with pytest.raises(kiln.InvalidArgumentError, match="threads"):
        kiln.Engine(engine.path, threads=0)
    with pytest.raises(TypeError):
        kiln.Engine(engine.path, n_ctx="big")


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 10)
    with pytest.raises(kiln.ModelError, match="invalid GGUF"):
        kiln.Engine(bad)


def test_bad_prompts_and_messages(engine):
    with pytest.raises(TypeError, match="prompt must be a string or a list of token ids"):
        engine.complete(42)
    with pytest.raises(kiln.InvalidArgumentError, match="outside the vocabulary"):
        engine.complete([1, 10**6])
    with pytest.raises(kiln.InvalidArgumentError, match="more than the context"):
        engine.complete("word " * 2000)
    with pytest.raises(TypeError, match="messages"):
        engine.chat("Hi")
    with pytest.raises(kiln.InvalidArgumentError, match="role"):
        engine.chat([{"content": "Hi"}])
    with pytest.raises(kiln.InvalidArgumentError, match="must not be empty"):
        engine.chat([])
    with pytest.raises(TypeError, match="cannot be converted to JSON"):
        engine.chat([{"role": "user", "content": "Hi", "extra": object()}])
    with pytest.raises(kiln.InvalidArgumentError, match="outside the vocabulary"):
        engine.detokenize([10**6])
    with pytest.raises(kiln.InvalidArgumentError, match="unknown pooling"):
        engine.embed("x", pooling="max")
    # The engine is unharmed.
    assert engine.complete("Hi", max_tokens=2).finish_reason == "length"

