# leaderd container image: a small, non-root image whose entrypoint is the daemon.
#
#   docker build -t leaderd .
#   docker run --rm -v leaderd-run:/run/leaderd leaderd run --backend static://
#
# BASE is any Debian 12 image with python3 and its venv module (ensurepip): the default is
# Docker Hub's; where no registry can be reached, packaging/debian-base-image.sh makes one
# from Debian's packages (--build-arg BASE=localhost/leaderd-base:bookworm).
#
# Reproducible: every dependency comes from packaging/requirements.lock and the build
# backend from packaging/build.lock, each pinned to one version with the sha256 of its files
# (pip --require-hashes installs nothing else; packaging/lock.sh regenerates both). For the
# base, use the one packaging/debian-base-image.sh builds, or name the default by digest:
# --build-arg BASE=python:3.11-slim-bookworm@sha256:...
#
# The builder stage turns the source into wheels (leaderd, built without build isolation
# by the locked backend, and every locked dependency, all of which ship binary wheels for
# CPython 3.11, so no compiler is needed) and installs them into a virtualenv without pip;
# the final stage copies only that virtualenv. pip itself comes from ensurepip in a
# throwaway virtualenv, the same way on either base. tests/deploy/test_container.py replays
# the builder's RUN lines in a temporary directory (keep them plain shell), then
# test_image.py builds and runs the image with podman.

ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY . /src
RUN python3 -m venv /build \
 && /build/bin/python -m pip install --require-hashes --no-deps -r /src/packaging/build.lock \
 && /build/bin/python -m pip wheel --no-deps --no-build-isolation --wheel-dir /wheels /src \
 && /build/bin/python -m pip download --require-hashes --no-deps --only-binary=:all: \
      --dest /wheels -r /src/packaging/requirements.lock
RUN python3 -m venv --without-pip /opt/leaderd \
 && /build/bin/python -m pip --python /opt/leaderd/bin/python install --no-index \
      --find-links /wheels --require-hashes --no-deps -r /src/packaging/requirements.lock \
 && /build/bin/python -m pip --python /opt/leaderd/bin/python install --no-index --no-deps \
      /wheels/leaderd-*.whl \
 && /build/bin/python -m pip --python /opt/leaderd/bin/python check \
 && /opt/leaderd/bin/leaderd --version

FROM ${BASE}
LABEL org.opencontainers.image.title="leaderd" \
      org.opencontainers.image.description="Leader election sidecar daemon" \
      org.opencontainers.image.licenses="Apache-2.0"
# A fixed numeric id, so Kubernetes' runAsNonRoot can check it.
RUN groupadd --system --gid 10001 leaderd \
 && useradd --system --uid 10001 --gid leaderd --home-dir /var/lib/leaderd --no-create-home \
      --shell /usr/sbin/nologin leaderd \
 && install -d -o leaderd -g leaderd -m 0750 /run/leaderd /var/lib/leaderd
COPY --from=builder /opt/leaderd /opt/leaderd
# RUNTIME_DIRECTORY/STATE_DIRECTORY are what systemd would set: the default socket
# is /run/leaderd/leaderd.sock and the default SQLite file /var/lib/leaderd/leaderd.db.
ENV PATH=/opt/leaderd/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    RUNTIME_DIRECTORY=/run/leaderd \
    STATE_DIRECTORY=/var/lib/leaderd
# The socket directory is shared with the app's container; SQLite's lives on.
VOLUME ["/run/leaderd", "/var/lib/leaderd"]
USER 10001:10001
# The optional read-only probe listener (--listen 0.0.0.0:4040).
EXPOSE 4040
# leaderd releases its leases and exits 0 on SIGTERM, within shutdown_timeout (10s).
STOPSIGNAL SIGTERM
ENTRYPOINT ["leaderd"]
CMD ["run"]
