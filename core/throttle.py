"""Login throttling: django-axes' backend, for logins that come over HTTP."""

from __future__ import annotations

from axes.backends import AxesStandaloneBackend


class LoginThrottleBackend(AxesStandaloneBackend):
    """Refuses a locked-out username+IP before any password is checked (django-axes).

    Axes insists on a request; an ``authenticate()`` without one is a programmatic call (the test
    client's ``login``, a shell), with no client address to count against, so it is not throttled.
    Every HTTP login path (the console's login view, the admin's) passes its request.
    """

    def authenticate(self, request, username=None, password=None, **kwargs):
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
