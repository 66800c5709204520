"""/auth/whoami: what the caller's token may do, so the dashboard can show its role (and hide
what it cannot do) without trying a change to find out."""

from __future__ import annotations

from fastapi import APIRouter, Request

from services.dispatcher.schemas import WhoAmI

router = APIRouter(prefix="/auth", tags=["auth"])


@router.get("/whoami", response_model=WhoAmI, summary="The role and name of the token this request carries")
def whoami(request: Request) -> dict:
    if not request.app.state.auth_required:
        # Everyone may do everything on this server: say so rather than pretend a role.
        return {"auth": "off", "role": "admin", "name": None}
    token = request.scope.get("state", {}).get("token")  # set by auth.RequireToken
    return {"auth": "required", "role": token.role, "name": token.name}
