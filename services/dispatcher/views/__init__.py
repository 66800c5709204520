"""What the API answers with: catalog rows as Flink's REST shapes (jobs, TaskManagers, checkpoints,
failures as Java throwables), the cached jobs overview, asynchronous operations and their status,
the processes' logs, a snapshot's sink, and the cluster-wide metrics."""
