"""How long a driver handed a task may take to become ready follows the job's start-up timeout,
with a floor for the JVM's own start (a slow machine once missed a fixed 120 s)."""

from services.taskmanager.tasks.startup import MIN_DRIVER_START_TIMEOUT_S, driver_start_timeout_s, startup_timeout_s


def test_a_longer_startup_timeout_gives_the_driver_as_long():
    assert driver_start_timeout_s(600.0) == 600.0


def test_a_short_startup_timeout_keeps_the_floor_for_the_jvm():
    assert driver_start_timeout_s(3.0) == MIN_DRIVER_START_TIMEOUT_S


def test_the_job_option_is_read_as_a_flink_duration():
    assert driver_start_timeout_s(startup_timeout_s({"headrace.task.startup-timeout": "10 min"}, 300.0)) == 600.0
    assert driver_start_timeout_s(startup_timeout_s({}, 300.0)) == 300.0
