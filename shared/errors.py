"""The error tree: every exception Headrace raises derives from `HeadraceError`, under one area.

    HeadraceError
      ConfigError       a value from a user or an operator that cannot be used (options,
                        restart strategies, durations, schedules, tokens, storage roots, artifacts)
      NotFoundError     a catalog row that does not exist
      CoordinationError leadership and fencing: a stale epoch, a lost lease, ZooKeeper away
      MessageError      a message or queue item that cannot be decoded or is refused
      StateError        checkpoints and savepoints that cannot be written or restored
      TaskError         a task's runtime on a TaskManager (sinks, executors, the driver user)
      ClusterError      the ways to run Headrace locally (`headrace up`, a Spark standalone)
      RequestError      the REST layer's own answers (services/dispatcher/errors.py)

The classes themselves stay in the modules that raise them, and most keep a built-in base
beside their area (ValueError, LookupError, RuntimeError), so `except ValueError` around a
parser still catches it. The REST layer maps areas and classes to status codes in one table
(services/dispatcher/errors.py `STATUS_BY_ERROR`).

Control-flow signals that must pass through `except Exception` (a driver's termination, a
request body too slow or too large) derive from BaseException on purpose and stay outside.
"""

from __future__ import annotations


class HeadraceError(Exception):
    """The base of every exception Headrace raises."""


class ConfigError(HeadraceError):
    """A value from a user or an operator that Headrace cannot use."""


class NotFoundError(HeadraceError):
    """A catalog row that does not exist."""


class CoordinationError(HeadraceError):
    """Leadership and fencing: this process may no longer act for the cluster."""


class MessageError(HeadraceError):
    """A message or queue item that cannot be decoded, or that is refused."""


class StateError(HeadraceError):
    """A checkpoint or savepoint that cannot be written, read or restored."""


class TaskError(HeadraceError):
    """A task's runtime on a TaskManager cannot go on."""


class ClusterError(HeadraceError):
    """A local cluster (`headrace up`) or a Spark standalone cluster cannot be started or reached."""


class RequestError(HeadraceError):
    """An answer of the REST layer, with its status code."""
