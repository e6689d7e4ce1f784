"""What Django's error reports may show. Its default filter hides settings named like KEY, TOKEN or
PASS, but not ``DATABASE_URL``, ``REDIS_URL``, ``CELERY_BROKER_URL`` or the channel layer's hosts,
which carry their passwords inside a URL. DEBUG is off by default (settings.py); this is the second
line, for the day someone turns it on."""

from __future__ import annotations

import re
from typing import Any

from django.views.debug import SafeExceptionReporterFilter

# user:password@ inside any URL-shaped string: scheme://user:secret@host -> scheme://user:********@host
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@\s]+(?=@)", re.IGNORECASE)


def scrub_url_passwords(value: str) -> str:
    return _URL_PASSWORD.sub(
        lambda m: m.group("head") + SafeExceptionReporterFilter.cleansed_substitute, value
    )


class SecretSafeReporterFilter(SafeExceptionReporterFilter):
    """Django's filter, plus: any string setting or request header (recursively, in dicts and lists)
    and any string local of a traceback frame loses the password of a URL it contains."""

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        cleansed = super().cleanse_setting(key, value)
        if (
            type(cleansed) is str
        ):  # not isinstance: lazy objects (django-axes' settings) pose as str
            return scrub_url_passwords(cleansed)
        return cleansed

    def get_traceback_frame_variables(self, request, tb_frame):
        """A frame's local strings too (a URL read into a variable before a connection failed)."""
        return [
            (name, scrub_url_passwords(value) if type(value) is str else value)
            for name, value in super().get_traceback_frame_variables(request, tb_frame)
        ]
