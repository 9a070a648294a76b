"""The few named errors tieredkv raises. Anything a user, a file or the network can cause is one
of these (or a 4xx at the HTTP layer), never a bare traceback."""


class TieredKVError(Exception):
    """Base class of every error tieredkv raises on purpose."""


class ConfigError(TieredKVError, ValueError):
    """A configuration value is invalid; the message names the field and the value."""


class ModelLoadError(TieredKVError):
    """A model path is missing, unsupported, truncated or corrupt."""


class UnsupportedModelError(ModelLoadError):
    """The model exists but uses an architecture or option tieredkv cannot serve correctly."""


class OutOfPagesError(TieredKVError):
    """A pool has fewer free pages than were asked for."""


class DiskStoreError(TieredKVError):
    """The disk tier cannot be opened or used (locked, unwritable, wrong format)."""


class RequestError(TieredKVError, ValueError):
    """A request is invalid; maps to HTTP 400 with OpenAI's error shape."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
