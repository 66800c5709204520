"""Request and response shapes of /jobs/schedules (scheduled submissions). The request takes the
fields of POST /jars/{jarid}/run that make sense for a job started again and again, plus when
(`cron` or `everySeconds`) and the policies; the responses are what the dashboard's Schedules
page reads."""

from __future__ import annotations

import shlex
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.dispatcher.guards.strict_fields import EntryName, StrictBool
from services.dispatcher.schemas.fields import IntRange, JobName, Kind, Parallelism, _Strict
from services.dispatcher.schemas.jars import check_program_args
from services.dispatcher.schemas.restart import RestartStrategy
from shared import schedules as sch

Overlap = Literal["skip", "queue", "cancel_previous"]
MAX_EVERY_S = 366 * 86400  # a year: longer intervals are cron's business


class ScheduleCreateRequest(_Strict):
    name: JobName | None = Field(
        None,
        description="the schedule's name, also each run's job name (default: the jar's file name without extension)",
    )
    jarId: str = Field(description="the uploaded jar to run (POST /jars/upload)", max_length=160)
    entryClass: EntryName | None = Field(None, description="entry function of the module (default 'build')")
    kind: Kind | None = Field(None, description="'pyspark' (default) or 'noop' (runs nothing, for tests)")
    programArgs: str | None = Field(None, description="program arguments as one string, split like a shell")
    programArgsList: list[str] | None = Field(None, description="program arguments as a list")
    parallelism: Parallelism | None = Field(None, description="Spark parallelism of each run (default 1)")
    config: dict[str, Any] | None = Field(None, description="job configuration of each run")
    restartStrategy: RestartStrategy | None = Field(None, description="default: the cluster's restart strategy")
    cron: str | None = Field(
        None,
        max_length=255,
        description="5-field cron expression, UTC: minute hour day-of-month month day-of-week, e.g. '*/5 * * * *'",
    )
    everySeconds: Annotated[int, IntRange(1, MAX_EVERY_S)] | None = Field(
        None, description="instead of cron: a tick every N seconds (at multiples of N since the Unix epoch)"
    )
    overlap: Overlap | None = Field(
        "skip",
        description="when the previous run has not ended: skip the tick, queue it (at "
        "most one waits), or cancel_previous and run the new one",
    )
    misfireGraceSeconds: Annotated[int, IntRange(0, sch.MAX_MISFIRE_GRACE_S)] | None = Field(
        sch.DEFAULT_MISFIRE_GRACE_S,
        description="after a leader change or downtime, the newest missed tick still "
        "runs if it is at most this old; older ones are skipped_misfire",
    )
    enabled: StrictBool | None = Field(True, description="false: created paused (null: the default)")

    @model_validator(mode="after")
    def _one_way_of_args(self) -> "ScheduleCreateRequest":
        check_program_args(self.programArgs, self.programArgsList)
        return self

    def program_args(self) -> list[str]:
        if self.programArgsList is not None:
            return list(self.programArgsList)
        if self.programArgs is not None:
            return shlex.split(self.programArgs)
        return []


class ScheduleUpdateRequest(_Strict):
    enabled: StrictBool = Field(
        description="false pauses the schedule, true resumes it (from the next tick: "
        "ticks that fell while paused are not run)"
    )


class _Out(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")


class ScheduleCreated(_Out):
    id: str


class ScheduleRunInfo(_Out):
    tick: int = Field(description="the nominal tick, ms since the epoch")
    jobId: str | None = Field(description="the run's job (null when the tick was skipped or still queued)")
    outcome: str = Field(
        description="submitted | queued | skipped_overlap | skipped_misfire | skipped_missing_jar | skipped_deleted"
    )
    time: int = Field(description="when the tick was handled, ms since the epoch")


class ScheduleInfo(_Out):
    id: str
    name: str
    jarId: str
    entryClass: str
    kind: str
    parallelism: int
    programArgs: list[str]
    cron: str | None
    everySeconds: int | None
    overlap: str
    misfireGraceSeconds: int
    enabled: bool
    createdAt: int
    nextFire: int | None = Field(description="the next tick, ms since the epoch (null while paused)")
    lastFire: int | None = Field(description="the last tick that ran, ms since the epoch")
    lastJobId: str | None = Field(description="the job of the newest run that has one")
    lastOutcome: str | None = Field(description="the outcome of the newest tick")
    runs: int = Field(description="ticks recorded")


class ScheduleDetail(ScheduleInfo):
    history: list[ScheduleRunInfo] = Field(description="the newest 50 ticks, newest first")


class ScheduleList(_Out):
    schedules: list[ScheduleInfo]
