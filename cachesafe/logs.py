"""Logging filters: expected states are logged as what they are."""

from __future__ import annotations

import logging


class ExpectedUnavailable(logging.Filter):
    """`/healthz` answers 503 until the worker and beat are up (and `serve` polls it while they
    start): a state to report at INFO, not an ERROR a reader should chase."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        if (
            getattr(record, "status_code", None) == 503
            and getattr(request, "path", "") == "/healthz"
        ):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True
