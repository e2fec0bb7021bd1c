"""The API server's refusals as exceptions that say which object and why.

Callers: the adapter (`kube.adapter`, which re-exports them: callers import them from there) and its
watch stream (`kube.watch`) turn an error response into one of these.
"""

from __future__ import annotations

import requests


class ApiError(Exception):
    """The API server said no; `status` is the HTTP code, `reason` its StatusReason."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    """A resourceVersion or UID precondition failed: someone wrote first."""


class AlreadyExists(ApiError):
    pass


class Invalid(ApiError):
    """The object broke a schema or validation rule (HTTP 422)."""


class Forbidden(ApiError):
    pass


def error_of(response: requests.Response, what: str) -> ApiError:
    reason, message = "", response.text
    try:
        status = response.json()
        reason = status.get("reason", "")
        message = status.get("message", message)
    except ValueError:
        pass
    code = response.status_code
    text = f"{what}: {message}"
    if code == 404:
        return NotFound(code, reason, text)
    if code == 409:
        cls: type[ApiError] = AlreadyExists if reason == "AlreadyExists" else Conflict
        return cls(code, reason, text)
    if code == 422:
        return Invalid(code, reason, text)
    if code == 403:
        return Forbidden(code, reason, text)
    return ApiError(code, reason, text)
