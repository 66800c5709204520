"""Declares the bearer tokens in the OpenAPI document: a `bearerAuth` scheme, and on every operation
that needs a token the scheme and the least role (from the same table the middleware enforces,
services/dispatcher/guards/auth.py), so /docs and generated clients show what each call needs."""

from __future__ import annotations

from fastapi import FastAPI

from services.dispatcher.guards import auth

SCHEME = "bearerAuth"


def install(app: FastAPI) -> None:
    """Wraps whatever builds the document now (errors.py's 400-not-422 among them)."""
    build = app.openapi

    def openapi() -> dict:
        doc = build()  # cached by FastAPI after the first call: annotate it once
        if SCHEME not in doc.get("components", {}).get("securitySchemes", {}):
            annotate(doc, enforced=app.state.auth_required)
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def annotate(doc: dict, *, enforced: bool) -> None:
    state = "enforced on this server" if enforced else "not enforced on this server (auth off)"
    doc.setdefault("components", {}).setdefault("securitySchemes", {})[SCHEME] = {
        "type": "http",
        "scheme": "bearer",
        "description": f"A token from `headrace token create --role viewer|operator|admin`; {state}.",
    }
    for path, item in doc.get("paths", {}).items():
        for method, operation in item.items():
            if not isinstance(operation, dict):
                continue
            role = auth.required_role(method, path)
            if role is None:
                operation["security"] = []  # open: health, metrics, the documents themselves
                continue
            operation["security"] = [{SCHEME: []}]
            note = f"Needs a bearer token with role `{role}` or above."
            operation["description"] = f"{operation.get('description', '').rstrip()}\n\n{note}".strip()
