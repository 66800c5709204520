"""TaskManager: N slots; registers with the ResourceManager and heartbeats with a slot report;
runs tasks as supervised Spark driver processes (kept warm for free slots); reports execution
states to the JobManager; takes DeployTask/CancelTask commands from its own Celery queue."""
