# One image for the API, the Celery worker and beat: the command chooses (compose.yaml,
# docs/operations/container.md). BASE_IMAGE is any Debian-like image with python3 >= 3.12, venv and
# pip: the official python image where a registry is reachable, or one built from Debian's own
# packages (`make image-base`: debootstrap + docker import) where none is.
ARG BASE_IMAGE=python:3.13-slim-trixie

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1
# A site whose TLS is inspected puts its CA certificates (*.pem) in deploy/certs/; they are used by
# this build stage only and never reach the final image.
COPY deploy/certs/ /tmp/extra-certs/
RUN for pem in /tmp/extra-certs/*.pem; do [ -f "$pem" ] && cat "$pem" >> /etc/ssl/certs/ca-certificates.crt; done; true
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt
RUN python3 -m venv /opt/venv
WORKDIR /app
# Dependencies first, from pyproject.toml alone: a code change does not reinstall them.
COPY pyproject.toml ./
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && /opt/venv/bin/pip install -r /tmp/requirements.txt
COPY sdk/ sdk/
RUN /opt/venv/bin/pip install ./sdk
COPY . .
RUN CONTROLPLANE_VAR_DIR=/tmp/var STATIC_ROOT=/app/staticfiles /opt/venv/bin/python manage.py collectstatic --noinput -v 0 \
 && rm -rf /tmp/var sdk/build && find /app -name __pycache__ -prune -exec rm -rf {} +

FROM ${BASE_IMAGE}
# A fixed uid, so a mounted secret (the anchor signing key) can be given to it: chown 10001.
RUN groupadd --system --gid 10001 controlplane \
 && useradd --system --uid 10001 --gid controlplane --home-dir /app --no-create-home controlplane \
 && mkdir -p /var/lib/controlplane/anchors && chown -R controlplane:controlplane /var/lib/controlplane
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
WORKDIR /app
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CONTROLPLANE_PRODUCTION=1 \
    LOG_FORMAT=json \
    CONTROLPLANE_VAR_DIR=/var/lib/controlplane \
    STATIC_ROOT=/app/staticfiles
USER controlplane
EXPOSE 8000
# SIGTERM drains the API (controlplane/serve.py) and warm-stops a Celery worker; give both 30 s.
STOPSIGNAL SIGTERM
CMD ["python", "-m", "controlplane.serve", "-b", "0.0.0.0", "-p", "8000", "--proxy-headers", "controlplane.asgi:application"]
