"""CacheSafe settings: everything configurable comes from the environment (see README)."""

from __future__ import annotations

from pathlib import Path

import jinja2

from cachesafe.environment import (
    ConfigError,
    Env,
    check_redis_url,
    parse_database_url,
    sqlite_database,
)

BASE_DIR = Path(__file__).resolve().parent.parent.parent
env = Env.from_os()

# Local state of the embedded defaults (SQLite file, broker folder, generated files).
VAR_DIR = Path(env.text("CACHESAFE_VAR_DIR", str(BASE_DIR / "var")))

INSECURE_SECRET_KEY = "cachesafe-local-development-key-not-for-production"
DEBUG = env.flag("DEBUG", True)
SECRET_KEY = env.text("SECRET_KEY", INSECURE_SECRET_KEY)
if not DEBUG and SECRET_KEY == INSECURE_SECRET_KEY:
    raise ConfigError(
        "DEBUG is off but SECRET_KEY is the built-in development key: "
        "set SECRET_KEY to a long random value (python -c 'import secrets; "
        "print(secrets.token_urlsafe(50))')"
    )

ALLOWED_HOSTS = env.items("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
if DEBUG:
    ALLOWED_HOSTS += ["testserver"]
SITE_URL = env.text("SITE_URL", "http://127.0.0.1:8000").rstrip("/")
CSRF_TRUSTED_ORIGINS = [SITE_URL] if SITE_URL.startswith("https://") else []

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    # Only for its bundled Swagger UI files and template: /api/docs loads nothing from a CDN.
    "ninja",
    "cachesafe",
    "registry",
    "dashboard",
    "workers",
    "alerts",
]

MIDDLEWARE = [
    # Outermost: a HEAD's headers are final before its body is dropped.
    "cachesafe.middleware.HeadWithoutBodyMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # Before anything reads the query string or can raise: cleaning, then 503s (not 500s).
    "cachesafe.middleware.QueryTextMiddleware",
    "cachesafe.middleware.ServiceUnavailableMiddleware",
    "cachesafe.middleware.HtmxVaryMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "cachesafe.urls"
WSGI_APPLICATION = "cachesafe.wsgi.application"

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
                "cachesafe.context_processors.site",
            ],
        },
    },
    {
        # The catalog's form and results only (dashboard/jinja.py says why); every page is a
        # Django template.
        "BACKEND": "django.template.backends.jinja2.Jinja2",
        "NAME": "jinja2",
        "DIRS": [],
        "APP_DIRS": True,  # dashboard/jinja2/
        "OPTIONS": {
            "environment": "dashboard.jinja.environment",
            # A misspelt name fails in the tests, not as an empty cell on a page.
            "undefined": jinja2.StrictUndefined,
        },
    },
]

# Database: PostgreSQL when DATABASE_URL is set, else an embedded SQLite file.
if env.is_set("DATABASE_URL"):
    DATABASES = {"default": parse_database_url(env.text("DATABASE_URL", ""), base_dir=BASE_DIR)}
else:
    DATABASES = {"default": sqlite_database(VAR_DIR / "cachesafe.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Redis backs the broker, locks and rate limits in production; without it the embedded
# defaults keep everything in the database and a broker folder under VAR_DIR.
REDIS_URL = check_redis_url(env.text("REDIS_URL", "")) if env.is_set("REDIS_URL") else ""
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            # Two installations on one Redis (or a test run beside `make run`) keep apart.
            "KEY_PREFIX": env.text("CACHESAFE_CACHE_PREFIX", "cachesafe"),
            # A page must not hang on a Redis that is gone: every use of the cache has a
            # fallback (render the page, answer 503), so fail fast instead.
            "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 2},
        }
    }
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.db.DatabaseCache",
            "LOCATION": "cachesafe_cache",
        }
    }
#: How long a rendered dashboard page may be served from the cache; 0 turns the page cache off.
DASHBOARD_PAGE_CACHE_SECONDS = env.integer("DASHBOARD_PAGE_CACHE_SECONDS", 60, minimum=0)

# Celery (the app lives in workers/). Postgres holds the state: no result backend.
CELERY_BROKER_URL = REDIS_URL or "filesystem://"
if REDIS_URL:
    # Above the longest task's hard limit, so an acks_late task of a killed worker is
    # redelivered only once it can no longer be running anywhere.
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
        "visibility_timeout": env.integer("CELERY_VISIBILITY_TIMEOUT", 3600, minimum=1)
    }
else:
    _broker_dir = VAR_DIR / "broker"
    for _sub in ("queue", "processed", "control"):
        try:
            (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
        except OSError as _exc:
            raise ConfigError(
                f"cannot create {_broker_dir / _sub}: {_exc.strerror}; CACHESAFE_VAR_DIR names"
                " the folder the embedded defaults keep their state in, which must be writable"
            ) from None
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
        # kombu polls a folder broker once a second when a queue is empty: every message of
        # a queue of first syncs waited up to that second (363 discovered repos took 9 minutes
        # through `make run`'s worker, 75 s at 0.1 s).
        "polling_interval": 0.1,
    }
    # The same folders, with a consumer that looks again at once while the prefetch holds
    # messages back, instead of sleeping that 0.1 s (workers/broker.py).
    CELERY_BROKER_TRANSPORT = "workers.broker:FolderTransport"
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULER = "workers.beat:TableScheduler"

# Wall time one template check may take in its sandbox before it ends as an `error` verdict.
# CPU time, not wall time: a template gets the same verdict on a busy worker as on an idle one.
CHECK_CPU_SECONDS = float(env.integer("CHECK_CPU_SECONDS", 10, minimum=1, maximum=300))

# The Mac probe worker: prompt sizes (tokens of system prompt), paths, disk budget per model.
PROBE_PROMPT_SIZES = env.integers("PROBE_PROMPT_SIZES", [0, 1000, 8000])
PROBE_PATHS = env.items("PROBE_PATHS", ["library", "library_checkpoints", "server"])
PROBE_DISK_BUDGET_BYTES = env.integer("PROBE_DISK_BUDGET_GB", 60, minimum=1) * 2**30

# Hugging Face Hub.
HF_ENDPOINT = env.text("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
HF_TOKEN = env.text("HF_TOKEN", "") or None
#: Shared with the Hub's webhook settings; POST /hooks/hub is refused while it is empty.
HF_WEBHOOK_SECRET = env.text("HF_WEBHOOK_SECRET", "")
#: Hub requests per 5 minutes per credential (default: the Hub's quota, halved when anonymous).
HF_REQUESTS_PER_5MIN = (
    env.integer("HF_REQUESTS_PER_5MIN", 0, minimum=1)
    if env.is_set("HF_REQUESTS_PER_5MIN")
    else None
)
HF_MAX_ATTEMPTS = env.integer("HF_MAX_ATTEMPTS", 5, minimum=1, maximum=20)
HF_TIMEOUT_SECONDS = env.integer("HF_TIMEOUT_SECONDS", 20, minimum=1, maximum=300)
#: Commits read back on a repo's first sync (newest first).
REGISTRY_HISTORY_LIMIT = env.integer("REGISTRY_HISTORY_LIMIT", 50, minimum=1, maximum=10000)
REGISTRY_MAX_TEMPLATE_BYTES = env.integer("REGISTRY_MAX_TEMPLATE_BYTES", 1 << 20, minimum=1024)
REGISTRY_MAX_JSON_BYTES = env.integer("REGISTRY_MAX_JSON_BYTES", 16 << 20, minimum=1024)
#: Larger tokenizer.json files are not fetched; their models get byte-level checks only.
REGISTRY_MAX_TOKENIZER_BYTES = env.integer("REGISTRY_MAX_TOKENIZER_BYTES", 64 << 20, minimum=1024)
#: Repos a batch sync (beat's `hub.sync_stalest`) reads at once; all share the Hub quota.
REGISTRY_SYNC_CONCURRENCY = env.integer("REGISTRY_SYNC_CONCURRENCY", 4, minimum=1, maximum=32)
#: A GGUF header (its vocabulary comes before the template) is read up to this many bytes.
REGISTRY_GGUF_MAX_HEADER_BYTES = env.integer(
    "REGISTRY_GGUF_MAX_HEADER_BYTES", 32 << 20, minimum=4096
)
#: GGUF files whose headers are read per repo (quantizations of one model); the rest are listed.
REGISTRY_GGUF_MAX_FILES = env.integer("REGISTRY_GGUF_MAX_FILES", 8, minimum=1, maximum=200)

# Discovery (docs/registry.md): the most used chat models of the Hub, tracked without anyone
# typing a repo id. Each sort asks each pipeline tag for its top DISCOVERY_LIMIT repos.
DISCOVERY_LIMIT = env.integer("DISCOVERY_LIMIT", 100, minimum=1, maximum=10000)
DISCOVERY_SORTS = env.items("DISCOVERY_SORTS", ["downloads", "trendingScore"])
DISCOVERY_PIPELINE_TAGS = env.items(
    "DISCOVERY_PIPELINE_TAGS", ["text-generation", "image-text-to-text"]
)
#: Hub tags a discovered repo must carry: the Hub tags models with a chat template so.
DISCOVERY_TAGS = env.text("DISCOVERY_TAGS", "conversational")
#: Hours between scheduled discoveries; 0 runs it only on demand.
DISCOVERY_EVERY_HOURS = env.integer("DISCOVERY_EVERY_HOURS", 24, minimum=0)

# Email: SMTP when EMAIL_HOST is set, else messages are written under VAR_DIR/mail.
EMAIL_HOST = env.text("EMAIL_HOST", "")
if EMAIL_HOST:
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_PORT = env.integer("EMAIL_PORT", 587, minimum=1, maximum=65535)
    EMAIL_HOST_USER = env.text("EMAIL_HOST_USER", "")
    EMAIL_HOST_PASSWORD = env.text("EMAIL_HOST_PASSWORD", "")
    EMAIL_USE_TLS = env.flag("EMAIL_USE_TLS", True)
    EMAIL_TIMEOUT = 10
else:
    EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    EMAIL_FILE_PATH = env.text("EMAIL_FILE_PATH", str(VAR_DIR / "mail"))
DEFAULT_FROM_EMAIL = env.text("DEFAULT_FROM_EMAIL", "CacheSafe <alerts@cachesafe.localhost>")

# Alerts (docs/alerts.md). Loopback webhooks are for local testing only, never in production.
ALERTS_ALLOW_LOOPBACK = env.flag("ALERTS_ALLOW_LOOPBACK", False)
if ALERTS_ALLOW_LOOPBACK and not DEBUG:
    raise ConfigError("ALERTS_ALLOW_LOOPBACK is for local testing: turn it off when DEBUG is off")
ALERTS_HTTP_TIMEOUT = env.integer("ALERTS_HTTP_TIMEOUT", 5, minimum=1, maximum=30)
ALERTS_EVENT_MAX_AGE_HOURS = env.integer("ALERTS_EVENT_MAX_AGE_HOURS", 48, minimum=1)
LOGIN_URL = "alerts:login"
#: Django's own (by username), then by the address an account was made with (alerts.backends).
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "alerts.backends.AddressBackend",
]
LOGIN_REDIRECT_URL = "alerts:settings"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "django.contrib.staticfiles.storage.StaticFilesStorage"
            if DEBUG
            else "whitenoise.storage.CompressedManifestStaticFilesStorage"
        )
    },
}
WHITENOISE_USE_FINDERS = DEBUG

if not DEBUG:
    SESSION_COOKIE_SECURE = SITE_URL.startswith("https://")
    CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
    SECURE_CONTENT_TYPE_NOSNIFF = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "filters": {"expected_unavailable": {"()": "cachesafe.logs.ExpectedUnavailable"}},
    "loggers": {"django.request": {"filters": ["expected_unavailable"]}},
    "root": {"handlers": ["console"], "level": env.text("LOG_LEVEL", "INFO")},
}
