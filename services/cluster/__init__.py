"""What `headrace up` and `headrace demo` start and supervise on one machine: the local cluster
(local_cluster), its child processes (child_processes) and their supervisor (process_supervisor),
a Spark standalone master and workers (spark_standalone), the Redis ACL users and passwords
(redis_auth) and the TaskManagers' own credentials (taskmanager_credentials); also the compose
stack's credential files (compose_credentials) and the clickstream demo (demo)."""
