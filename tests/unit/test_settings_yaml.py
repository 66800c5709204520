"""The settings file named by HEADRACE_CONFIG (shared/settings.py): which file is read, what beats
what (arguments > HEADRACE_* > the file > defaults), how its keys may be spelled, and what an
operator is told about a file that is missing, unreadable YAML or not a mapping."""

from __future__ import annotations

import os

import pytest
import yaml

from shared.settings import Settings


@pytest.fixture
def config(tmp_path, monkeypatch):
    """Write the settings file and point HEADRACE_CONFIG at it; no other HEADRACE_* set."""
    for name in [k for k in os.environ if k.startswith("HEADRACE_")]:
        monkeypatch.delenv(name)
    path = tmp_path / "config.yaml"

    def write(text: str):
        path.write_text(text)
        monkeypatch.setenv("HEADRACE_CONFIG", str(path))
        return path

    return write


def test_arguments_beat_the_environment_which_beats_the_file_which_beats_defaults(config, monkeypatch):
    config("taskmanager_slots: 3\nheartbeat_timeout_s: 20\nzookeeper_root: /file\n")
    monkeypatch.setenv("HEADRACE_TASKMANAGER_SLOTS", "5")
    monkeypatch.setenv("HEADRACE_ZOOKEEPER_ROOT", "/env")
    s = Settings(zookeeper_root="/arg")
    assert (s.zookeeper_root, s.taskmanager_slots, s.heartbeat_timeout_s) == ("/arg", 5, 20)
    assert s.redis_url == Settings.model_fields["redis_url"].default


def test_keys_may_use_dashes_or_dots_and_unknown_keys_are_ignored(config):
    config("taskmanager-slots: 4\nheartbeat.timeout.s: 30\nno_such_setting: 1\nredis-url: redis://h:1/0\n")
    s = Settings()
    assert (s.taskmanager_slots, s.heartbeat_timeout_s, s.redis_url) == (4, 30, "redis://h:1/0")
    assert not hasattr(s, "no_such_setting")


def test_an_empty_file_or_no_file_gives_the_defaults(config, monkeypatch):
    config("")
    assert Settings().taskmanager_slots == Settings.model_fields["taskmanager_slots"].default
    monkeypatch.setenv("HEADRACE_CONFIG", "")
    assert Settings().taskmanager_slots == Settings.model_fields["taskmanager_slots"].default
    monkeypatch.delenv("HEADRACE_CONFIG")
    assert Settings().taskmanager_slots == Settings.model_fields["taskmanager_slots"].default


def test_the_file_is_read_at_each_construction(config):
    config("taskmanager_slots: 2\n")
    assert Settings().taskmanager_slots == 2
    config("taskmanager_slots: 7\n")
    assert Settings().taskmanager_slots == 7


def test_a_list_in_the_file_is_joined_like_the_environment_variable(config):
    config("allowed_hosts: [a.example, b.example]\n")
    assert Settings().allowed_hosts == "a.example,b.example"


def test_a_missing_file_is_refused_with_its_name(tmp_path, monkeypatch):
    missing = tmp_path / "nope.yaml"
    monkeypatch.setenv("HEADRACE_CONFIG", str(missing))
    with pytest.raises(ValueError) as caught:
        Settings()
    assert str(caught.value) == f"settings file {missing} does not exist (HEADRACE_CONFIG)"
    monkeypatch.setenv("HEADRACE_CONFIG", str(tmp_path))  # a directory is no file either
    with pytest.raises(ValueError, match="does not exist"):
        Settings()


@pytest.mark.parametrize("text", ["- a\n- b\n", "just words\n", "3\n"])
def test_a_file_that_is_no_mapping_is_refused(config, text):
    path = config(text)
    with pytest.raises(ValueError) as caught:
        Settings()
    assert str(caught.value) == f"settings file {path} must hold a mapping of setting: value"


def test_unreadable_yaml_raises_the_parsers_error(config):
    config("taskmanager_slots: [1, 2\n")
    with pytest.raises(yaml.YAMLError) as caught:
        Settings()
    assert not isinstance(caught.value, ValueError)  # not caught as a ValueError by shared/commands.py
    assert 'in "<unicode string>", line 2' in str(caught.value)


def test_a_bad_value_in_the_file_is_a_validation_error_naming_the_setting(config):
    config("taskmanager_slots: many\n")
    with pytest.raises(ValueError, match="taskmanager_slots"):
        Settings()
