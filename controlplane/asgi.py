import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

from django.conf import settings
from django.core.handlers.asgi import ASGIHandler

from controlplane.handler import get_asgi_application
from controlplane.telemetry import setup_tracing

tracing = setup_tracing()  # before the app is built: the Django instrumentation adds a middleware
# Django first: the routing below imports models.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from console.origin import SameOriginValidator  # noqa: E402
from console.routing import websocket_urlpatterns  # noqa: E402
from controlplane.drain import DrainGate  # noqa: E402
from controlplane.health import HealthEndpoints  # noqa: E402

http_app: ASGIHandler = django_asgi_app  # or the static files handler below, also an ASGIHandler
if settings.SERVE_STATIC:
    # The console's CSS and vendored htmx under plain `daphne` too, as runserver would (without DEBUG).
    # In production serve STATIC_ROOT (manage.py collectstatic) from the proxy in front.
    from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler

    http_app = ASGIStaticFilesHandler(django_asgi_app)

router = ProtocolTypeRouter(
    {
        "http": http_app,
        # Origin must be this very site, scheme, host and port (no cross-site socket riding the session
        # cookie); the session identifies the user; the consumer then checks the role.
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
# The probes are answered before Django (controlplane/health.py); the drain gate sees every request
# and socket, probes included, so that it can count them and refuse new ones (controlplane/drain.py).
application = DrainGate(HealthEndpoints(router))
if tracing:
    # The Django instrumentation skips requests served under ASGI; this middleware makes the server
    # span of every HTTP request and socket, continuing the caller's W3C traceparent. Outside the
    # probes' middleware, so probes make no span (docs/operations/metrics.md).
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    application = DrainGate(HealthEndpoints(OpenTelemetryMiddleware(router)))
