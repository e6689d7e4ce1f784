"""The console's static files under plain daphne (settings.SERVE_STATIC), with a 404 -- not a 500 --
for a path that tries to leave the static directories (``/static/..%2f..%2fcontrolplane%2fsettings.py``):
Django's finders refuse it with SuspiciousFileOperation, which its static handler does not catch."""

from __future__ import annotations

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.exceptions import SuspiciousOperation
from django.http import Http404


class SafeStaticFilesHandler(ASGIStaticFilesHandler):
    def serve(self, request):
        try:
            return super().serve(request)
        except SuspiciousOperation:
            raise Http404("no such static file") from None
