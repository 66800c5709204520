"""The tasks a TaskManager runs: the record of each and the slots they hold, their state reports
(held while a burst of commands is handled), their start-up timeout, no-op tasks, the checks
before a task's pipeline file may run, the storage it is handed and the sink directories it claims."""
