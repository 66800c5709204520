"""POST /jars/upload, GET /jars and POST /jars/{jarid}/run: the run request and the jar responses."""

from __future__ import annotations

import shlex
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from services.dispatcher.guards.strict_fields import EntryName, StrictBool
from services.dispatcher.schemas.fields import JobIdStr, JobName, Kind, Parallelism, _Out, _Strict
from services.dispatcher.schemas.restart import RestartStrategy

# What a job's arguments may hold (issue 43.14). They are stored with the job, sent in every
# deploy command and shown by every GET of the job, deployment or schedule: 1,000 arguments of
# 10,000 characters would make each such answer 20 MB. A pipeline's arguments name tables, topics and
# options; a payload belongs in a file or a table the pipeline reads.
MAX_PROGRAM_ARGS = 256
MAX_PROGRAM_ARG_CHARS = 4096
MAX_PROGRAM_ARGS_CHARS = 64 * 1024


def program_args_problem(args: list[str]) -> str | None:
    """Why these arguments are too many or too long, naming the limit; None when they fit."""
    if len(args) > MAX_PROGRAM_ARGS:
        return f"{len(args)} program arguments; at most {MAX_PROGRAM_ARGS} are accepted"
    longest = max((len(a) for a in args), default=0)
    if longest > MAX_PROGRAM_ARG_CHARS:
        return (
            f"a program argument of {longest} characters; each may have at most {MAX_PROGRAM_ARG_CHARS} "
            f"(pass larger values in a file or table the pipeline reads)"
        )
    total = sum(len(a) for a in args)
    if total > MAX_PROGRAM_ARGS_CHARS:
        return f"program arguments of {total} characters in all; at most {MAX_PROGRAM_ARGS_CHARS} are accepted"
    return None


def check_program_args_bounds(args: list[str], subfield: str = "programArgsList") -> None:
    problem = program_args_problem(args)
    if problem is not None:
        raise PydanticCustomError(
            "program_args_bounds",
            "{problem}",
            {
                "subfield": subfield,
                "problem": problem,
                "expected": f"at most {MAX_PROGRAM_ARGS} arguments of at most {MAX_PROGRAM_ARG_CHARS} characters, "
                f"{MAX_PROGRAM_ARGS_CHARS} in all",
            },
        )


def check_program_args(text: str | None, listed: list[str] | None) -> None:
    """programArgs (one shell-quoted string) or programArgsList, not both; the string must split;
    the arguments within the bounds above."""
    if text is not None and listed is not None:
        raise PydanticCustomError(
            "confusing_args",
            "Confusing request: programArgs and programArgsList are both specified",
            {
                "subfield": "programArgs",
                "expected": "only one of programArgs / programArgsList",
                "hint": "use only programArgsList",
            },
        )
    if text is not None:
        try:
            split = shlex.split(text)
        except ValueError as exc:
            raise PydanticCustomError(
                "program_args",
                "cannot be split into arguments: {error}",
                {
                    "subfield": "programArgs",
                    "expected": "a shell-quoted argument string",
                    "error": str(exc),
                    "hint": "balance the quotes, or send programArgsList",
                },
            ) from None
        check_program_args_bounds(split, "programArgs")
    if listed is not None:
        check_program_args_bounds(listed)


class JarRunRequest(_Strict):
    """Flink's JarRunRequestBody plus Headrace's fields. Every field is optional."""

    entryClass: EntryName | None = Field(None, description="entry function of the module (default 'build')")
    parallelism: Parallelism | None = Field(None, description="Spark parallelism of each task (default 1)")
    programArgs: str | None = Field(None, description="program arguments as one string, split like a shell")
    programArgsList: list[str] | None = Field(None, description="program arguments as a list")
    jobId: JobIdStr | None = Field(None, description="32-hex job id; generated when absent")
    jobName: JobName | None = Field(None, description="default: the uploaded file's name without extension")
    restartStrategy: RestartStrategy | None = Field(None, description="default: the cluster's restart strategy")
    config: dict[str, Any] | None = Field(None, description="job configuration (Spark and Headrace options)")
    flinkConfiguration: dict[str, Any] | None = Field(None, description="merged into `config` (config wins)")
    kind: Kind | None = Field(None, description="'pyspark' (default) or 'noop' (runs nothing, for tests)")
    savepointPath: str | None = Field(
        None, description="start from this savepoint or retained checkpoint (a path, file:///path or file:/path)"
    )
    allowNonRestoredState: StrictBool | None = Field(
        None, description="drop snapshot state the new pipeline has no operator for"
    )
    claimMode: str | None = Field(None, description="NO_CLAIM (default) or CLAIM")
    restoreMode: str | None = Field(None, description="Flink's older name of claimMode (LEGACY reads as NO_CLAIM)")

    @model_validator(mode="after")
    def _one_way_of_args(self) -> "JarRunRequest":
        check_program_args(self.programArgs, self.programArgsList)
        return self

    def program_args(self) -> list[str] | None:
        if self.programArgsList is not None:
            return list(self.programArgsList)
        if self.programArgs is not None:
            return shlex.split(self.programArgs)
        return None


class JarUploadResponse(_Out):
    filename: str = Field(description="where the file is stored")
    status: Literal["success"] = "success"
    id: str = Field(description="the jar id to use in /jars/{jarid}/run")


class JarEntryInfo(_Out):
    name: str
    description: str | None = None


class JarFileInfo(_Out):
    id: str
    name: str
    uploaded: int = Field(description="epoch ms")
    entry: list[JarEntryInfo]
    sha256: str | None = Field(None, description="SHA-256 of the uploaded file (Headrace's addition)")


class JarListInfo(_Out):
    address: str
    files: list[JarFileInfo]


class JarRunResponse(_Out):
    jobid: str
