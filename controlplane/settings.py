"""One env-driven settings module.

No configuration: SQLite, the in-memory channel layer and an embedded (SQLite) Celery broker, so
`make run` works on a fresh machine. DATABASE_URL switches to PostgreSQL (psycopg 3 with a pool),
REDIS_URL to Redis for Celery and channels-redis. CONTROLPLANE_PRODUCTION=1 turns on the hardened
settings that `manage.py check --deploy` inspects.
"""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from core.limits import MAX_BODY_BYTES
from core.redaction import DEFAULT_KEY_PARTS as DEFAULT_REDACTION_KEY_PARTS
from core.redaction import DEFAULT_KEYS as DEFAULT_REDACTION_KEYS
from core.roles import ROLES

from .embedded import embedded_broker_wal
from .env import env_bool, env_int, env_list, env_str
from .telemetry import json_formatter

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("CONTROLPLANE_VAR_DIR", str(BASE_DIR / "var")))

PRODUCTION = env_bool("CONTROLPLANE_PRODUCTION", False)
# Off unless asked for: Django's debug page shows settings and local variables to whoever triggers an
# error. Production refuses it outright rather than trusting a stray DEBUG=1 in an environment file.
DEBUG = env_bool("DEBUG", False)
if PRODUCTION and DEBUG:
    raise ImproperlyConfigured("DEBUG=1 is refused when CONTROLPLANE_PRODUCTION=1")
# The console's CSS and vendored htmx from the ASGI app itself (controlplane/asgi.py), independent of
# DEBUG, so the demo and the tests need no debug mode; production serves STATIC_ROOT from the proxy.
SERVE_STATIC = env_bool("SERVE_STATIC", not PRODUCTION)
SECRET_KEY = env_str("SECRET_KEY", "" if PRODUCTION else "dev-insecure-only-for-the-embedded-demo")
if not SECRET_KEY:
    raise ImproperlyConfigured("SECRET_KEY must be set when CONTROLPLANE_PRODUCTION=1")
ALLOWED_HOSTS = env_list(
    "ALLOWED_HOSTS", [] if PRODUCTION else ["127.0.0.1", "localhost", "testserver"]
)
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "channels",
    "pgtrigger",
    # audit before axes: its audited axes_reset* commands take the place of axes' own.
    "audit",
    "axes",
    "runs",
    "interventions",
    "notifications",
    "console",
]

MIDDLEWARE = [
    "core.middleware.RequestIdsMiddleware",  # the request id on every log line and span
    "core.metrics.ProtocolTimingMiddleware",  # protocol-call latency by endpoint (/metrics)
    "api.protocol_version.ProtocolVersionMiddleware",  # X-Controlplane-Protocol, before any call
    # Right after it: masks card numbers and secrets in every page and export (core/redaction.py).
    "core.redaction.RedactResponsesMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Signed in through the IdP: back to it with prompt=none every OIDC_SESSION_REFRESH_S (roles re-read).
    "console.sso.SessionRefresh",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # After auth, so its console error page renders with the user; before every view.
    "controlplane.edge.InputGuardMiddleware",
    # Last, so it sees the login view's verdict: turns a lockout into django-axes' 429 page.
    "axes.middleware.AxesMiddleware",
]

# Input limits (core/limits.py, docs/security.md, "Input limits"): a body past this is a 413/400, not a read.
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_BODY_BYTES
DATA_UPLOAD_MAX_NUMBER_FIELDS = 200

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
            # reltime, copyable_id, value_table: on every console template without {% load %}.
            "builtins": ["console.templatetags.console_tags"],
        },
    },
]

# --- database -------------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL", "")
if DATABASE_URL:
    _db = dj_database_url.parse(DATABASE_URL)
    if _db["ENGINE"] == "django.db.backends.postgresql":
        # Django's backend with a fast refusal while the database is unreachable, and a record of
        # whether a failed request may have written (core/pg/backend/base.py; docs/operations/faults.md).
        _db["ENGINE"] = "core.pg.backend"
        # psycopg 3's pool: connections are reused across requests instead of one per request.
        _db["CONN_MAX_AGE"] = 0
        _db.setdefault("OPTIONS", {})["pool"] = {
            "min_size": env_int("DB_POOL_MIN", 2),
            "max_size": env_int("DB_POOL_MAX", 20),
            "timeout": 10,
            # the pool's background reconnection of a lost connection gives up after 5 s (psycopg's
            # default: 5 minutes of retrying); the next checkout tries again
            "reconnect_timeout": env_int("DB_RECONNECT_TIMEOUT_S", 5),
        }
        # libpq: a connection attempt gives up after 3 s; TCP keepalives notice a silent peer; a
        # write unacknowledged for 10 s (a black-holed link) fails the connection instead of
        # hanging for the kernel's ~15 minutes of retransmissions.
        for _key, _value in (
            ("connect_timeout", env_int("DB_CONNECT_TIMEOUT_S", 3)),
            ("keepalives", 1),
            ("keepalives_idle", 10),
            ("keepalives_interval", 3),
            ("keepalives_count", 3),
            ("tcp_user_timeout", env_int("DB_TCP_USER_TIMEOUT_MS", 10000)),
        ):
            _db["OPTIONS"].setdefault(_key, _value)
        _db["TEST"] = {"NAME": env_str("TEST_DATABASE_NAME", "test_controlplane")}
        # `make test` sets DB_SYNCHRONOUS_COMMIT=off: a commit then returns before its WAL reaches
        # the disk (0.14 ms instead of 3.8 ms a commit on this machine; the suite commits ~10^5 times).
        # Atomicity and isolation are unchanged; only a crash of PostgreSQL itself could lose the
        # last commits, which no test does. Never in production: an acknowledged write is durable.
        _sync = env_str("DB_SYNCHRONOUS_COMMIT", "")
        if _sync:
            if _sync not in ("on", "off", "local", "remote_write", "remote_apply"):
                raise ImproperlyConfigured(
                    f"DB_SYNCHRONOUS_COMMIT={_sync!r}: not a PostgreSQL value"
                )
            if PRODUCTION and _sync != "on":
                raise ImproperlyConfigured(
                    "DB_SYNCHRONOUS_COMMIT must stay on in production (acknowledged writes are durable)"
                )
            _db["OPTIONS"]["options"] = f"-c synchronous_commit={_sync}"
    DATABASES = {"default": _db}
else:
    if PRODUCTION:
        raise ImproperlyConfigured(
            "DATABASE_URL (PostgreSQL) is required when CONTROLPLANE_PRODUCTION=1"
        )
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env_str("SQLITE_PATH", str(VAR_DIR / "controlplane.sqlite3")),
            # The demo's ASGI server, Celery worker and agents write at once: wait instead of failing.
            "OPTIONS": {
                "timeout": 20,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL;",
            },
            "TEST": {"NAME": str(VAR_DIR / "test.sqlite3")},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
IS_POSTGRES = DATABASES["default"]["ENGINE"] in ("core.pg.backend", "django.db.backends.postgresql")

# --- redis: celery broker and channel layer ---------------------------------------------------
REDIS_URL = env_str("REDIS_URL", "")
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    # A SIGKILLed worker's unacknowledged message comes back after this long (tasks are idempotent,
    # so an early redelivery is harmless; the job sweep covers a lost message too).
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
        "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT_S", 300)
    }
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # No read timeout: the layer's receive is a blocking BZPOPMIN, and redis-py 8 reads
            # with a 5 s socket_timeout by default, which tore every idle socket down every ~5 s
            # (django/channels_redis#422, redis/redis-py#4091).
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": None}]},
        }
    }
else:
    if PRODUCTION:
        raise ImproperlyConfigured("REDIS_URL is required when CONTROLPLANE_PRODUCTION=1")
    # Embedded broker: kombu's SQLAlchemy transport on its own SQLite file, shared by the web
    # process, the Celery worker and beat. Not kombu's filesystem transport: its reader can pick up a
    # message file the writer has created but not yet written, and the worker dies on the empty JSON
    # (celery/kombu#1551) -- `make run` stopped after 21 minutes that way. SQLite serialises the
    # consumers (kombu takes BEGIN IMMEDIATE before it picks a message) and WAL lets publishers and the
    # polling worker proceed without "database is locked".
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_PATH = Path(env_str("CELERY_BROKER_PATH", str(VAR_DIR / "celery-broker.sqlite3")))
    CELERY_BROKER_URL = f"sqlite:///{CELERY_BROKER_PATH}"
    CELERY_BROKER_TRANSPORT = "controlplane.broker:Transport"  # kombu's sqla, see that module
    # Passed to sqlalchemy.create_engine: wait for a busy broker file instead of failing at once.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"connect_args": {"timeout": 30}}
    embedded_broker_wal(CELERY_BROKER_PATH)
    # In-memory for this process's sockets, a SQLite file between processes, so what the Celery
    # worker and beat write reaches the web process's pages (core/live_bus.py). The heartbeat
    # (core.live.BEAT_GROUP) always takes the file: a page that hears it knows the bus works.
    LIVE_BUS_PATH = Path(env_str("LIVE_BUS_PATH", str(VAR_DIR / "live-bus.sqlite3")))
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "core.live_bus.SQLiteBusLayer",
            "CONFIG": {"path": str(LIVE_BUS_PATH), "round_trip_groups": ["live.beat"]},
        }
    }

# Seconds between the heartbeats a process with console sockets sends them (core/live.py); a page
# that hears none for 3.5 s (static/console/liveness.js) says it is not live. 0 turns them off (the in-process tests).
LIVE_HEARTBEAT_S = float(env_str("LIVE_HEARTBEAT_S", "1"))

CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
RECOVERY_SCAN_INTERVAL_S = env_int("RECOVERY_SCAN_INTERVAL_S", 5)
# Follow-up jobs (interventions/jobs.py): a job not finished JOB_TIMEOUT_S after its delivery is
# delivered again by the sweep; after JOB_MAX_ATTEMPTS failed deliveries it is given up and the run
# goes to needs_attention. Failed deliveries are retried after JOB_RETRY_BACKOFF_S, doubling.
JOB_MAX_ATTEMPTS = env_int("JOB_MAX_ATTEMPTS", 5)
JOB_TIMEOUT_S = env_int("JOB_TIMEOUT_S", 120)
JOB_RETRY_BACKOFF_S = env_int("JOB_RETRY_BACKOFF_S", 2)
JOB_SWEEP_INTERVAL_S = env_int("JOB_SWEEP_INTERVAL_S", 10)
CELERY_BEAT_SCHEDULE = {
    "sweep-jobs": {"task": "interventions.jobs.sweep_jobs", "schedule": JOB_SWEEP_INTERVAL_S},
    "scan-expired-leases": {
        "task": "interventions.recover.scan_expired_leases",
        "schedule": RECOVERY_SCAN_INTERVAL_S,
    },
    "fire-due-timers": {"task": "runs.tasks.fire_due_timers", "schedule": RECOVERY_SCAN_INTERVAL_S},
    "expire-approvals": {
        "task": "interventions.approvals.expire_approvals",
        "schedule": RECOVERY_SCAN_INTERVAL_S,
    },
    "escalate-approvals": {
        "task": "notifications.jobs.escalate_approvals",
        "schedule": RECOVERY_SCAN_INTERVAL_S,
    },
    # The run list's counts per state (runs.RunTally): fold the triggers' +1/-1 rows.
    "compact-run-tally": {"task": "runs.tasks.compact_run_tally", "schedule": 30},
}

# Notifications (docs/operations/notifications.md): the console's address for the links they carry,
# the per-message network timeout, and the retry backoff (doubling from NOTIFY_RETRY_BACKOFF_S up to
# NOTIFY_RETRY_MAX_S; a notification is never given up).
CONSOLE_BASE_URL = env_str("CONSOLE_BASE_URL", "http://127.0.0.1:8000")
NOTIFY_TIMEOUT_S = env_int("NOTIFY_TIMEOUT_S", 10)
NOTIFY_RETRY_BACKOFF_S = env_int("NOTIFY_RETRY_BACKOFF_S", 5)
NOTIFY_RETRY_MAX_S = env_int("NOTIFY_RETRY_MAX_S", 600)

# --- audit anchors (docs/security.md) --------------------------------------------------------------
# The chain head is signed with Ed25519 and appended outside the database every ANCHOR_INTERVAL_S
# (0 = only on demand, `manage.py audit_anchor`); `audit_verify --anchors` holds the database to them.
ANCHOR_INTERVAL_S = env_int("ANCHOR_INTERVAL_S", 60)
# How far an audit event may be dated before the one it follows, or before an anchor it is not under,
# before audit_verify calls it backdated (audit/anchors/times.py, docs/security/audit-forgery.md).
AUDIT_CLOCK_TOLERANCE_S = env_int("AUDIT_CLOCK_TOLERANCE_S", 60)
ANCHOR_SINK = env_str("ANCHOR_SINK", "audit.anchors.sink.DirectorySink")
ANCHOR_DIR = env_str("ANCHOR_DIR", str(VAR_DIR / "anchors"))
# Inline PEM or a PEM file's path. Unset: a demo key generated into var/ (refused in production).
ANCHOR_SIGNING_KEY = env_str("ANCHOR_SIGNING_KEY", "")
ANCHOR_DEMO_KEY_FILE = str(VAR_DIR / "anchor-signing-key.pem")
# PEM public key files trusted by `audit_verify --anchors`; unset: the signing key's public half.
ANCHOR_VERIFY_KEYS = env_list("ANCHOR_VERIFY_KEYS", [])
# Each anchor also signs the history heads of the runs that moved in the last three intervals, up to:
ANCHOR_MAX_RUNS = env_int("ANCHOR_MAX_RUNS", 2000)
if ANCHOR_INTERVAL_S > 0:
    CELERY_BEAT_SCHEDULE["audit-anchor"] = {
        "task": "audit.tasks.write_anchor",
        "schedule": ANCHOR_INTERVAL_S,
    }

# --- control-plane behaviour -------------------------------------------------------------------
LEASE_TTL_S = env_int("LEASE_TTL_S", 30)
HEARTBEAT_MAX_WAIT_S = env_int("HEARTBEAT_MAX_WAIT_S", 25)
# Sync views running at once per ASGI process (controlplane/handler.py); 0 = unbounded. 2, not 4:
# a woken long-poll's thread hops then wait on fewer GIL holders (docs/benchmarks.md, "long-poll wake-up").
SYNC_VIEW_CONCURRENCY = env_int("SYNC_VIEW_CONCURRENCY", 2)
# Seconds a process trusts a worker token it has read (core/tokens.py): its bound on refusing a token
# another process revoked (the revoking process forgets it at once). 0 = read the token on every call.
API_TOKEN_CACHE_S = env_int("API_TOKEN_CACHE_S", 2)
# Modules that register compensators, reconcilers and assumption checkers (the only knowledge the
# control plane has of external systems).
CONTROLPLANE_ADAPTERS = env_list("CONTROLPLANE_ADAPTERS", ["world.adapters"])
WORLD_URL = env_str("WORLD_URL", "http://127.0.0.1:8100")

# --- auth and security ----------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    "core.throttle.LoginThrottleBackend",  # django-axes: refuses a locked-out username+IP first
    # Local passwords, as LOCAL_LOGIN allows (on / admins: break-glass only / off).
    "console.sso.BreakGlassModelBackend",
    # OpenID Connect (docs/operations/identity.md): listed always, it only answers the IdP's callback.
    "console.sso.OIDCBackend",
]
LOCAL_LOGIN = env_str("LOCAL_LOGIN", "on")
if LOCAL_LOGIN not in ("on", "admins", "off"):
    raise ImproperlyConfigured(f"LOCAL_LOGIN must be on, admins or off, not {LOCAL_LOGIN!r}")
# --- single sign-on (OpenID Connect, mozilla-django-oidc); off while OIDC_RP_CLIENT_ID is empty.
OIDC_PROVIDER_NAME = env_str("OIDC_PROVIDER_NAME", "single sign-on")
OIDC_RP_CLIENT_ID = env_str("OIDC_RP_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = env_str("OIDC_RP_CLIENT_SECRET", "")
OIDC_RP_SIGN_ALGO = env_str("OIDC_RP_SIGN_ALGO", "RS256")
OIDC_RP_SCOPES = env_str("OIDC_RP_SCOPES", "openid email profile")
OIDC_OP_AUTHORIZATION_ENDPOINT = env_str("OIDC_OP_AUTHORIZATION_ENDPOINT", "")
OIDC_OP_TOKEN_ENDPOINT = env_str("OIDC_OP_TOKEN_ENDPOINT", "")
OIDC_OP_USER_ENDPOINT = env_str("OIDC_OP_USER_ENDPOINT", "")
OIDC_OP_JWKS_ENDPOINT = env_str("OIDC_OP_JWKS_ENDPOINT", "")
OIDC_USE_PKCE = env_bool("OIDC_USE_PKCE", True)
OIDC_USERNAME_CLAIM = env_str("OIDC_USERNAME_CLAIM", "preferred_username")
OIDC_GROUPS_CLAIM = env_str("OIDC_GROUPS_CLAIM", "groups")
# The IdP's issuer, when its ID tokens carry no "iss" (they should); else the authorization endpoint's origin.
OIDC_OP_ISSUER = env_str("OIDC_OP_ISSUER", "")
# A person signed in through the IdP is sent back to it (prompt=none) this often: roles re-read.
OIDC_SESSION_REFRESH_S = env_int("OIDC_SESSION_REFRESH_S", 900)
OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = OIDC_SESSION_REFRESH_S
# RP-initiated logout: the IdP's end_session_endpoint; empty: logout ends the controlplane session only.
OIDC_OP_END_SESSION_ENDPOINT = env_str("OIDC_OP_END_SESSION_ENDPOINT", "")
# Else read from the IdP's discovery document (its /.well-known/openid-configuration), once per process.
OIDC_OP_DISCOVERY_ENDPOINT = env_str("OIDC_OP_DISCOVERY_ENDPOINT", "")
OIDC_STORE_ID_TOKEN = True  # the id_token_hint of that logout
# IdP group -> roles: "payments-ops=operator,sec=security_responder+approver" (roles joined by +).
OIDC_GROUP_ROLES: dict[str, list[str]] = {}
for _pair in env_list("OIDC_GROUP_ROLES", []):
    _group, _sep, _roles = _pair.partition("=")
    _unknown = sorted(set(_roles.split("+")) - set(ROLES))
    if not _sep or not _group.strip() or _unknown:
        raise ImproperlyConfigured(
            f"OIDC_GROUP_ROLES: {_pair!r} must be group=role[+role], roles among {ROLES}"
        )
    OIDC_GROUP_ROLES[_group.strip()] = _roles.split("+")
LOGIN_REDIRECT_URL_FAILURE = "/accounts/login/"
# Login throttling (django-axes): after LOGIN_FAILURE_LIMIT failures for one username from one client
# IP, that pair is locked out for LOGIN_LOCKOUT_MINUTES (a successful login resets the count). The
# client IP is core.auth.client_ip, the same the audit records (TRUSTED_PROXIES below).
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("LOGIN_LOCKOUT_MINUTES", 15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "core.auth.client_ip"
AXES_DISABLE_ACCESS_LOG = True  # successful logins and logouts are in the audit chain instead
AXES_VERBOSE = False
# Deleting an attempt in the admin would lift a lockout with nothing in the audit chain: not offered.
AXES_ENABLE_ADMIN = False
# Reverse proxies (IPs or CIDRs) whose X-Forwarded-For / X-Forwarded-Proto / X-Request-ID are believed.
# Empty (the default): the audit's source_ip is the connection's peer and its request_id is generated.
TRUSTED_PROXIES = env_list("TRUSTED_PROXIES", [])
for _proxy in TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy, strict=False)
    except ValueError as _exc:
        raise ImproperlyConfigured(f"TRUSTED_PROXIES: {_exc}") from None
# Live console sockets: at most this many open per login session; the session and the user are
# re-checked at every push and at least every WS_SESSION_CHECK_S seconds (logout/deactivation closes).
WS_MAX_PER_SESSION = env_int("WS_MAX_PER_SESSION", 8)
WS_SESSION_CHECK_S = env_int("WS_SESSION_CHECK_S", 5)
# Even with DEBUG=1 the error page must not show connection URLs with their passwords.
DEFAULT_EXCEPTION_REPORTER_FILTER = "controlplane.debug.SecretSafeReporterFilter"
LOGIN_URL = "/accounts/login/"
# An operator who logs in lands on the runs that need them; "Runs" in the header shows them all.
LOGIN_REDIRECT_URL = "/?attention=1"
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the <body hx-headers>, not the cookie
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# /metrics answers these client addresses (REMOTE_ADDR; X-Forwarded-For can be forged) without a
# token; any other caller needs the bearer token of an admin (docs/operations/metrics.md).
METRICS_ALLOW_IPS = env_list("METRICS_ALLOW_IPS", ["127.0.0.1", "::1"])
if PRODUCTION:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# The image collects static files into its own read-only tree (Dockerfile), apart from var/.
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(VAR_DIR / "staticfiles")))

# One JSON object per line in production (LOG_FORMAT=json), with the run, attempt, effect,
# intervention and request ids of the decision being made; plain text for people otherwise.
LOG_FORMAT = env_str("LOG_FORMAT", "json" if PRODUCTION else "text")
if LOG_FORMAT not in ("json", "text"):
    raise ImproperlyConfigured("LOG_FORMAT must be json or text")
# One redaction policy (core/redaction.py): keys compared case- and separator-insensitively, exact
# and contained; empty = the defaults there. REDACTION_STORE_MASKED: the ledger stores args masked too.
REDACTION_KEYS = env_list("REDACTION_KEYS") or list(DEFAULT_REDACTION_KEYS)
REDACTION_KEY_PARTS = env_list("REDACTION_KEY_PARTS") or list(DEFAULT_REDACTION_KEY_PARTS)
REDACTION_STORE_MASKED = env_bool("REDACTION_STORE_MASKED", False)

# Run trees (runs/services/delegation.py): children per run and levels per tree.
MAX_CHILDREN_PER_RUN = env_int("MAX_CHILDREN_PER_RUN", 200)
MAX_TREE_DEPTH = env_int("MAX_TREE_DEPTH", 8)
# A tree-scoped pause or cancel (interventions/cascade.py) reaches this many descendants in the
# request's own transaction; the rest, each in its own transaction, in the background cascade job.
CASCADE_INLINE_CHILDREN = env_int("CASCADE_INLINE_CHILDREN", 20)
# Previews and receipts list at most this many children or effects of one kind, with the total and
# where to read the rest (interventions/paging.py).
RECEIPT_PAGE_ITEMS = env_int("RECEIPT_PAGE_ITEMS", 50)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": json_formatter()} if LOG_FORMAT == "json" else {},
    # core.redaction: card numbers and secrets are masked in every log line.
    "filters": {"redact": {"()": "core.redaction.RedactingFilter"}},
    "handlers": {
        "console": {"class": "logging.StreamHandler", "filters": ["redact"]}
        | ({"formatter": "json"} if LOG_FORMAT == "json" else {})
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        # Django's default config gives "django" its own console handler (when DEBUG) *and* lets it
        # propagate to ours: every request line of the dev server was printed twice.
        "django": {"handlers": [], "level": env_str("LOG_LEVEL", "INFO"), "propagate": True},
        "django.db.backends": {"level": "WARNING"},
        "axes": {"level": "WARNING"},  # one INFO line per login; the audit chain has them
    },
}
