# One image for both roles of an rlfleet fleet:
#
#   docker run rlfleet:0.1.0 coordinator --listen 0.0.0.0:50051
#   docker run rlfleet:0.1.0 worker --coordinator HOST:50051
#
# Build (docs/deploy.md):
#   docker build -t rlfleet:0.1.0 .
# Offline, from a local wheelhouse holding every wheel, rlfleet's own included
# (rlfleet's wheel holds compiled extensions: build it with the image's Python
# on the image's platform, docs/deploy.md):
#   pip wheel --no-deps -w wheels .
#   pip download --only-binary=:all: -d wheels wheels/rlfleet-*.whl
#   docker build --network none -t rlfleet:0.1.0 .
#
# Both stages start from the same base so that the virtualenv's interpreter
# symlink points at a Python that exists in the final image. Any image with
# python3 >= 3.11 and its venv module works.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS builder
# Folder of the build context holding wheels for an offline build; when it
# holds no wheel, pip builds rlfleet from source and fetches from the index.
# From source, rlfleet compiles its C modules (the MLP kernel, the result
# reader, the result check, the answer gather, the view check, the unit booking, the seed hash): the builder then installs a C compiler and Python's headers with
# apt-get where they are missing. The final stage never has a compiler.
ARG WHEELHOUSE=wheels
# .dockerignore lets only the package, its metadata and the wheelhouse in.
COPY . /src
# One RUN: every classic-builder step copies the image on some storage
# drivers (vfs), so steps are few. `python3 -m venv`, not a fixed path:
# python:3.11-slim keeps python3 in /usr/local/bin, Debian in /usr/bin.
RUN set -eu; \
    cd /src; \
    export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore; \
    python3 -m venv /opt/rlfleet; \
    version="$(python3 -c 'exec(open("rlfleet/_version.py").read()); print(__version__)')"; \
    if ls "${WHEELHOUSE}"/*.whl >/dev/null 2>&1; then \
        echo "installing rlfleet ${version} offline from ${WHEELHOUSE}/"; \
        /opt/rlfleet/bin/pip install --no-index --find-links "${WHEELHOUSE}" "rlfleet==${version}"; \
    else \
        missing=""; \
        command -v cc >/dev/null 2>&1 || missing="gcc libc6-dev"; \
        python3 -c 'import os, sysconfig; raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
            || missing="${missing} python3-dev"; \
        if [ -n "${missing}" ]; then \
            command -v apt-get >/dev/null 2>&1 || { \
                echo "rlfleet compiles C extensions: install${missing} in this base, or build from a wheelhouse" >&2; exit 1; }; \
            apt-get update -qq; \
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${missing}; \
        fi; \
        /opt/rlfleet/bin/pip install /src; \
    fi; \
    /opt/rlfleet/bin/rlfleet --version

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="rlfleet" \
      org.opencontainers.image.description="rlfleet coordinator and worker (gRPC RL sampling fleet)" \
      org.opencontainers.image.licenses="Apache-2.0"
# RLFLEET_HEALTH_LISTEN: both roles serve grpc.health.v1 in plaintext there
# (the default of --health-listen), and the HEALTHCHECK below asks it.
# Loopback keeps it inside the container; Kubernetes' probes pass
# --health-listen=0.0.0.0:50052 instead. With --network host, give each
# container on a machine its own port. HOME: no passwd entry for the user.
ENV PATH=/opt/rlfleet/bin:${PATH} \
    HOME=/tmp \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    RLFLEET_HEALTH_LISTEN=127.0.0.1:50052
# Numeric, so Kubernetes' runAsNonRoot can check it without a passwd lookup.
USER 10001:10001
# 50053: the lease data channel (--lease-data-listen, default the gRPC port + 2).
EXPOSE 50051 50052 50053
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["rlfleet", "health", "--timeout", "3"]
# Exec form: rlfleet is PID 1 and receives `docker stop`'s SIGTERM itself, so
# it drains within --drain-grace and exits 0 (give `docker stop` more time
# than that: its default is 10 s).
ENTRYPOINT ["rlfleet"]
CMD ["--help"]
# Last, so the settings above stay cached when only rlfleet changes. The
# venv is root-owned and read-only for the user: the image runs with a
# read-only root filesystem.
COPY --from=builder /opt/rlfleet /opt/rlfleet
