"""Who may read a process's log files from its metrics port, and how its answer is known to be its
own (issue 43.4 and 43.11; docs/runbooks/logs.md).

A TaskManager's logs hold every task's driver log, the JobManager's what REST shows only to
operators. The metrics port is reachable from where the pipelines run, so `/logs` answers only a
request signed by the control plane: the dispatcher, which fetches them for an operator's
`GET /taskmanagers/{id}/logs` or `/jobmanager/logs`. The request carries its time and an HMAC of
its method, path, query and time under a key only the control plane and that process hold:

    TaskManager <id>      its command key (what it already checks the JobManager's commands with)
    a control-plane service   its service key (derived from the cluster secret it holds)

each in a domain of its own, so no such signature passes as a command or a message. A request
more than MAX_CLOCK_SKEW_S away from the server's clock is refused; within that window a copy is
as good as the original, and it reads only what the original's answer already carried.

The answer is signed too, with the process's sender key (a TaskManager's) or its service key,
over the request's signature, its status and its body: the dispatcher forwards only an answer
that proves to come from the process it asked. Where a TaskManager says it serves its logs is its
own claim, taken from its signed registration (the ResourceManager keeps it); a claim pointing at
some other server gets the dispatcher's request, never that server's answer back to the caller.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from shared.message_auth import MAX_CLOCK_SKEW_S

HEADER = "Authorization"
ANSWER_HEADER = "X-Headrace-Log-Signature"
SCHEME = "Headrace-Log"
_REQUEST = b"hr-log-request\0"
_ANSWER = b"hr-log-answer\0"
MAX_ENDPOINT_CHARS = 300


def _mac(key: bytes, *parts: bytes) -> str:
    return hmac.new(key, b"\0".join(parts), hashlib.sha256).hexdigest()


def sign_request(key: bytes, method: str, target: str, at: float | None = None) -> str:
    """The header value for `method target` (path?query, exactly as sent)."""
    stamp = str(int(time.time() if at is None else at))
    return f"{SCHEME} t={stamp},s={_mac(key, _REQUEST, method.upper().encode(), target.encode(), stamp.encode())}"


def request_signature(header: str | None) -> str | None:
    """The signature part of a request header (what the answer is bound to)."""
    fields = _fields(header)
    return fields.get("s") if fields else None


def _fields(header: str | None) -> dict[str, str] | None:
    if not header or not header.startswith(SCHEME + " "):
        return None
    out = {}
    for part in header[len(SCHEME) + 1 :].split(","):
        name, _, value = part.strip().partition("=")
        out[name] = value
    return out


@dataclass(frozen=True)
class LogGuard:
    """The server's side: `request_key` checks who asks, `answer_key` signs what it answers."""

    request_key: bytes
    answer_key: bytes

    def refusal(self, method: str, target: str, header: str | None, now: float | None = None) -> str | None:
        """Why this request may not read logs, or None."""
        fields = _fields(header)
        if fields is None or "t" not in fields or "s" not in fields:
            return (
                "log files are served only to the dispatcher (a request signed by the control plane): read "
                "them with GET /taskmanagers/{id}/logs or /jobmanager/logs and an operator's token"
            )
        try:
            at = int(fields["t"])
        except ValueError:
            return "the request's time is not a number"
        now = time.time() if now is None else now
        if abs(now - at) > MAX_CLOCK_SKEW_S:
            return (
                f"the request was signed {now - at:.0f} s from this server's clock; more than "
                f"{MAX_CLOCK_SKEW_S} s is refused (synchronise the hosts' clocks)"
            )
        expected = _mac(self.request_key, _REQUEST, method.upper().encode(), target.encode(), fields["t"].encode())
        if not hmac.compare_digest(expected, fields["s"]):
            return "the request's signature does not check out: it was not signed for this process"
        return None

    def sign_answer(self, header: str | None, status: int, body: bytes) -> str:
        return answer_signature(self.answer_key, request_signature(header) or "", status, body)


def answer_signature(key: bytes, request_sig: str, status: int, body: bytes) -> str:
    return _mac(key, _ANSWER, request_sig.encode(), str(status).encode(), body)


def answer_checks(key: bytes, request_header: str, status: int, body: bytes, signature: str | None) -> bool:
    if not signature:
        return False
    expected = answer_signature(key, request_signature(request_header) or "", status, body)
    return hmac.compare_digest(expected, signature)


def endpoint_problem(address: object) -> str | None:
    """Why `address` is not a log endpoint the dispatcher may fetch from: it must be
    http(s)://host:port, with no credentials, path, query or fragment. None when it is one."""
    if not isinstance(address, str) or not address or len(address) > MAX_ENDPOINT_CHARS:
        return f"not a URL of at most {MAX_ENDPOINT_CHARS} characters"
    try:
        parts = urlsplit(address)
        port = parts.port
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return f"its scheme is {parts.scheme!r}, not http or https"
    if not parts.hostname or port is None:
        return "it names no host and port (http://host:port)"
    if parts.username is not None or parts.password is not None:
        return "it carries credentials"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "it has a path, query or fragment (only http://host:port)"
    if any(c.isspace() or ord(c) < 32 for c in address):
        return "it holds white space or control characters"
    return None
