"""Submitting a job: the uploaded artifacts, the checks a submission passes before the job exists
(its entry function, its checkpoint directory option, the snapshot it restores and whether the
pipeline can start from it), and the warm, sandboxed planner that compatibility check runs in."""
