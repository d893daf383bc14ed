"""Errors a user can trigger, one class per HTTP status, each with its OpenAI-style type.

Every error a client sees is one of these, rendered by one shaper
(``edgeinfer.api.errors``) as ``{"error": {"message", "type", "param", "code"}}``.
A class fixes the status and the type; an instance adds the message, the field
it concerns (``param``), a machine-readable ``code`` and extra headers.
"""

from __future__ import annotations

from typing import ClassVar


class EdgeInferError(Exception):
    """Base of all edgeinfer errors."""


class ConfigError(EdgeInferError):
    """models.toml or a command-line option is invalid."""


class ModelLoadError(EdgeInferError):
    """A model could not be loaded."""


class APIError(EdgeInferError):
    """An error returned to an API client; subclasses fix ``status`` and ``type``."""

    status: ClassVar[int] = 500
    type: ClassVar[str] = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None,
                 details: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.details = details  # Anthropic's error.details (its SDKs read error_code there)

    def to_dict(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class InvalidRequest(APIError):
    status = 400
    type = "invalid_request_error"


class ContextTooLong(InvalidRequest):
    """400 context_length_exceeded for a prompt (plus max_tokens) over the context, with
    the sizes, which Anthropic's dialect words its own way (Claude Code recovers from a
    too-long conversation only on that wording)."""

    def __init__(self, message: str, *, prompt_tokens: int, max_tokens: int, n_ctx: int,
                 param: str | None = None) -> None:
        super().__init__(message, param=param, code="context_length_exceeded")
        self.prompt_tokens, self.max_tokens, self.n_ctx = prompt_tokens, max_tokens, n_ctx

    @property
    def anthropic_message(self) -> str:
        if self.prompt_tokens >= self.n_ctx:
            return f"prompt is too long: {self.prompt_tokens} tokens > {self.n_ctx - 1} maximum"
        return ("input length and `max_tokens` exceed context limit: "
                f"{self.prompt_tokens} + {self.max_tokens} > {self.n_ctx}, decrease input "
                "length or `max_tokens` and try again")


class AuthenticationFailed(APIError):
    status = 401
    type = "authentication_error"


class PermissionDenied(APIError):
    status = 403
    type = "permission_error"


class NotFound(APIError):
    status = 404
    type = "invalid_request_error"  # as OpenAI's 404s (Anthropic's shape: not_found_error)


class MethodNotAllowed(APIError):
    status = 405
    type = "invalid_request_error"


class Conflict(APIError):
    status = 409
    type = "conflict_error"


class PayloadTooLarge(APIError):
    status = 413
    type = "invalid_request_error"  # (Anthropic's shape: request_too_large)


class RequestTimeout(APIError):
    """The client did not send its request body in time."""

    status = 408
    type = "invalid_request_error"


class UnsupportedMediaType(APIError):
    status = 415
    type = "invalid_request_error"


class ClientClosed(APIError):
    """The client closed the connection before its request body arrived (nothing can be
    answered; 499 as nginx counts it, in the logs and metrics, not an internal error)."""

    status = 499
    type = "invalid_request_error"


class Overloaded(APIError):
    """Too many requests waiting; the client should retry after ``retry_after`` seconds."""

    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, retry_after: int, *,
                 code: str = "rate_limit_exceeded") -> None:
        super().__init__(message, code=code, headers={"Retry-After": str(retry_after)})


class ServerError(APIError):
    status = 500
    type = "server_error"


class NotSupported(APIError):
    """The model cannot do what was asked (llama-server's 501, such as /infill without
    fill-in-the-middle tokens)."""

    status = 501
    type = "not_supported_error"


class EngineError(ServerError):
    """The engine failed to compute a request (llama_decode error, engine stopped)."""


class Unavailable(APIError):
    """Not now: a model loading, failed or without room, or the server shutting down."""

    status = 503
    type = "service_unavailable"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message, param=param, code=code, headers=(
            {"Retry-After": str(retry_after)} if retry_after is not None else None))


class Timeout(APIError):
    status = 504
    type = "timeout_error"
