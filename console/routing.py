"""WebSocket routes: the console's live hints (runs/consumers.py)."""

from django.urls import path

from console.consumers import RunConsumer, RunListConsumer

websocket_urlpatterns = [
    path("ws/runs/", RunListConsumer.as_asgi()),
    path("ws/runs/<uuid:run_id>/", RunConsumer.as_asgi()),
]
