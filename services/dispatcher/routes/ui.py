"""The web dashboard: `/` serves web-ui/index.html; its scripts and styles are mounted at /web."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse

router = APIRouter(include_in_schema=False)


@router.get("/")
def index(request: Request):
    web_dir: Path | None = request.app.state.web_dir
    if web_dir is None or not (web_dir / "index.html").is_file():
        return JSONResponse(
            {
                "errors": ["the web dashboard is not installed (no web-ui/index.html)"],
                "hint": "the REST API is described at /docs",
            },
            status_code=404,
        )
    return FileResponse(web_dir / "index.html", headers={"Cache-Control": "no-cache"})
