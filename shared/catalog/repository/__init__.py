"""The services' one door to the catalog: every read and write, inside the caller's transaction
(`Catalog.session()`); no service module builds a query of its own. The status of a job, an
attempt, a checkpoint, an operation or a deployment's lifecycle changes through one function each
(`transition_job`, `transition_execution`, `transition_checkpoint`, `finish_operation`,
`transition_deployment`), which keeps to its state machine (shared/states.py): a transition
refuses a move the machine forbids (IllegalTransition), and an operation ends once (a later end
changes nothing). The rest of a deployment's status (its job, generations, pending step, error)
the JobManager's services/jobmanager/deployment_reconciler.py sets on the row it holds locked
(the autoscaler its parallelism).

JobManager writes are fenced twice. The `leadership` row holds the newest leader epoch: a leader
claims it when it takes over (`claim_leadership`) and every unit of work locks it and checks its
own epoch just before committing (`check_leadership`), so a deposed leader commits nothing at
all, whichever rows it touched. And a job row remembers the newest epoch that wrote it
(`StaleEpoch` for an older one).

One module per entity; this package re-exports their functions, so callers write
`repository.create_job(...)` (a deployment's are called through their module,
`repository.deployments`).
"""

from shared.catalog.repository.artifacts import (
    artifacts_by_ids,
    create_artifact,
    delete_artifact,
    find_artifact,
    get_artifact,
    list_artifacts,
    set_artifact_listing,
)
from shared.catalog.repository.checkpoints import (
    completed_checkpoints_of,
    completed_durations_by_kind,
    completed_pointer_rows,
    count_checkpoints_by_kind_and_status,
    count_job_checkpoints_by_status,
    create_checkpoint,
    get_checkpoint,
    is_completed_snapshot,
    list_checkpoints,
    lock_completed_snapshots,
    max_checkpoint_id,
    newest_checkpoint_ack,
    newest_completed_of_running_jobs,
    newest_snapshot_path,
    pending_checkpoints,
    snapshot_owner,
    transition_checkpoint,
)
from shared.catalog.repository.executions import (
    add_scheduled_plans,
    allocation_holder_states,
    count_executions_by_state,
    count_restarted_attempts,
    create_execution,
    create_vertex,
    execution_states,
    executions_in_states,
    failed_executions_since,
    find_execution,
    find_vertex,
    get_execution,
    job_executions,
    job_vertices,
    latest_attempt_states,
    latest_executions,
    live_executions_on,
    live_executions_on_any,
    live_placements,
    record_progress,
    set_execution_restore,
    set_execution_waiting_reason,
    set_vertex_parallelism,
    transition_execution,
    vertex_executions,
    vertex_ids_by_job,
    vertices_of_jobs,
)
from shared.catalog.repository.jobs import (
    add_job_transitions,
    count_jobs_by_status,
    count_transitions_to,
    create_job,
    find_job,
    get_job,
    job_exceptions,
    job_overview_rows,
    job_state_timestamps,
    job_statuses,
    job_transitions,
    list_jobs,
    newest_exception,
    newest_job_epoch,
    record_exception,
    set_checkpoint_failures,
    set_job_waiting_reason,
    set_restart_state,
    transition_job,
)
from shared.catalog.repository.leadership import LEADERSHIP_ROW, check_leadership, claim_leadership, leadership_epoch
from shared.catalog.repository.operations import (
    create_operation,
    finish_operation,
    get_operation,
    job_operations,
    set_operation_checkpoint,
)
from shared.catalog.repository.outbox import add_outbox, count_outbox, delete_outbox, pending_outbox
from shared.catalog.repository.rows import NotFound, StaleEpoch, lock_rows, next_value, pin
from shared.catalog.repository.schedules import (
    advance_schedule,
    create_schedule,
    create_scheduled_job,
    delete_schedule,
    due_schedule_ids,
    due_schedules,
    get_schedule,
    last_schedule_job,
    latest_schedule_runs,
    list_schedules,
    queued_schedule_runs,
    record_schedule_run,
    schedule_run_counts,
    schedule_runs,
    set_schedule_enabled,
    set_schedule_run,
)
from shared.catalog.repository.taskmanagers import (
    get_taskmanager,
    list_taskmanagers,
    mark_taskmanager_gone,
    record_taskmanager_losses,
    register_taskmanager,
    register_taskmanagers,
    touch_taskmanagers,
    update_taskmanager_slots,
)
from shared.states import IllegalTransition

__all__ = [
    "IllegalTransition", "LEADERSHIP_ROW", "NotFound", "StaleEpoch", "add_job_transitions", "add_outbox",
    "add_scheduled_plans", "advance_schedule", "allocation_holder_states", "artifacts_by_ids", "check_leadership",
    "claim_leadership", "completed_checkpoints_of", "completed_durations_by_kind", "completed_pointer_rows",
    "count_checkpoints_by_kind_and_status", "count_executions_by_state", "count_job_checkpoints_by_status",
    "count_jobs_by_status", "count_outbox", "count_restarted_attempts", "count_transitions_to", "create_artifact",
    "create_checkpoint", "create_execution", "create_job", "create_operation", "create_schedule",
    "create_scheduled_job", "create_vertex", "delete_artifact", "delete_outbox", "delete_schedule", "due_schedule_ids",
    "due_schedules", "execution_states", "executions_in_states", "failed_executions_since", "find_artifact",
    "find_execution", "find_job", "find_vertex", "finish_operation", "get_artifact", "get_checkpoint", "get_execution",
    "get_job", "get_operation", "get_schedule", "get_taskmanager", "is_completed_snapshot", "job_exceptions",
    "job_executions", "job_operations", "job_overview_rows", "job_state_timestamps", "job_statuses", "job_transitions",
    "job_vertices", "last_schedule_job", "latest_attempt_states", "latest_executions", "latest_schedule_runs",
    "leadership_epoch", "list_artifacts", "list_checkpoints", "list_jobs", "list_schedules", "list_taskmanagers",
    "live_executions_on", "live_executions_on_any", "live_placements", "lock_completed_snapshots", "lock_rows",
    "mark_taskmanager_gone", "max_checkpoint_id", "newest_checkpoint_ack", "newest_completed_of_running_jobs",
    "newest_exception", "newest_job_epoch", "newest_snapshot_path", "next_value", "pending_checkpoints",
    "pending_outbox", "pin", "queued_schedule_runs", "record_exception", "record_progress", "record_schedule_run",
    "record_taskmanager_losses", "register_taskmanager", "register_taskmanagers", "schedule_run_counts",
    "schedule_runs", "set_artifact_listing", "set_checkpoint_failures", "set_execution_restore",
    "set_execution_waiting_reason", "set_job_waiting_reason", "set_operation_checkpoint", "set_restart_state",
    "set_schedule_enabled", "set_schedule_run", "set_vertex_parallelism", "snapshot_owner", "touch_taskmanagers",
    "transition_checkpoint", "transition_execution", "transition_job", "update_taskmanager_slots", "vertex_executions",
    "vertex_ids_by_job", "vertices_of_jobs",
]
