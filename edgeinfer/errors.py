"""Errors a user can trigger, carrying their OpenAI-shaped HTTP form."""

from __future__ import annotations


class EdgeInferError(Exception):
    """Base of all edgeinfer errors."""


class ConfigError(EdgeInferError):
    """models.toml or a command-line option is invalid."""


class ModelLoadError(EdgeInferError):
    """A model could not be loaded."""


class APIError(EdgeInferError):
    """An error returned to an API client as {"error": {...}}."""

    status = 500
    type = "server_error"

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None,
        status: int | None = None, headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        if status is not None:
            self.status = status

    def to_dict(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message, "type": self.type, "param": self.param, "code": self.code,
            }
        }


class InvalidRequest(APIError):
    status = 400
    type = "invalid_request_error"


class NotFound(APIError):
    status = 404
    type = "invalid_request_error"


class EngineError(APIError):
    """The engine failed to compute a request (llama_decode error, engine stopped)."""

    status = 500
    type = "server_error"


class Overloaded(APIError):
    """Too many requests waiting; the client should retry after ``retry_after`` seconds."""

    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, retry_after: int, status: int = 429,
                 code: str = "rate_limit_exceeded") -> None:
        super().__init__(message, code=code, status=status,
                         headers={"Retry-After": str(retry_after)})


class Unauthorized(APIError):
    status = 401
    type = "invalid_request_error"
