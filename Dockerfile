# syntax=docker/dockerfile:1
# The dra-quota image: the `dra-quota` console script on a small Python base, as the
# Helm chart runs it (deploy/helm/dra-quota: `args: [serve, ...]`, user 65532, read-only
# root filesystem). Built and smoke-tested by tests/tools/build-image.sh (buildah, no
# daemon); with Docker:
#   docker build -t <registry>/dra-quota:0.1.0 . && docker push <registry>/dra-quota:0.1.0
#
# The base by digest, so a rebuild gets the same bytes: python:3.11-slim (Python 3.11.15 on
# Debian trixie, the version the test suite runs on) for linux/amd64, the platform manifest
# that the tag's index listed on 2026-08-05 (docker-library/repo-info,
# repos/python/remote/3.11-slim.md). The index (every platform) is
# sha256:90744cff8f32887f075c47d747a173ff333e9e98801667af93c357fa9f5e28ff; pass
# --build-arg PYTHON_IMAGE=python:3.11-slim@<that> to build for another architecture.
ARG PYTHON_IMAGE=python:3.11-slim@sha256:78b39ef14d8e2b4d71f8dc304f1328c37df95fe0ef99477c2ae6bd3d03784553

# Build stage: every dependency's wheel from the hash-pinned lock (requirements/refresh.sh;
# --require-hashes refuses any other file, --only-binary means nothing is compiled and no
# unpinned build backend is fetched), then our own wheel, built by the locked setuptools.
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY requirements/runtime.lock ./requirements/
RUN pip wheel --no-cache-dir --disable-pip-version-check --require-hashes --only-binary :all: \
        --wheel-dir /wheels -r requirements/runtime.lock \
 && pip install --no-cache-dir --disable-pip-version-check --no-index --no-deps /wheels/setuptools-*.whl
COPY pyproject.toml README.md ./
COPY quota ./quota
COPY runtime ./runtime
COPY kube ./kube
COPY controllers ./controllers
COPY webhook ./webhook
COPY commands ./commands
COPY certs ./certs
# devcluster (the local cluster of `dra-quota demo` and the e2e tests) is part of the
# distribution; in the image, with no checkout to build a control plane in, `demo` says so and
# runs `check` on the packaged examples. The packages hold all the program reads (package
# data: tests/unit/test_install.py builds from exactly these copies).
COPY devcluster ./devcluster
RUN pip wheel --no-cache-dir --disable-pip-version-check --no-index --no-deps --no-build-isolation \
        --wheel-dir /wheels .

# Final stage: the wheels installed from a bind mount (nothing of the build stage stays
# in a layer), offline: /wheels holds exactly the locked versions, checked above. The
# build backend's wheel is there too but nothing depends on it, so it is not installed.
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --disable-pip-version-check --no-index --find-links=/wheels dra-quota
# Numeric, so that runAsNonRoot can verify it without an /etc/passwd entry.
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["dra-quota"]
CMD ["serve"]
