"""kiln's exceptions. Every error kiln reports is a KilnError; the subclasses say what
kind, and two also derive from the builtin that fits (ValueError, OSError)."""


class KilnError(Exception):
    """An error reported by kiln, with kiln's message."""


class InvalidArgumentError(KilnError, ValueError):
    """A value out of range or unusable: a context size, a sampling setting, a prompt too
    long for the context, a model name that is neither a file nor in the catalog..."""


class ModelError(KilnError):
    """The model file is malformed, or uses an architecture or tensor type kiln lacks."""


class TokenizerError(KilnError):
    """The model's tokenizer could not encode or load."""


class TemplateError(KilnError):
    """The model's chat template failed to compile or render (or it has none)."""


class GrammarError(KilnError):
    """A grammar, JSON schema or response format could not be compiled."""


class HubError(KilnError):
    """Fetching a catalog model failed."""


class BackendError(KilnError):
    """The device failed (no usable GPU for device="gpu", a GPU error...)."""


class KilnIOError(KilnError, OSError):
    """Reading or writing a file failed (a model, a session file...)."""
