"""The embedded Celery broker's transport: kombu's SQLAlchemy transport (``settings.CELERY_BROKER_URL``
names this class when REDIS_URL is unset), made to drop an undecodable message instead of dying on it.

A message row is committed whole, so a reader never sees a half-written one (the filesystem transport's
failure). A row that is nevertheless not JSON (a disk error, someone editing the file) is logged and
skipped: kombu marks it taken before it decodes, so it is not met again, and the worker keeps serving.
"""

from __future__ import annotations

import logging
from queue import Empty

from kombu.transport import sqlalchemy as sqla

log = logging.getLogger(__name__)


class Channel(sqla.Channel):
    def _get(self, queue):
        try:
            return super()._get(queue)
        except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError
            log.error("embedded broker: dropped an undecodable message from %r: %s", queue, exc)
            raise Empty() from exc


class Transport(sqla.Transport):
    Channel = Channel
