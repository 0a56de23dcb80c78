"""docker-compose.yml, .env.example and the Dockerfile hold together with the project: every
service is there, every command names a management command, module or option that exists,
every variable is documented in .env.example and read by someone, and the web service's
environment loads the production settings. No Docker engine is needed (`docker compose config`
runs too when the compose plugin is installed)."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import dj_database_url
import pytest
import yaml
from celery.bin.worker import worker as celery_worker_command
from daphne.cli import CommandLineInterface
from django.core.management import get_commands, load_command_class

REPO_ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
ENV_EXAMPLE = REPO_ROOT / ".env.example"
SOURCE_DIRS = ("pokosite", "town", "inference")

SERVICES = {
    "postgres",
    "redis",
    "migrate",
    "web",
    "tick",
    "worker-spark-a",
    "worker-spark-b",
    "cloudflared",
}
REQUIRED = {
    "POKOMACHI_SECRET_KEY",
    "POKOMACHI_ALLOWED_HOSTS",
    "POSTGRES_PASSWORD",
    "REDIS_PASSWORD",
    "CF_ACCESS_TEAM_DOMAIN",
    "CF_ACCESS_AUD",
    "CLOUDFLARE_TUNNEL_TOKEN",
}
# Read by libraries rather than by our code, each checked below.
EXTERNAL_ENV = {"DJANGO_SETTINGS_MODULE", "DATABASE_URL"}

_REFERENCE = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_]\w*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def env_example() -> dict[str, str]:
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}, $$."""

    def substitute(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match["name"], match["op"], match["arg"]
        value = env.get(name)
        if op == ":-":
            return value or arg
        if op == "-":
            return arg if value is None else value
        if (op == ":?" and not value) or (op == "?" and value is None):
            raise KeyError(f"{name}: {arg}")
        return value or ""

    return _REFERENCE.sub(substitute, text)


def resolve(node, env: dict[str, str]):
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [resolve(item, env) for item in node]
    if isinstance(node, dict):
        return {key: resolve(value, env) for key, value in node.items()}
    return node


@pytest.fixture(scope="module")
def compose() -> dict:
    return resolve(yaml.safe_load(COMPOSE_FILE.read_text()), env_example())


def app_services(compose: dict) -> dict[str, dict]:
    """The services that run the project's image."""
    return {name: s for name, s in compose["services"].items() if "build" in s}


def command_lines(service: dict) -> list[list[str]]:
    argv = service["command"]
    if argv[:2] == ["sh", "-c"]:
        return [shlex.split(part) for part in argv[2].split("&&")]
    return [argv]


def referenced_variables() -> set[str]:
    return {m["name"] for m in _REFERENCE.finditer(COMPOSE_FILE.read_text()) if m["name"]}


def project_source() -> str:
    return "\n".join(
        path.read_text() for d in SOURCE_DIRS for path in sorted((REPO_ROOT / d).rglob("*.py"))
    )


def test_the_compose_file_has_every_service(compose):
    assert set(compose["services"]) == SERVICES
    assert set(app_services(compose)) == {
        "migrate",
        "web",
        "tick",
        "worker-spark-a",
        "worker-spark-b",
    }


def test_every_variable_is_documented_in_env_example_and_used():
    assert referenced_variables() == set(env_example())


def test_secrets_and_access_settings_are_required():
    required = {
        m["name"] for m in _REFERENCE.finditer(COMPOSE_FILE.read_text()) if m["op"] in (":?", "?")
    }
    assert required == REQUIRED
    for name in REQUIRED:
        env = {k: v for k, v in env_example().items() if k != name}
        with pytest.raises(KeyError, match=name):
            resolve(yaml.safe_load(COMPOSE_FILE.read_text()), env)


def test_management_commands_exist_and_accept_their_options(compose):
    commands = get_commands()
    seen = set()
    for name, service in app_services(compose).items():
        for argv in command_lines(service):
            if argv[:2] != ["python", "manage.py"]:
                continue
            command = argv[2]
            assert command in commands, f"{name}: no management command {command!r}"
            parser = load_command_class(commands[command], command).create_parser(
                "manage.py", command
            )
            parser.parse_args(argv[3:])  # exits (fails the test) on an unknown option
            seen.add(command)
    assert seen == {"migrate", "seed_town", "tick_loop"}


def test_the_web_server_serves_the_asgi_application(compose):
    argv = compose["services"]["web"]["command"]
    assert argv[0] == "daphne"
    args = CommandLineInterface().parser.parse_args(argv[1:])
    assert (args.host, args.port, args.proxy_headers) == ("0.0.0.0", 8000, True)
    module_name, _, attribute = args.application.partition(":")
    assert callable(getattr(importlib.import_module(module_name), attribute))
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert f"CMD {json.dumps(argv)}" in dockerfile  # the image's default command


def test_each_worker_consumes_its_own_node_queue_on_a_reserved_gpu(compose):
    worker_options = {opt for p in celery_worker_command.params for opt in p.opts}
    for node in ("spark-a", "spark-b"):
        service = compose["services"][f"worker-{node}"]
        argv = service["command"]
        assert argv[:4] == ["celery", "-A", "pokosite", "worker"]
        assert importlib.import_module("pokosite.celery").app.main == "pokosite"
        options = dict(zip(argv[4::2], argv[5::2], strict=True))
        assert set(options) <= worker_options, set(options) - worker_options
        assert options["-Q"] == node
        assert options["--pool"] == "threads"  # threads share the one engine
        assert options["-n"] == f"{node}@%h"
        assert int(options["--concurrency"]) >= 1
        env = service["environment"]
        assert node in env["POKOMACHI_NODES"].split(",")
        assert env["POKOMACHI_DEVICE"] == "cuda"
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
        assert len(device["device_ids"]) == 1
        assert any(v.endswith(":/models:ro") for v in service["volumes"])
        # A GPU node runs its worker alone: nothing it would have to start there.
        assert "depends_on" not in service
    # The web side routes to exactly these nodes.
    for name in ("web", "tick"):
        nodes = compose["services"][name]["environment"]["POKOMACHI_NODES"]
        assert nodes.split(",") == ["spark-a", "spark-b"]


def test_app_environment_variables_are_read_by_the_project(compose):
    source = project_source()
    assert inspect.signature(dj_database_url.config).parameters["env"].default == "DATABASE_URL"
    for name, service in app_services(compose).items():
        for variable in service["environment"]:
            if variable in EXTERNAL_ENV:
                continue
            assert f'"{variable}"' in source, f"{name}: nothing in the project reads {variable}"


_SETTINGS_DUMP = """
import json
import django
django.setup()
from django.conf import settings as s
from pokosite.cloudflare_access.config import access_config
access = access_config()
print(json.dumps({
    "DEBUG": s.DEBUG,
    "ALLOWED_HOSTS": s.ALLOWED_HOSTS,
    "CSRF_TRUSTED_ORIGINS": s.CSRF_TRUSTED_ORIGINS,
    "DATABASE": [s.DATABASES["default"][k] for k in ("ENGINE", "HOST", "NAME", "USER")],
    "REDIS_URL": s.REDIS_URL,
    "INFERENCE_NODES": s.INFERENCE_NODES,
    "INFERENCE_ENGINE": s.INFERENCE_ENGINE,
    "MIDDLEWARE": s.MIDDLEWARE,
    "STATICFILES": s.STORAGES["staticfiles"]["BACKEND"],
    "SECURE_PROXY_SSL_HEADER": s.SECURE_PROXY_SSL_HEADER,
    "COOKIES_SECURE": [s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE],
    "HSTS": s.SECURE_HSTS_SECONDS,
    "ACCESS": [
        access.issuer, access.certs_url, list(access.audiences), sorted(access.superuser_emails)
    ],
}))
"""


def settings_with(environment: dict[str, str], tmp_path: Path) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("POKOMACHI_", "CF_ACCESS_"))}
    result = subprocess.run(
        [sys.executable, "-c", _SETTINGS_DUMP],
        cwd=REPO_ROOT,
        # .env.example's placeholder key is refused (tests/pokosite/test_settings.py): a real
        # one, as an operator fills in.
        env={
            **clean,
            **environment,
            "POKOMACHI_SECRET_KEY": secrets.token_urlsafe(50),
            "POKOMACHI_VAR_DIR": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_web_environment_loads_the_production_settings(compose, tmp_path):
    env = compose["services"]["web"]["environment"]
    assert env["DJANGO_SETTINGS_MODULE"] == "pokosite.settings.production"
    dumped = settings_with(env, tmp_path)
    assert dumped["HSTS"] == 31_536_000
    assert dumped["DEBUG"] is False
    assert dumped["ALLOWED_HOSTS"] == ["town.example.com"]
    assert dumped["CSRF_TRUSTED_ORIGINS"] == ["https://town.example.com"]
    assert dumped["DATABASE"] == [
        "django.db.backends.postgresql",
        "postgres",
        "pokomachi",
        "pokomachi",
    ]
    assert dumped["REDIS_URL"].endswith("@redis:6379/0")
    assert dumped["INFERENCE_NODES"] == ["spark-a", "spark-b"]
    assert dumped["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert dumped["COOKIES_SECURE"] == [True, True]
    middleware = dumped["MIDDLEWARE"]
    access = middleware.index("pokosite.cloudflare_access.middleware.CloudflareAccessMiddleware")
    assert middleware[access + 1] == "whitenoise.middleware.WhiteNoiseMiddleware"
    assert middleware.index("django.contrib.auth.middleware.AuthenticationMiddleware") < access
    assert dumped["STATICFILES"].startswith("whitenoise.storage.")
    assert dumped["ACCESS"] == [
        "https://myteam.cloudflareaccess.com",
        "https://myteam.cloudflareaccess.com/cdn-cgi/access/certs",
        [env_example()["CF_ACCESS_AUD"]],
        ["admin@example.com"],
    ]


def test_a_worker_environment_loads_its_engine_settings(compose, tmp_path):
    env = compose["services"]["worker-spark-b"]["environment"]
    dumped = settings_with(env, tmp_path)
    assert dumped["INFERENCE_ENGINE"] == {
        "model": "smollm2-135m-instruct",
        "device": "cuda",
        "retention_interval": None,  # "dense" in the compose file
        "kv_disk_cache_dir": "/kv-cache",  # the kv-cache volume every worker mounts
        "kv_disk_cache_bytes": 20 << 30,
        "kv_disk_cache_ttl_s": 3 * 86400.0,
        "kv_host_cache_bytes": 0,
        "kv_tiers_where_supported": False,
        "weights": "auto",  # fp32 on CUDA (the quantized layers are CPU kernels)
        "kv_cache_dtype": "bfloat16",  # the model's dtype on CUDA
        "prefill_chunk_while_decoding": 256,
        "grammar_compile_workers": 2,  # compiles off the serving threads where deployed
        "grammar_compile_timeout_s": 20.0,  # a schema's compile is killed past this
    }
    volumes = compose["services"]["worker-spark-b"]["volumes"]
    assert "kv-cache:/kv-cache" in volumes
    assert "kv-cache:/kv-cache" in compose["services"]["worker-spark-a"]["volumes"]


def test_only_the_tunnel_reaches_the_web_server(compose):
    services = compose["services"]
    assert "ports" not in services["web"]
    cloudflared = services["cloudflared"]
    assert cloudflared["command"][:1] == ["tunnel"] and cloudflared["command"][-1] == "run"
    assert cloudflared["environment"]["TUNNEL_TOKEN"] == env_example()["CLOUDFLARE_TUNNEL_TOKEN"]
    assert cloudflared["depends_on"]["web"]["condition"] == "service_healthy"
    # The web health check asks the one open path.
    assert "/healthz" in " ".join(services["web"]["healthcheck"]["test"])


def _pip_installs(text: str) -> list[list[str]]:
    """The arguments of every `pip install` in a Dockerfile or Makefile (continued lines joined,
    make's and the shell's variables left as they are)."""
    joined = text.replace("\\\n", " ")
    installs = []
    for line in joined.splitlines():
        for command in re.split(r"&&|;", line):
            words = command.split()
            for index, word in enumerate(words[:-1]):
                is_pip = word.endswith("pip") or word == "$(PIP)"
                if is_pip and words[index + 1] == "install":
                    installs.append(words[index + 2 :])
    return installs


def _packages(installs: list[list[str]]) -> set[str]:
    return {arg.strip("'\"") for args in installs for arg in args if not arg.startswith("-")}


def test_the_dockerfile_installs_like_make_setup():
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r"^setup:", makefile, re.M)
    (torch_pin,) = set(re.findall(r"torch==[\d.]+", makefile))
    assert set(re.findall(r"torch==[\d.]+", dockerfile)) == {torch_pin}
    # The same pinned packages as `make setup`, the project itself aside.
    pinned = {p for p in _packages(_pip_installs(makefile)) if "==" in p}
    assert pinned and pinned <= _packages(_pip_installs(dockerfile))
    assert "collectstatic" in dockerfile
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    for path in (".venv", ".env", "var", ".git"):
        assert path in ignored


def test_the_production_image_installs_no_test_extras():
    """The Dockerfile's install line names the project without extras, and none of the [test]
    extra's packages is a dependency of the project or installed on its own."""
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]

    def name(requirement: str) -> str:
        return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower()

    test_extras = {name(r) for r in project["optional-dependencies"]["test"]}
    assert {"pytest", "transformers", "playwright"} <= test_extras
    assert not test_extras & {name(r) for r in project["dependencies"]}
    installs = _pip_installs((REPO_ROOT / "Dockerfile").read_text())
    projects = [args for args in installs if "." in args or "-e" in args]
    assert projects, "the Dockerfile does not install the project"
    for args in projects:
        target = args[args.index("-e") + 1] if "-e" in args else "."
        assert target.strip("'\"") == ".", f"the image installs the project as {target}"
    assert not test_extras & {name(p) for p in _packages(installs)}


def test_the_kv_cache_volume_is_where_the_settings_look_and_the_image_user_owns_it(
    compose, tmp_path
):
    dockerfile = (REPO_ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    (user,) = re.findall(r"^USER (\S+)", dockerfile, re.M)
    for service in ("worker-spark-a", "worker-spark-b"):
        spec = compose["services"][service]
        path = settings_with(spec["environment"], tmp_path)["INFERENCE_ENGINE"]["kv_disk_cache_dir"]
        mounts = {v.split(":")[1]: v.split(":")[0] for v in spec["volumes"]}
        assert mounts.get(path) == "kv-cache", f"{service}: the KV disk tier {path} is not mounted"
        assert "kv-cache" in compose["volumes"]
        # A fresh named volume copies its mount point's owner from the image: created, owned.
        assert re.search(rf"mkdir -p [^&]*{re.escape(path)}(\s|$)", dockerfile, re.M)
        assert re.search(rf"chown {user} [^&]*{re.escape(path)}(\s|$)", dockerfile, re.M)


def _compose_plugin() -> bool:
    if not shutil.which("docker"):
        return False
    return subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _compose_plugin(), reason="the docker compose plugin is not installed")
def test_docker_compose_config_accepts_the_file():
    result = subprocess.run(
        [
            "docker",
            "compose",
            "--env-file",
            str(ENV_EXAMPLE),
            "-f",
            str(COMPOSE_FILE),
            "config",
            "-q",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


def test_every_image_is_pinned_to_a_version(compose):
    """No `:latest` and no bare name: a redeploy must run what was tested."""
    texts = [COMPOSE_FILE.read_text(), ENV_EXAMPLE.read_text()]
    images = {name: s["image"] for name, s in compose["services"].items() if "image" in s}
    assert set(images) == SERVICES
    for name, image in images.items():
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: image {image!r} has no tag"
        assert re.fullmatch(r"\d+(\.\d+)+(-[a-z]+)?", tag), f"{name}: {image!r} is not a version"
    for text in texts:
        assert ":latest" not in text
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    (base,) = re.findall(r"^FROM (\S+)", dockerfile, re.M)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", base), base


def _docker_engine() -> str | None:
    """Why no image can be built here, or None when a Docker engine answers."""
    if not shutil.which("docker"):
        return "no docker CLI on this machine: the image build is not tested here"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    if info.returncode != 0:
        return f"no Docker engine answers (docker info: {info.stderr.strip()[:200]})"
    return None


@pytest.mark.skipif(_docker_engine() is not None, reason=str(_docker_engine()))
def test_the_image_builds_and_collects_its_static_files():
    # The Dockerfile runs collectstatic under production settings: a broken manifest fails here.
    result = subprocess.run(
        ["docker", "compose", "--env-file", str(ENV_EXAMPLE), "-f", str(COMPOSE_FILE),
         "build", "web"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
