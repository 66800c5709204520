"""A TaskManager whose registration is not answered resends it with a doubling delay (capped at
half the heartbeat timeout) instead of every heartbeat interval; an answer resets the delay."""

from services.taskmanager.rm_link import LinkState, registration_due


def sends(st: LinkState, times: list[float]) -> list[float]:
    return [t for t in times if registration_due(st, t, interval_s=1.0, timeout_s=10.0)]


def test_unanswered_registration_backs_off_to_half_the_timeout():
    st = LinkState("tm-1")
    assert sends(st, [float(t) for t in range(0, 40)]) == [0.0, 1.0, 3.0, 7.0, 12.0, 17.0, 22.0, 27.0, 32.0, 37.0]


def test_an_answer_resets_the_backoff():
    st = LinkState("tm-1")
    sends(st, [0.0, 1.0, 3.0, 7.0])  # the delay is 8 s now
    st.registration_sent = None  # what _on_ack does
    assert sends(st, [7.5, 8.0, 8.5, 9.0]) == [7.5, 8.5]
