from __future__ import annotations

import logging
import os
import sys


def configure_logging(service: str) -> None:
    level = os.environ.get("HEADRACE_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=level, stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s",
    )
    for noisy in ("py4j", "celery.worker.strategy", "kombu"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
