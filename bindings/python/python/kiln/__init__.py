"""kiln: a Rust-native LLM inference engine for GGUF models, in this process.

    >>> import kiln
    >>> engine = kiln.Engine("smollm2-135m")          # a .gguf path or a catalog name
    >>> print(engine.complete("The sky is", max_tokens=8, temperature=0))
    >>> for piece in engine.chat([{"role": "user", "content": "Hi!"}], stream=True):
    ...     print(piece.text, end="", flush=True)

See the type stub (kiln/__init__.pyi) or help(kiln.Engine) for the whole API.
"""

from ._errors import (
    BackendError,
    GrammarError,
    HubError,
    InvalidArgumentError,
    KilnError,
    KilnIOError,
    ModelError,
    TemplateError,
    TokenizerError,
)
from ._kiln import (
    SAMPLING_KEYWORDS,
    Completion,
    Engine,
    Piece,
    Server,
    Session,
    Stream,
    Timings,
    __version__,
    serve,
)

__all__ = [
    "Engine",
    "Session",
    "Completion",
    "Piece",
    "Stream",
    "Timings",
    "Server",
    "serve",
    "SAMPLING_KEYWORDS",
    "KilnError",
    "InvalidArgumentError",
    "ModelError",
    "TokenizerError",
    "TemplateError",
    "GrammarError",
    "HubError",
    "BackendError",
    "KilnIOError",
    "__version__",
]
