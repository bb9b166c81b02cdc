# Production image for web, worker and beat (see docker-compose.yml).
FROM python:3.11-slim-bookworm
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 CACHESAFE_VAR_DIR=/var/lib/cachesafe
WORKDIR /app
RUN pip install --no-cache-dir uv==0.13.9
COPY requirements.lock ./
RUN uv pip sync --system --require-hashes requirements.lock
COPY . .
RUN useradd --create-home cachesafe && mkdir -p /var/lib/cachesafe \
    && DEBUG=false SECRET_KEY=build-only python manage.py collectstatic --noinput \
    && chown -R cachesafe /var/lib/cachesafe
USER cachesafe
EXPOSE 8000
CMD ["gunicorn", "cachesafe.wsgi", "--config", "python:cachesafe.webserver", "--bind", "0.0.0.0:8000"]
