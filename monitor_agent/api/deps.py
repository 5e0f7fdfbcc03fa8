"""Shared request dependencies: the optional bearer token, and access to app state."""

from __future__ import annotations

import hmac

from fastapi import HTTPException, Request


def require_write(request: Request) -> None:
    """Reject writes and admin calls without the configured bearer token (if one is set)."""
    token = request.app.state.settings.token_value()
    if token is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    # compare_digest: the time taken must not reveal how much of the token matched.
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
        raise HTTPException(
            status_code=401,
            detail="missing or invalid bearer token (send 'Authorization: Bearer <token>')",
            headers={"WWW-Authenticate": "Bearer"},
        )


def require_read(request: Request) -> None:
    """Reads are open unless ``auth_reads`` is set; then they need the token too."""
    if request.app.state.settings.auth_reads:
        require_write(request)
