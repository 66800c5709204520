"""The cluster secret and its derived keys (shared/cluster_keys.py)."""

import os

import pytest

from shared import cluster_keys as ck


def test_derived_keys_differ_by_name_and_purpose():
    secret = ck.parse_secret(ck.new_secret())
    assert ck.sender_key(secret, "tm-1") != ck.sender_key(secret, "tm-2")
    assert ck.sender_key(secret, "tm-1") != ck.command_key(secret, "tm-1")
    assert ck.redis_password(secret, "tm-1") != ck.redis_password(secret, "tm-2")
    other = ck.parse_secret(ck.new_secret())
    assert ck.sender_key(secret, "tm-1") != ck.sender_key(other, "tm-1")


def test_sign_and_verify():
    key = ck.command_key(ck.parse_secret(ck.new_secret()), "tm-1")
    sig = ck.sign(key, b"payload")
    assert ck.verify(key, b"payload", sig)
    assert ck.verify(key, b"payload", sig.encode())
    assert not ck.verify(key, b"payload!", sig)
    assert not ck.verify(key, b"payload", None)
    assert not ck.verify(key, b"payload", b"\xff\xfe")
    assert not ck.verify(ck.command_key(ck.parse_secret(ck.new_secret()), "tm-1"), b"payload", sig)


@pytest.mark.parametrize(
    "text, message", [("zz" * 32, "hexadecimal"), ("ab" * 8, "at least 32 bytes"), ("", "at least")]
)
def test_bad_secrets_are_refused_with_the_reason(text, message):
    with pytest.raises(ck.ClusterSecretError, match=message):
        ck.parse_secret(text)


def test_secret_file_is_created_private_and_reused(tmp_path):
    first = ck.load_or_create_secret(tmp_path / "secrets")
    assert (tmp_path / "secrets" / ck.SECRET_FILE).stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "secrets").stat().st_mode & 0o777 == 0o700
    assert ck.load_or_create_secret(tmp_path / "secrets") == first


def test_a_secret_file_readable_by_others_is_refused(tmp_path):
    ck.load_or_create_secret(tmp_path)
    os.chmod(tmp_path / ck.SECRET_FILE, 0o644)
    with pytest.raises(ck.ClusterSecretError, match="chmod 600"):
        ck.load_or_create_secret(tmp_path)
