"""/taskmanagers: the registered TaskManagers and their slots, as the ResourceManager recorded them."""

from __future__ import annotations

from fastapi import APIRouter

from services.dispatcher import views
from services.dispatcher.deps import SessionDep
from services.dispatcher.errors import ApiError
from services.dispatcher.schemas import ErrorBody, TaskManagerDetailsInfo, TaskManagersInfo
from shared.catalog import repository
from shared.catalog.repository import NotFound

router = APIRouter(prefix="/taskmanagers", tags=["taskmanagers"])


@router.get("", response_model=TaskManagersInfo, summary="Registered TaskManagers")
def list_taskmanagers(session: SessionDep) -> dict:
    return views.taskmanagers(repository.list_taskmanagers(session))


@router.get("/{tmid}", response_model=TaskManagerDetailsInfo, responses={404: {"model": ErrorBody}},
            summary="One TaskManager (also a lost or unregistered one) with its allocated slots")
def taskmanager_details(tmid: str, session: SessionDep) -> dict:
    if not tmid or len(tmid) > 128 or any(ord(c) < 32 for c in tmid):
        row = None
    else:
        try:
            row = repository.get_taskmanager(session, tmid)
        except NotFound:
            row = None
    if row is None:
        raise ApiError.of(404, f"taskmanager {tmid!r} not found", field="tmid",
                          expected="the id of a TaskManager", hint="GET /taskmanagers lists the registered ones", prefix=False)
    return views.taskmanager_details(row)
