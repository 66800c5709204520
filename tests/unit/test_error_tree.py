"""Every exception class defined in services/ and shared/ is a HeadraceError, so a caller can
catch "anything Headrace raised" in one clause and the REST layer maps them in one table."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import services
import shared
from shared.errors import HeadraceError

# Control-flow signals that must pass through `except Exception`: BaseException on purpose.
SIGNALS = {
    "services.dispatcher.guards.limits._TooLarge",
    "services.dispatcher.guards.slow_clients.SlowBody",
    "services.taskmanager.runtime.runner._Terminate",
}
# The fork server's launcher runs with `python -S` and imports the standard library only.
STANDARD_LIBRARY_ONLY = {"services.taskmanager.runtime.python_forkserver._StoppedBeforeStart"}


def _modules() -> list[str]:
    names = []
    for package in (services, shared):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith("__main__") or ".migrations" in info.name:
                continue
            names.append(info.name)
    return sorted(names)


def _exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name and issubclass(cls, BaseException):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[k] for k in sorted(found)]


def test_the_walk_finds_the_known_exceptions():
    names = {c.__name__ for c in _exception_classes()}
    assert {"InvalidRestartStrategy", "NotFound", "StaleEpoch", "ApiError", "LeadershipLost"} <= names


@pytest.mark.parametrize("cls", _exception_classes(), ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_exception_is_a_headrace_error(cls):
    if f"{cls.__module__}.{cls.__qualname__}" in SIGNALS:
        assert not issubclass(cls, Exception), "a signal must pass through `except Exception`"
        return
    if f"{cls.__module__}.{cls.__qualname__}" in STANDARD_LIBRARY_ONLY:
        assert not issubclass(cls, HeadraceError) and cls.__module__.startswith("services.taskmanager.runtime.")
        return
    assert issubclass(cls, HeadraceError), f"{cls.__qualname__} should derive from an area of shared/errors.py"


def test_leadership_lost_is_not_a_catalog_error():
    from shared.catalog import repository
    from shared.errors import CoordinationError

    [lost] = [c for c in _exception_classes() if c.__name__ == "LeadershipLost"]
    assert issubclass(lost, CoordinationError)
    assert not issubclass(lost, repository.StaleEpoch)
