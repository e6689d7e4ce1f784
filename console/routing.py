"""WebSocket routes: the console's live hints (console/consumers.py)."""

from django.urls import path, re_path

from console.consumers import FleetConsumer, NotFoundConsumer, RunConsumer, RunListConsumer

websocket_urlpatterns = [
    path("ws/runs/", RunListConsumer.as_asgi()),
    path("ws/runs/<uuid:run_id>/", RunConsumer.as_asgi()),
    path("ws/fleet/<uuid:operation_id>/", FleetConsumer.as_asgi()),
    # Last: every other path closes cleanly instead of raising "No route found" (an HTTP 500).
    re_path(r"", NotFoundConsumer.as_asgi()),
]
