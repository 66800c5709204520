from __future__ import annotations

import logging
import sys


def configure_logging(service: str, level: str) -> None:
    """Log to stderr at `level` (the setting log_level), each line naming the service."""
    level = level.upper()
    logging.basicConfig(
        level=level, stream=sys.stderr, format=f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s"
    )
    for noisy in ("py4j", "celery.worker.strategy", "kombu"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
