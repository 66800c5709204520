"""JobManager: turns submissions into execution plans, asks the ResourceManager for slots,
deploys tasks to TaskManagers, tracks job and execution state, applies restart strategies."""
