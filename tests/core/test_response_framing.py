"""A response's declared length is its body's length, after every middleware had its say.

CommonMiddleware sets Content-Length on the way out; the redaction middleware (core/redaction.py)
runs after it and may change the body. A declared length a few bytes short leaves the rest of the
body on a kept-alive connection, where the client reads it as the next answer's status line: daphne's
``illegal status line: bytearray(b'tml>')`` in tests/adversarial/test_replay.py."""

from __future__ import annotations

import json

import pytest
from django.http import HttpResponse, StreamingHttpResponse
from django.test import Client
from django.urls import path

from core.redaction import MASK

# Masks longer and shorter than what they hide: a key=value secret (7 bytes -> 12), a card with
# spaces (19 bytes -> 16), a 13-digit card (13 -> 16).
PAGE = (
    "<html><body><p>password=hunter2</p><p>4111 1111 1111 1111</p>"
    "<p>4222222222222</p></body></html>"
)
RECORD = {"note": "api_key=abcdefgh", "card": "4111111111111111"}


def page(request):
    return HttpResponse(PAGE)


def text(request):
    return HttpResponse("login with password=hunter2\n", content_type="text/plain")


def jsonl(request):
    return HttpResponse(json.dumps(RECORD) + "\n", content_type="application/x-ndjson")


def streamed(request):
    resp = StreamingHttpResponse(
        iter([json.dumps(RECORD).encode(), b"\n"]), content_type="application/x-ndjson"
    )
    resp["Content-Length"] = str(len(json.dumps(RECORD)) + 1)
    return resp


urlpatterns = [
    path("page/", page),
    path("text/", text),
    path("export.jsonl", jsonl),
    path("stream.jsonl", streamed),
]


@pytest.mark.urls(__name__)
@pytest.mark.parametrize("url", ["/page/", "/text/", "/export.jsonl"])
def test_a_masked_body_declares_its_own_length(url, db):
    resp = Client().get(url)
    assert resp.status_code == 200
    assert MASK.encode() in resp.content, "nothing was masked: the test exercises nothing"
    assert resp.has_header("Content-Length"), "CommonMiddleware declares a length"
    assert int(resp["Content-Length"]) == len(resp.content), resp.content


@pytest.mark.urls(__name__)
def test_a_masked_stream_declares_no_length(db):
    resp = Client().get("/stream.jsonl")
    body = b"".join(resp.streaming_content)
    assert MASK.encode() in body
    assert not resp.has_header("Content-Length"), (resp["Content-Length"], len(body))
