"""set_autogroup_nice against the kernel's answers, with /proc stood in for: a container's root
(no CAP_SYS_ADMIN) gets EAGAIN for a second write within 100 ms, which is waited out, not logged
as a failure."""

from __future__ import annotations

from shared import cpu_priority


class _Proc:
    def __init__(self, refusals: int, error: type[OSError] = BlockingIOError):
        self.refusals, self.error, self.written = refusals, error, []

    def open(self, path, mode="r"):
        proc = self

        class _File:
            def __enter__(self):
                return self

            def write(self, text):
                self.text = text

            def __exit__(self, *exc):  # the kernel answers when the write is flushed, at close
                if proc.refusals > 0:
                    proc.refusals -= 1
                    raise proc.error(11, "refused")
                proc.written.append((path, self.text))

        return _File()


def test_a_rate_limited_write_is_tried_again(monkeypatch):
    proc = _Proc(refusals=2)
    monkeypatch.setattr(cpu_priority, "open", proc.open, raising=False)
    monkeypatch.setattr(cpu_priority, "AUTOGROUP_WRITE_PAUSE_S", 0.0)
    assert cpu_priority.set_autogroup_nice(1234, 19) is True
    assert proc.written == [("/proc/1234/autogroup", "19")]


def test_it_gives_up_after_its_tries_and_on_other_errors(monkeypatch, caplog):
    monkeypatch.setattr(cpu_priority, "AUTOGROUP_WRITE_PAUSE_S", 0.0)
    always = _Proc(refusals=cpu_priority.AUTOGROUP_WRITE_TRIES)
    monkeypatch.setattr(cpu_priority, "open", always.open, raising=False)
    assert cpu_priority.set_autogroup_nice(1234, 0) is False
    denied = _Proc(refusals=1, error=PermissionError)
    monkeypatch.setattr(cpu_priority, "open", denied.open, raising=False)
    assert cpu_priority.set_autogroup_nice(1234, 0) is False
    assert denied.refusals == 0 and not denied.written  # tried once: a refusal is not waited out
    assert caplog.text.count("could not set the autogroup nice") == 2
