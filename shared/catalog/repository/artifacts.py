"""Uploaded artifacts (the jars of Flink's API): create, get, list, delete."""

from __future__ import annotations

from typing import Iterable, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from shared.catalog.models import Artifact
from shared.catalog.repository.rows import NotFound
from shared.ids import ArtifactId


def create_artifact(s: Session, *, id: ArtifactId, name: str, path: str, size: int, sha256: str) -> Artifact:
    row = Artifact(id=id, name=name, path=path, size=size, sha256=sha256)
    s.add(row)
    s.flush()
    return row


def get_artifact(s: Session, artifact_id: ArtifactId) -> Artifact:
    row = s.get(Artifact, artifact_id)
    if row is None:
        raise NotFound(f"artifact {artifact_id} not found")
    return row


def list_artifacts(s: Session) -> Sequence[Artifact]:
    return s.execute(select(Artifact).order_by(Artifact.uploaded_at)).scalars().all()


def delete_artifact(s: Session, artifact_id: ArtifactId) -> Artifact:
    row = get_artifact(s, artifact_id)
    s.delete(row)
    s.flush()
    return row


def find_artifact(s: Session, artifact_id: ArtifactId) -> Artifact | None:
    """The artifact, or None; from the session without SQL when it holds it already (`Session.get`)."""
    return s.get(Artifact, artifact_id)


def artifacts_by_ids(s: Session, artifact_ids: Iterable[ArtifactId]) -> Sequence[Artifact]:
    return s.execute(select(Artifact).where(Artifact.id.in_(list(artifact_ids)))).scalars().all()


def set_artifact_listing(s: Session, artifact_id: ArtifactId, listing: dict) -> None:
    """Record an artifact's listing, unless it is gone or has one already."""
    row = s.get(Artifact, artifact_id)
    if row is not None and row.listing is None:
        row.listing = listing
