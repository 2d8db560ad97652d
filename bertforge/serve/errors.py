"""Every error the server answers with: one status code and one line saying what to do.

Bodies follow the API the route imitates: text-embeddings-inference's
`{"error": "...", "error_type": "..."}`, and OpenAI's `{"error": {"message", "type", "code"}}`
under /v1, so the clients of either read our errors as theirs. The status codes are
text-embeddings-inference's: 400 empty input, 413 a body over the size limit, 422 malformed input or one over
an input limit (too many inputs, too many tokens: TEI's validation error since 1.9), 424 the model failed or the
feature is not loaded, 429 overloaded.
"""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

logger = logging.getLogger("bertforge.serve")
OPENAI_PREFIX = "/v1/"
HTTP_ERROR_TYPES = {404: "not_found", 405: "method_not_allowed", 408: "timeout", 413: "validation"}


class ApiError(Exception):
    """An answer other than 200: status code, a short machine-readable type, a message for people."""

    def __init__(self, status_code: int, error_type: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status_code, self.error_type, self.message, self.headers = status_code, error_type, message, headers


def error_body(path: str, status_code: int, error_type: str, message: str) -> dict:
    """An error's body in the shape of the API the path imitates (OpenAI's under /v1, else TEI's); the routes'
    handlers and the middlewares that refuse before a route runs (guards.py) answer with it."""
    if path.startswith(OPENAI_PREFIX):
        return {"error": {"message": message, "type": error_type, "param": None, "code": status_code}}
    return {"error": message, "error_type": error_type}


def error_response(request: Request, status_code: int, error_type: str, message: str,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(request.url.path, status_code, error_type, message), status_code=status_code,
                        headers=headers)


def error_response_for(request: Request, error: Exception) -> JSONResponse:
    """An exception raised while answering -> its answer: an ApiError's own, an HTTPException's (Starlette's, and
    the body guard's 408 / 413) in our shape, anything else a logged 500."""
    if isinstance(error, ApiError):
        return error_response(request, error.status_code, error.error_type, error.message, error.headers)
    if isinstance(error, HTTPException):
        cause = error.__cause__
        if isinstance(cause, UnicodeDecodeError):  # FastAPI says only "There was an error parsing the body"
            return error_response(request, 400, "validation", f"the request body is not valid UTF-8 (byte "
                                                              f"0x{cause.object[cause.start]:02x} at offset {cause.start});"
                                                              " send JSON encoded as UTF-8")
        error_type = HTTP_ERROR_TYPES.get(error.status_code, "http")
        return error_response(request, error.status_code, error_type, str(error.detail), getattr(error, "headers", None))
    logger.error("unexpected error on %s", request.url.path, exc_info=error)
    return error_response(request, 500, "backend", f"internal error ({type(error).__name__}); the server logged it")


def describe_validation_errors(errors: list[dict]) -> str:
    """pydantic's error list -> one line: `inputs: Input should be a valid string (got 3)`; ..."""
    parts = []
    for error in errors[:3]:
        location = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
        got = f" (got {error['input']!r:.60})" if "input" in error and error.get("type") != "missing" else ""
        parts.append(f"{location}: {error.get('msg', 'invalid')}{got}")
    more = f"; and {len(errors) - 3} more" if len(errors) > 3 else ""
    return "; ".join(parts) + more + "; see /docs for the request's schema"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError):
        return error_response_for(request, error)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError):
        errors = list(error.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            detail = next(e for e in errors if e.get("type") == "json_invalid").get("ctx", {}).get("error", "")
            return error_response(request, 400, "validation",
                                  f"the request body is not valid JSON ({detail}); send a JSON object")
        return error_response(request, 422, "validation", describe_validation_errors(errors))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException):
        return error_response_for(request, error)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception):
        return error_response_for(request, error)
