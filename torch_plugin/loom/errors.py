"""The one exception type of loom's Python API.

Every failure the API can report (bad configuration, PyTorch or CUDA
missing, CUDA initialised too early, a plan file that cannot be loaded, a
libloom call that failed) is a `LoomError` whose message says what went
wrong and what to do. Errors from lower layers are re-raised `from None`,
so a user sees one line of explanation, not a chain of tracebacks.
"""


class LoomError(RuntimeError):
    """A loom API call failed; the message says why and what to do."""


class NativeError(LoomError):
    """A libloom.so call failed. `code` is loom's status code (see
    base/status.h), `message` libloom's own explanation."""

    def __init__(self, call, code, message):
        self.call = call
        self.code = code
        self.message = message
        super().__init__(f"{call} failed: {message or f'status code {code}'}")
