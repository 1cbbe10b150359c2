"""hf:// names, resolved from a Hugging Face cache laid out as huggingface_hub does (offline:
CI reaches no Hub)."""

import pytest

import kiln


def test_hub_name_loads_from_the_cache(engine, tmp_path, monkeypatch):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--kiln-test--smollm2"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "smollm2-Q4_1.gguf").symlink_to(engine.path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = kiln.Engine("hf://kiln-test/smollm2", n_ctx=1024)
    assert hub.path.endswith("smollm2-Q4_1.gguf")
    prompt = "The capital of France is"
    assert hub.complete(prompt, max_tokens=8, temperature=0).ids == engine.complete(prompt, max_tokens=8, temperature=0).ids
    with pytest.raises(kiln.HubError, match="not in the cache"):
        kiln.Engine("hf://kiln-test/missing")
