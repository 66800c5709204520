"""The cost of signing one control-plane message (HMAC-SHA256 of a 300-byte envelope), three ways,
interleaved in one run (the machine is noisy: compare the ratios, not the absolute figures):

  new       hmac.new(key, payload, sha256) per message (keys the HMAC every time)
  pads      the two padded-key SHA-256 states computed once, copied per message (written by hand)
  copy      the standard library's HMAC keyed once, .copy() per message (shared/message_auth.py)

usage: python bench/message_mac.py [--messages 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shared.message_auth import KeyedMac


def by_hand(key: bytes):
    block = key.ljust(64, b"\0")
    inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
    outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))

    def sign(payload: bytes) -> str:
        i = inner.copy()
        i.update(payload)
        o = outer.copy()
        o.update(i.digest())
        return o.hexdigest()

    return sign


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    key, payload = os.urandom(32), os.urandom(300)
    ways = {
        "new": lambda p: hmac.new(key, p, hashlib.sha256).hexdigest(),
        "pads": by_hand(key),
        "copy": KeyedMac(key).hexdigest,
    }
    assert len({sign(payload) for sign in ways.values()}) == 1
    per: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, sign in ways.items():
            t0 = time.perf_counter()
            for _ in range(args.messages):
                sign(payload)
            per[name].append((time.perf_counter() - t0) / args.messages * 1e6)
    for name, values in per.items():
        print(
            f"{name:5s} median {statistics.median(values):.2f} us per message "
            f"(rounds {', '.join(f'{v:.2f}' for v in values)})"
        )
    print(
        f"copy / pads {statistics.median(per['copy']) / statistics.median(per['pads']):.2f}, "
        f"copy / new {statistics.median(per['copy']) / statistics.median(per['new']):.2f}"
    )


if __name__ == "__main__":
    main()
