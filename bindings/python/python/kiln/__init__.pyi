"""kiln: a Rust-native LLM inference engine for GGUF models, in this process.

Everything runs in-process on kiln's engine. Compute runs with the GIL released: other
Python threads keep running, several threads may generate on one Engine at once, and
Ctrl-C raises KeyboardInterrupt promptly (the generation is cancelled).
"""

import os
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, Literal, Mapping, Optional, TypedDict, Union, overload

from typing_extensions import Unpack

from ._errors import (
    BackendError as BackendError,
    GrammarError as GrammarError,
    HubError as HubError,
    InvalidArgumentError as InvalidArgumentError,
    KilnError as KilnError,
    KilnIOError as KilnIOError,
    ModelError as ModelError,
    TemplateError as TemplateError,
    TokenizerError as TokenizerError,
)

__version__: str

#: The keyword arguments `Engine.complete`, `Engine.chat` and `Session.generate` take.
SAMPLING_KEYWORDS: list[str]

FinishReason = Literal["eog", "stop", "length", "context_full", "cancelled"]
Message = Mapping[str, Any]
"""A chat message: {"role": "system" | "user" | "assistant" | "tool", "content": str | None
| [{"type": "text", "text": str}, ...], ...}; other keys (tool_calls, tool_call_id, name...)
reach the chat template as they are."""

class Sampling(TypedDict, total=False):
    """Sampling keywords: OpenAI's names, plus llama.cpp's top_k, min_p, repeat_penalty and
    grammar.
    Defaults are llama.cpp's (kiln run's): temperature 0.8, top_k 40, top_p 0.95,
    min_p 0.05, no penalties, a random seed. None means the default."""

    max_tokens: Optional[int]
    """Most tokens to generate (default: until end of generation or the context is full)."""
    temperature: Optional[float]
    """0 picks the most likely token (greedy: deterministic)."""
    top_p: Optional[float]
    top_k: Optional[int]
    """<= 0 disables."""
    min_p: Optional[float]
    repeat_penalty: Optional[float]
    presence_penalty: Optional[float]
    frequency_penalty: Optional[float]
    seed: Optional[int]
    stop: Union[str, Sequence[str], None]
    """Generation stops before any of these strings (not included in the text)."""
    logit_bias: Optional[Mapping[Union[int, str], float]]
    """Token id -> bias added to its logit; float("-inf") bans the token."""
    logprobs: Union[bool, int, None]
    """True: report each sampled token's log-probability; N: also the N most likely (<= 20)."""
    ignore_eos: Optional[bool]
    """Keep generating past end-of-generation tokens."""
    response_format: Optional[Mapping[str, Any]]
    """OpenAI's: {"type": "text"}, {"type": "json_object"} (the output is a JSON object) or
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}} (it matches the
    schema). Generation is constrained, so the output always parses."""
    grammar: Optional[str]
    """A GBNF grammar (llama.cpp's format, start symbol `root`) the output must match."""

class StreamingSampling(Sampling, total=False):
    stream: bool
    """True: return a Stream of Pieces instead of a Completion."""

class Timings:
    """Where the time went."""

    prompt_n: int
    """Prompt tokens evaluated."""
    prompt_cached: int
    """Prompt tokens reused from the KV cache (not evaluated)."""
    prompt_ms: float
    gen_n: int
    """Tokens generated."""
    gen_ms: float
    @property
    def prompt_tok_s(self) -> float: ...
    @property
    def gen_tok_s(self) -> float: ...

class Completion:
    """A finished generation. str(completion) is its text."""

    text: str
    """The generated text, without control tokens, cut before a matched stop string."""
    ids: list[int]
    """Every sampled token id, a final end-of-generation token included."""
    prompt_ids: list[int]
    """The prompt's token ids (for a Session: the whole conversation before generating)."""
    finish_reason: FinishReason
    timings: Timings
    logprobs: Optional[list[float]]
    """With logprobs: each sampled token's log-probability (a final end-of-generation
    token has none)."""
    top_logprobs: Optional[list[list[tuple[int, float]]]]
    """With logprobs=N: each step's N most likely (id, logprob), best first."""
    tool_calls: list[dict[str, Any]]
    """In a chat with tools: the reply's calls in OpenAI's shape, {"id": "call_...",
    "type": "function", "function": {"name": ..., "arguments": JSON string}} (empty
    otherwise); they can go back into the history as an assistant message's tool_calls."""
    def __str__(self) -> str: ...

class Piece:
    """One streamed step. Concatenating the texts of a stream's pieces gives the
    Completion's text."""

    text: str
    """Text released by this step (valid UTF-8; empty while a character or a possible stop
    string is incomplete)."""
    id: Optional[int]
    """The sampled token; None for text released at the end (no new token)."""
    logprob: Optional[float]
    top_logprobs: list[tuple[int, float]]
    tool_calls: list[dict[str, Any]]
    """In a chat with tools: OpenAI's delta.tool_calls entries of the calls this step
    completed: a call's index, id, type and name first, then its arguments' fragments."""
    def __str__(self) -> str: ...

class Stream(Iterator[Piece]):
    """Pieces as they are generated. Dropping the stream (or cancel()) stops generating;
    leaving a `with` block does too."""

    def __iter__(self) -> "Stream": ...
    def __next__(self) -> Piece: ...
    @property
    def result(self) -> Optional[Completion]:
        """The Completion, once the stream is exhausted (None before)."""
    def cancel(self) -> None:
        """Stop at the next token; the stream then ends with finish_reason "cancelled"."""
    def __enter__(self) -> "Stream": ...
    def __exit__(
        self,
        ty: Optional[type[BaseException]],
        value: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None: ...

class Engine:
    """A loaded model: weights on a device, tokenizer, chat template and KV cache.

    Loading is the slow part: make one Engine and share it; threads may use it at once
    (their forwards are interleaved, each sequence's results unchanged).
    """

    def __init__(
        self,
        model: Union[str, "os.PathLike[str]"],
        *,
        n_ctx: Optional[int] = None,
        device: Literal["auto", "cpu", "gpu"] = "auto",
        threads: Optional[int] = None,
        n_batch: Optional[int] = None,
        n_seq: int = 1,
        draft_model: Optional[Union[str, "os.PathLike[str]"]] = None,
        lookup_ngram: Optional[int] = None,
        draft_max: int = 16,
        draft_min: int = 0,
        draft_p_min: float = 0.75,
    ) -> None:
        """Load `model`: a .gguf path, a catalog name such as "smollm2-135m" (fetched into
        $KILN_HOME on first use), or a Hugging Face name, hf://ORG/REPO[:QUANT] or
        hf://ORG/REPO/PATH.gguf (fetched into the Hugging Face cache).

        n_ctx: context per sequence (default min(the model's trained context, 4096)).
        device: "auto" (a hardware GPU when there is one, else the CPU), "cpu" or "gpu".
        threads: CPU threads (default: the number of cores).
        n_batch: most tokens per forward pass (default 512).
        n_seq: sequences that can hold a full context at once (the KV pool holds
            n_ctx * n_seq tokens; sessions and concurrent calls share it).
        draft_model: a smaller model of the same vocabulary that drafts tokens for
            speculative decoding (as `kiln run -md`); lookup_ngram: draft from the context
            instead (prompt lookup, `--lookup-ngram`). draft_max, draft_min, draft_p_min
            as `--draft-max`, `--draft-min`, `--draft-p-min`. Output is the same as without.
        """
    @property
    def n_ctx(self) -> int: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def n_embd(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def backend(self) -> str:
        """The device the model runs on, in words."""
    @property
    def chat_template(self) -> Optional[str]:
        """The model's chat template (Jinja source), if it has one."""
    @property
    def load_ms(self) -> float: ...
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text` as `kiln tokenize` gives them: BOS first when the model adds
        one (add_special), special-token text read as those tokens (parse_special)."""
    def detokenize(self, ids: Sequence[int], *, special: bool = False) -> str:
        """The text of token ids; control tokens are left out unless `special`."""
    @overload
    def complete(self, prompt: Union[str, list[int]], *, stream: Literal[False] = False, **sampling: Unpack[Sampling]) -> Completion: ...
    @overload
    def complete(self, prompt: Union[str, list[int]], *, stream: Literal[True], **sampling: Unpack[Sampling]) -> Stream: ...
    def complete(self, prompt: Union[str, list[int]], **sampling: Unpack[StreamingSampling]) -> Union[Completion, Stream]:
        """Raw completion of `prompt`, as `kiln run --raw` and /v1/completions: a string
        (tokenized with BOS as the model wants, special tokens parsed) or token ids."""
    @overload
    def chat(
        self,
        messages: Sequence[Message],
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        response_format: Optional[Mapping[str, Any]] = None,
        *,
        tool_choice: Optional[Union[str, Mapping[str, Any]]] = None,
        parallel_tool_calls: Optional[bool] = None,
        stream: Literal[False] = False,
        **sampling: Unpack[Sampling],
    ) -> Completion: ...
    @overload
    def chat(
        self,
        messages: Sequence[Message],
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        response_format: Optional[Mapping[str, Any]] = None,
        *,
        tool_choice: Optional[Union[str, Mapping[str, Any]]] = None,
        parallel_tool_calls: Optional[bool] = None,
        stream: Literal[True],
        **sampling: Unpack[Sampling],
    ) -> Stream: ...
    def chat(
        self,
        messages: Sequence[Message],
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        response_format: Optional[Mapping[str, Any]] = None,
        *,
        tool_choice: Optional[Union[str, Mapping[str, Any]]] = None,
        parallel_tool_calls: Optional[bool] = None,
        **sampling: Unpack[StreamingSampling],
    ) -> Union[Completion, Stream]:
        """A reply to `messages` with the model's chat template applied (as `kiln run` and
        /v1/chat/completions). `response_format` constrains the reply (see Sampling).
        `tools` are OpenAI's function tools ({"type": "function", "function": {"name",
        "description", "parameters"}}); `tool_choice` is "auto" (default), "none",
        "required" or {"type": "function", "function": {"name": ...}}; with
        parallel_tool_calls=False a reply makes one call at most. The model's calls come
        back in Completion.tool_calls (streamed: Piece.tool_calls), their arguments valid
        against each tool's schema; the text holds only the reply's content."""
    @overload
    def embed(
        self,
        texts: Union[str, Sequence[str]],
        *,
        pooling: Literal["mean", "last"] = "mean",
        normalize: bool = False,
        as_numpy: Literal[False] = False,
    ) -> list[list[float]]: ...
    @overload
    def embed(
        self,
        texts: Union[str, Sequence[str]],
        *,
        pooling: Literal["none"],
        normalize: bool = False,
        as_numpy: Literal[False] = False,
    ) -> list[list[list[float]]]: ...
    @overload
    def embed(
        self,
        texts: Union[str, Sequence[str]],
        *,
        pooling: Literal["mean", "last", "none"] = "mean",
        normalize: bool = False,
        as_numpy: Literal[True],
    ) -> Any: ...
    def embed(
        self,
        texts: Union[str, Sequence[str]],
        *,
        pooling: Literal["mean", "last", "none"] = "mean",
        normalize: bool = False,
        as_numpy: bool = False,
    ) -> Any:
        """Embeddings, as `kiln embed`: the hidden states after the final norm, pooled
        ("mean", "last", or "none": one row per token), scaled to unit length with
        normalize=True. One list of n_embd floats per text (a list of rows per text with
        pooling="none"). as_numpy=True returns a float32 ndarray of shape
        (len(texts), n_embd) (pooling="none": a list of (n_tokens, n_embd) arrays); it
        needs NumPy."""
    def session(self, *, context_shift: Optional[int] = None) -> "Session":
        """A new conversation. context_shift=n_keep: when the context fills, drop half of
        the tokens after the first n_keep (as llama.cpp) instead of stopping with
        finish_reason "context_full"."""

class Session:
    """One conversation on an Engine: its tokens, chat history and KV cache. Appends
    evaluate only what the cache lacks. Calls on one session take turns (a call waits for
    the running one); cancel() works from any thread. While a stream from the session is
    unfinished, other calls raise RuntimeError (waiting could deadlock its reader)."""

    @property
    def tokens(self) -> list[int]: ...
    @property
    def history(self) -> list[dict[str, Any]]:
        """append_chat's messages and the replies generated after them."""
    @property
    def n_evaluated(self) -> int:
        """Tokens run through the model so far (those reused from a cache not counted)."""
    def append_text(self, text: str) -> list[int]:
        """Tokenize (BOS first when the session is empty and the model wants one), append
        and evaluate `text`. Returns the new token ids."""
    def append_tokens(self, ids: Sequence[int]) -> None: ...
    def append_chat(
        self,
        messages: Sequence[Message],
        tools: Optional[Sequence[Mapping[str, Any]]] = None,
        *,
        tool_choice: Optional[Union[str, Mapping[str, Any]]] = None,
        parallel_tool_calls: Optional[bool] = None,
    ) -> list[int]:
        """Add messages to the chat history, render it with the chat template and evaluate
        what the cache lacks. Returns the whole rendered conversation's token ids.
        `tools`, `tool_choice` and `parallel_tool_calls` (as Engine.chat) hold for the
        following generates; when none is given, the previous append_chat's tools stay.
        Replies with calls join the history with their tool_calls; send results back as
        {"role": "tool", "tool_call_id": ..., "content": ...} messages."""
    @overload
    def generate(self, *, stream: Literal[False] = False, **sampling: Unpack[Sampling]) -> Completion: ...
    @overload
    def generate(self, *, stream: Literal[True], **sampling: Unpack[Sampling]) -> Stream: ...
    def generate(self, **sampling: Unpack[StreamingSampling]) -> Union[Completion, Stream]:
        """Generate from where the conversation stands; after append_chat the reply joins
        the history."""
    def cancel(self) -> None:
        """Stop this session's running append or generate (from any thread) at its next
        forward; a generation then ends with finish_reason "cancelled". A request made
        while nothing runs applies to the next call."""
    def reset(self) -> None:
        """Forget the conversation."""
    def save(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Write the conversation (tokens, chat history) to a file bound to the model."""
    def restore(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Replace the conversation with a saved one (same model file) and evaluate it."""

class Server:
    """A running server, from serve(..., block=False)."""

    @property
    def url(self) -> str:
        """The base URL, such as "http://127.0.0.1:8080" (OpenAI routes under /v1)."""
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    def stop(self) -> None:
        """Drain (requests in flight finish or are cancelled within 5 s) and stop."""
    def __enter__(self) -> "Server": ...
    def __exit__(
        self,
        ty: Optional[type[BaseException]],
        value: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None: ...

@overload
def serve(
    model: Union[str, "os.PathLike[str]"] = "smollm2-135m",
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    n_ctx: Optional[int] = None,
    device: Literal["auto", "cpu", "gpu"] = "auto",
    threads: Optional[int] = None,
    n_batch: Optional[int] = None,
    parallel: int = 8,
    queue: int = 64,
    alias: Optional[str] = None,
    api_key: Optional[str] = None,
    block: Literal[True] = True,
    draft_model: Optional[Union[str, "os.PathLike[str]"]] = None,
    lookup_ngram: Optional[int] = None,
    draft_max: int = 16,
    draft_min: int = 0,
    draft_p_min: float = 0.75,
) -> None: ...
@overload
def serve(
    model: Union[str, "os.PathLike[str]"] = "smollm2-135m",
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    n_ctx: Optional[int] = None,
    device: Literal["auto", "cpu", "gpu"] = "auto",
    threads: Optional[int] = None,
    n_batch: Optional[int] = None,
    parallel: int = 8,
    queue: int = 64,
    alias: Optional[str] = None,
    api_key: Optional[str] = None,
    block: Literal[False],
    draft_model: Optional[Union[str, "os.PathLike[str]"]] = None,
    lookup_ngram: Optional[int] = None,
    draft_max: int = 16,
    draft_min: int = 0,
    draft_p_min: float = 0.75,
) -> Server: ...
def serve(
    model: Union[str, "os.PathLike[str]"] = "smollm2-135m",
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    n_ctx: Optional[int] = None,
    device: Literal["auto", "cpu", "gpu"] = "auto",
    threads: Optional[int] = None,
    n_batch: Optional[int] = None,
    parallel: int = 8,
    queue: int = 64,
    alias: Optional[str] = None,
    api_key: Optional[str] = None,
    block: bool = True,
    draft_model: Optional[Union[str, "os.PathLike[str]"]] = None,
    lookup_ngram: Optional[int] = None,
    draft_max: int = 16,
    draft_min: int = 0,
    draft_p_min: float = 0.75,
) -> Optional[Server]:
    """Run kiln's OpenAI-compatible HTTP server (the routes and options of `kiln serve`)
    on `model` in this process. block=True serves until Ctrl-C, then drains and returns;
    block=False returns a Server once the model is loaded (port=0 lets the OS pick).
    draft_model, lookup_ngram and the draft_* settings speculate as in `Engine` (and
    `kiln serve -md`); usage then counts draft_tokens and accepted_tokens."""
