"""Embeddings against `kiln embed --json`."""

import struct

import pytest

from conftest import MODEL, cli_json

TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog."]


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def same(a, b):
    return [f32(x) for x in a] == [f32(x) for x in b]


@pytest.mark.parametrize("pooling", ["mean", "last"])
@pytest.mark.parametrize("normalize", [False, True])
def test_embed_is_kiln_embed(engine, pooling, normalize):
    args = ["embed", "-m", MODEL, "-c", "1024", "--pooling", pooling, *TEXTS]
    if normalize:
        args.append("--normalize")
    want = [d["embedding"] for d in cli_json(*args)["data"]]
    got = engine.embed(TEXTS, pooling=pooling, normalize=normalize)
    assert len(got) == 2 and all(len(v) == engine.n_embd for v in got)
    assert all(same(g, w) for g, w in zip(got, want))
    if normalize:
        assert sum(x * x for x in got[0]) == pytest.approx(1.0, rel=1e-5)


def test_pooling_none_gives_a_row_per_token(engine):
    want = cli_json("embed", "-m", MODEL, "-c", "1024", "--pooling", "none", TEXTS[0])["data"][0]["embedding"]
    got = engine.embed(TEXTS[0], pooling="none")
    assert len(got) == 1 and len(got[0]) == len(engine.tokenize(TEXTS[0]))
    assert all(same(g, w) for g, w in zip(got[0], want))


def test_as_numpy(engine):
    np = pytest.importorskip("numpy")
    lists = engine.embed(TEXTS)
    arr = engine.embed(TEXTS, as_numpy=True)
    assert arr.dtype == np.float32 and arr.shape == (2, engine.n_embd)
    assert np.array_equal(arr, np.asarray(lists, dtype=np.float32))
    rows = engine.embed(TEXTS, pooling="none", as_numpy=True)
    assert [r.shape for r in rows] == [(len(engine.tokenize(t)), engine.n_embd) for t in TEXTS]
