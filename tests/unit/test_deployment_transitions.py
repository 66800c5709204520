"""A deployment's lifecycle as a table: `transition_deployment` (shared/catalog/repository/
deployments.py), the one writer of `deployments.lifecycle`, makes exactly the moves of
shared/states.py `DEPLOYMENT_START` and `DEPLOYMENT_TRANSITIONS` and refuses the others; and the
rules (shared/deployments.py `decide`) ask for exactly those moves: tried on many observed
deployments, none of their plans names a move the table refuses, and every move of the table is
asked for by some plan.

The observations are drawn (with a fixed seed) from every lifecycle, job, pending step, operation
and spec situation the rules tell apart, with one constraint the rules keep themselves: a pending
step is set in the same plan as the lifecycle it is waited for in (`PENDING_IN`), and no other
writer changes either while it waits."""

from __future__ import annotations

import random
import re
from dataclasses import replace
from typing import cast

import pytest
from sqlalchemy.orm import Session

from shared.catalog.models import DeploymentRow
from shared.catalog.repository.deployments import transition_deployment
from shared.deployments import DeploymentSpec, JobView, Observed, OperationView, decide
from shared.states import DEPLOYMENT_START, DEPLOYMENT_TRANSITIONS, IllegalTransition
from shared.states import Lifecycle as L

NEW = None  # a deployment never reconciled: its lifecycle is null


def legal(current: L | None, target: L) -> bool:
    return target in (DEPLOYMENT_START if current is None else DEPLOYMENT_TRANSITIONS[current])


def test_the_table_covers_every_state():
    assert set(DEPLOYMENT_TRANSITIONS) == set(L)
    assert DEPLOYMENT_START <= set(L)


@pytest.mark.parametrize(
    "current, target, moves",
    [
        (NEW, L.DEPLOYING, True),
        (NEW, L.SUSPENDED, True),
        (NEW, L.STABLE, False),
        (NEW, L.FAILED, False),
        (L.DEPLOYING, L.STABLE, True),
        (L.DEPLOYING, L.UPGRADING, False),
        (L.STABLE, L.UPGRADING, True),
        (L.STABLE, L.ROLLED_BACK, False),
        (L.UPGRADING, L.DEPLOYING, False),
        (L.ROLLING_BACK, L.ROLLED_BACK, True),
        (L.ROLLING_BACK, L.STABLE, False),
        (L.ROLLED_BACK, L.UPGRADING, True),
        (L.SUSPENDED, L.DEPLOYING, True),
        (L.SUSPENDED, L.STABLE, False),
        (L.SUSPENDED, L.FAILED, False),
        (L.FAILED, L.DEPLOYING, True),
    ],
)
def test_transition_deployment(current, target, moves):
    row = DeploymentRow(name="d", lifecycle=current.value if current else None)
    session = cast(Session, None)  # it needs no session: the caller holds the row
    if moves:
        assert transition_deployment(session, row, target) is row
        assert row.lifecycle == target.value
    else:
        named = current.value if current else "(new)"
        with pytest.raises(IllegalTransition, match=re.escape(f"deployment cannot go from {named} to {target.value}")):
            transition_deployment(session, row, target)
        assert row.lifecycle == (current.value if current else None)


@pytest.mark.parametrize("current", [NEW, *L])
@pytest.mark.parametrize("target", list(L))
def test_transition_deployment_makes_exactly_the_table_moves(current, target):
    row = DeploymentRow(name="d", lifecycle=current.value if current else None)
    if current == target:  # staying is no move: nothing changes, nothing is refused
        transition_deployment(cast(Session, None), row, target)
        assert row.lifecycle == target.value
    elif legal(current, target):
        transition_deployment(cast(Session, None), row, target)
        assert row.lifecycle == target.value
    else:
        with pytest.raises(IllegalTransition):
            transition_deployment(cast(Session, None), row, target)
        assert row.lifecycle == (current.value if current else None)


# --- the rules against the table ------------------------------------------------------------

V1 = DeploymentSpec(jar_id="jar-1", program_args=("v1",), config={"execution.checkpointing.interval": "500 ms"})
V2 = replace(V1, program_args=("v2",))
SPECS = (
    V1,
    V2,
    replace(V1, state="suspended"),
    replace(V2, state="suspended"),
    replace(V1, upgrade_mode="stateless"),
    replace(V2, upgrade_mode="last-state"),
    replace(V2, rollback_enabled=False),
    replace(V1, parallelism=3),
)


def _job(status: str = "RUNNING", running: bool | None = None, **kw) -> JobView:
    return JobView(
        id="job-1",
        status=status,
        terminal=status in ("FINISHED", "CANCELED", "FAILED"),
        running=status == "RUNNING" if running is None else running,
        **kw,
    )


JOBS = (
    None,
    _job(checkpoint_since_deploy=True, newest_checkpoint_age_s=0.1, latest_snapshot="chk", parallelism=1),
    _job(checkpoint_since_deploy=False),
    _job(running=False),
    _job("FAILED", latest_snapshot="chk", failure="x"),
    _job("CANCELED"),
    _job(checkpoint_since_deploy=True, newest_checkpoint_age_s=1e6, parallelism=1),
    _job(checkpoint_since_deploy=True, newest_checkpoint_age_s=0.1, parallelism=2),
    _job(failures_since_deploy=3),
)
PENDING = (
    None,
    {"kind": "wait", "until": 0},
    {"kind": "wait", "until": 1e12},
    {"kind": "savepoint", "purpose": "periodic", "op": "op"},
    *(
        {"kind": "stop", "purpose": p, "op": "op", "generation": 2, "parallelism": 2}
        for p in ("upgrade", "suspend", "delete", "rescale")
    ),
    *(
        {"kind": "ends", "purpose": p, "generation": 1, "restore": "latest"}
        for p in ("upgrade", "delete", "rollback", "restart")
    ),
    {"kind": "unknown"},
)
ANY = frozenset(L)
# The lifecycles each pending step is set with (shared/deployments.py, deployment_pending.py): a stop or end for a
# deletion, and a stop for a suspension, in whatever state the deployment was; the others with
# the state their plan moves to. Steps not listed (waits, periodic savepoints) name no state.
PENDING_IN = {
    ("stop", "delete"): ANY,
    ("ends", "delete"): ANY,
    ("stop", "suspend"): ANY - {L.SUSPENDED},
    ("stop", "upgrade"): {L.UPGRADING},
    ("stop", "rescale"): {L.UPGRADING},
    ("ends", "upgrade"): {L.UPGRADING},
    ("ends", "restart"): {L.DEPLOYING},
    ("ends", "rollback"): {L.ROLLING_BACK},
}
OPERATIONS = (
    None,
    OperationView("op", "IN_PROGRESS"),
    OperationView("op", "COMPLETED", "sp", done_s_ago=1),
    OperationView("op", "COMPLETED", "sp", done_s_ago=1000),
    OperationView("op", "FAILED", failure="f"),
)
# (generation, job's generation, stable generation, blocked generation)
GENERATIONS = (
    (1, 1, 1, None),
    (2, 1, 1, None),
    (2, 2, 1, None),
    (2, 2, None, None),
    (2, 1, 1, 2),
    (2, 2, 1, 2),
    (1, 1, None, None),
    (2, None, None, None),
    (3, 1, 1, 2),
)
SAMPLES = 40_000


def observations(seed: int = 7, n: int = SAMPLES):
    rng = random.Random(seed)
    for _ in range(n):
        lifecycle, pending = rng.choice((NEW, *L)), rng.choice(PENDING)
        allowed = PENDING_IN.get(((pending or {}).get("kind"), (pending or {}).get("purpose")))
        if allowed is not None and lifecycle not in allowed:
            continue
        generation, job_generation, stable, blocked = rng.choice(GENERATIONS)
        yield Observed(
            generation=generation,
            spec=rng.choice(SPECS),
            lifecycle=lifecycle,
            job=rng.choice(JOBS),
            job_generation=job_generation,
            stable_generation=stable,
            stable_spec=rng.choice((None, V1, V2, replace(V1, parallelism=3))),
            rollback_point=rng.choice((None, "rp")),
            last_savepoint=rng.choice((None, "ls")),
            blocked_generation=blocked,
            pending=pending,
            operation=rng.choice(OPERATIONS),
            deployed_s_ago=rng.choice((None, 5.0, 1e6)),
            deleting=rng.random() < 0.15,
            delete_with_savepoint=rng.random() < 0.5,
            rollback_requested=rng.random() < 0.2,
            savepoint_due=rng.random() < 0.3,
            now_s=100.0,
            parallelism=rng.choice((None, 1, 2)),
            scaled_from=rng.choice((None, None, 1)),
            blocked_spec=rng.choice((None, None, V1, V2)),
        )


def test_the_rules_ask_exactly_the_moves_of_the_table():
    asked: dict[tuple[L | None, L], str] = {}
    for o in observations():
        plan = decide(o)
        if plan.to is None or plan.to == o.lifecycle:
            continue
        assert legal(o.lifecycle, plan.to), f"the rules ask {o.lifecycle} -> {plan.to} ({plan.reason}) for {o}"
        asked.setdefault((o.lifecycle, plan.to), plan.reason)
    table = {(NEW, t) for t in DEPLOYMENT_START} | {(s, t) for s, ts in DEPLOYMENT_TRANSITIONS.items() for t in ts}
    assert set(asked) == table, f"moves of the table no rule asks for: {sorted(map(str, table - set(asked)))}"
