# controlplane — see README.md. `make run` starts the whole demo; `make test` runs the whole suite.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# Django 6 needs Python >= 3.12: take the first suitable interpreter on this machine.
PYTHON ?= $(shell for p in python3.13 python3.12 $$HOME/.pyenv/versions/3.13*/bin/python3.13 $$HOME/.pyenv/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1 && { echo $$p; break; }; done)
# This machine exports PYTHONDONTWRITEBYTECODE=1: no process would cache the project's compiled modules, and
# each of the few hundred processes the suite starts would compile them again (~0.3 s CPU a start,
# docs/operations/tests.md).
unexport PYTHONDONTWRITEBYTECODE
TEST_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/controlplane
TEST_REDIS_URL ?= redis://127.0.0.1:6379/0
# pytest-xdist workers for `make test` (0: one process, the default until the browser walks hold under -n 2; docs/operations/tests.md)
TEST_WORKERS ?= 0

.PHONY: run test walk lint docs venv browser haproxy migrate seed bench bench-console bench-multihost faults-test worker-drain-test rolling-restart-test check-deploy clean

$(VENV)/.installed: pyproject.toml sdk/pyproject.toml
	@test -n "$(PYTHON)" || { echo "need Python >= 3.12 (Django 6); set PYTHON=/path/to/python3.12"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e './sdk[langgraph,openai-agents,mcp]'  # the SDK is its own package (sdk/pyproject.toml)
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed  ## create .venv and install the project with its dev tools

migrate: venv  ## apply migrations to the configured database (SQLite by default)
	$(PY) manage.py migrate --noinput

seed: migrate  ## roles, demo users (logins printed), agents and worker tokens
	$(PY) manage.py seed_demo

run: seed  ## start console/API (ASGI), Celery worker + beat, the demo world and demo agents; restarts what dies; Ctrl-C stops all
	$(PY) -m demo.supervisor

haproxy:  ## Debian's HAProxy, the load balancer of the rolling-restart and faults tests (skipped, saying so, without it)
	@command -v haproxy >/dev/null || test -x /usr/sbin/haproxy || { command -v apt-get >/dev/null && \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null; }; }; } || \
		echo "could not install haproxy: the rolling-restart and faults tests will say they are skipped"

browser:  ## Debian's chromium for the browser tests (Playwright drives /usr/bin/chromium; no browser downloads)
	@test -x /usr/bin/chromium || { command -v apt-get >/dev/null && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "could not install chromium: the browser test will say it is skipped"

lint: venv  ## formatting, lint, types (mypy, config in pyproject.toml) and the layering contract (import-linter)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

docs: venv  ## the documentation site (mkdocs, material theme) built strictly into site/: a broken link or nav entry fails
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

test: venv browser lint docs  ## lint, then the whole suite on PostgreSQL + Redis (never silently on SQLite)
	@# DB_SYNCHRONOUS_COMMIT=off: commits skip the WAL flush (docs/operations/tests.md: ~25x cheaper commits)
	@export DATABASE_URL="$${DATABASE_URL:-$(TEST_DATABASE_URL)}" REDIS_URL="$${REDIS_URL:-$(TEST_REDIS_URL)}" CONTROLPLANE_REQUIRE_POSTGRES=1 \
		DB_SYNCHRONOUS_COMMIT="$${DB_SYNCHRONOUS_COMMIT:-off}"; \
	$(PY) -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; rc=0; fi; exit $$rc

walk: venv browser  ## the seven run-control scenarios walked through the console in chromium; receipts in reports/scenario-*.png, copied to docs/img/ for the operator guide
	@export DATABASE_URL="$${DATABASE_URL:-$(TEST_DATABASE_URL)}" REDIS_URL="$${REDIS_URL:-$(TEST_REDIS_URL)}" CONTROLPLANE_REQUIRE_POSTGRES=1; \
	$(PY) -m pytest tests/acceptance/test_scenarios_walk.py $(PYTEST_ARGS)
	mkdir -p docs/img && cp reports/scenario-*.png docs/img/
	@# Debian's pngquant, if installed, shrinks them to a third (the committed ones were shrunk so)
	@command -v pngquant >/dev/null && pngquant --skip-if-larger --force --ext .png --quality 70-95 docs/img/scenario-*.png || true

BENCH_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/controlplane_bench

$(VENV)/.bench-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -q -e '.[bench]'  # DBOS (the peer workload), uvicorn and granian
	touch $@

bench: venv $(VENV)/.bench-installed  ## issue 11's measurements on a scratch PostgreSQL database (≤ 10 min; BENCH_QUICK=1 ~2 min): bench/results/summary.json, the table in docs/benchmarks.md
	DATABASE_URL="$(BENCH_DATABASE_URL)" REDIS_URL="$${REDIS_URL:-$(TEST_REDIS_URL)}" $(PY) -m bench.suite
	$(PY) -m bench.report --readme docs/benchmarks.md

# BENCH_CONSOLE_RUNS=1000000 (issue 24): a database of its own, seeded once (~5 min, 1.4 GB)
BENCH_CONSOLE_RUNS ?=
BENCH_CONSOLE_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/controlplane_console_bench$(if $(BENCH_CONSOLE_RUNS),_$(BENCH_CONSOLE_RUNS))

bench-console: venv  ## console pages among 100,000 runs (seeded once by COPY; BENCH_CONSOLE_RUNS=1000000: bench/results/console_1m.json), live pages under protocol load (≤ 8 min; BENCH_QUICK=1 ~2 min); bench/results/console.json
	DATABASE_URL="$(BENCH_CONSOLE_DATABASE_URL)" REDIS_URL="$${REDIS_URL:-$(TEST_REDIS_URL)}" BENCH_CONSOLE_RUNS="$(BENCH_CONSOLE_RUNS)" $(PY) -m bench.console

rolling-restart-test: venv haproxy  ## two API replicas behind HAProxy restarted in turn under 16 SDK workers (issue 22)
	@export DATABASE_URL="$${DATABASE_URL:-$(TEST_DATABASE_URL)}" REDIS_URL="$${REDIS_URL:-$(TEST_REDIS_URL)}" CONTROLPLANE_REQUIRE_POSTGRES=1 CONTROLPLANE_ROLLING_TEST=1; \
	$(PY) -m pytest tests/deploy/test_rolling_restart.py $(PYTEST_ARGS)

worker-drain-test: venv  ## a Celery worker's drain with real workers: SIGTERM mid-job finishes it once; SIGTERM+SIGKILL leaves it to the sweep (issue 22, ~145 s under load, outside the suite)
	@export DATABASE_URL="$${DATABASE_URL:-$(TEST_DATABASE_URL)}" REDIS_URL="$${REDIS_URL:-$(TEST_REDIS_URL)}" CONTROLPLANE_REQUIRE_POSTGRES=1 CONTROLPLANE_WORKER_DRAIN_TEST=1; \
	$(PY) -m pytest -p no:randomly tests/deploy/test_worker_drain.py $(PYTEST_ARGS)

bench-multihost: venv  ## issue 22 item 8: effects/s and CPU per effect with 1 and 2 API hosts (network namespaces, root) behind HAProxy (BENCH_QUICK=1 ~1 min); bench/results/multihost.json, also in make bench's summary
	DATABASE_URL="$(BENCH_DATABASE_URL)" REDIS_URL="$${REDIS_URL:-$(TEST_REDIS_URL)}" $(PY) -m bench.multihost

faults-test: venv haproxy  ## faults across hosts in network namespaces (issue 22 item 5, 50-100 s, root): docs/operations/faults.md
	@export DATABASE_URL="$${DATABASE_URL:-$(TEST_DATABASE_URL)}" REDIS_URL="$${REDIS_URL:-$(TEST_REDIS_URL)}" CONTROLPLANE_REQUIRE_POSTGRES=1 CONTROLPLANE_FAULTS_TEST=1; \
	$(PY) -m pytest -s -p no:randomly tests/deploy/test_faults.py $(PYTEST_ARGS)

check-deploy: venv  ## Django's deployment checks against the production settings
	@# env -u: a shell that exports the suite's DB_SYNCHRONOUS_COMMIT=off would make production settings refuse to load
	env -u DB_SYNCHRONOUS_COMMIT CONTROLPLANE_PRODUCTION=1 SECRET_KEY=$$(head -c 48 /dev/urandom | base64) ALLOWED_HOSTS=controlplane.example.com \
	DATABASE_URL="$(TEST_DATABASE_URL)" REDIS_URL="$(TEST_REDIS_URL)" $(PY) manage.py check --deploy --fail-level WARNING

image:  ## the container images: Dockerfile on a base built from Debian's packages (BASE_IMAGE=python:3.13-slim-trixie where a registry is reachable)
	bash deploy/images.sh

compose-test: venv  ## builds the images, starts compose.yaml's stack and checks it through the proxy (first run ~10 min, cached ~3 min; skipped, saying so, without a Docker daemon)
	@bash deploy/images.sh; rc=$$?; \
	if [ $$rc -eq 3 ]; then echo "compose-test skipped: no Docker daemon could be started"; exit 0; fi; \
	[ $$rc -eq 0 ] || exit $$rc; \
	CONTROLPLANE_COMPOSE_TEST=1 $(PY) -m pytest tests/deploy/test_compose.py -p no:cacheprovider $(PYTEST_ARGS)

clean:
	rm -rf var .pytest_cache site
