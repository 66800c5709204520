"""A TaskManager's Spark driver processes: how one is started, confined (its OS user, home,
environment, cgroups, log) and ended; the warm pool and where a task's driver comes from; and what
its protocol events become for the JobManager."""
