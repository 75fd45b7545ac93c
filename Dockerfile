# syntax=docker/dockerfile:1
# The dra-quota image: the `dra-quota` console script on a small Python base, as the
# Helm chart runs it (deploy/helm/dra-quota: `args: [serve, ...]`, user 65532, read-only
# root filesystem). Not built in this repository's CI (no container runtime there):
#   docker build -t <registry>/dra-quota:0.1.0 . && docker push <registry>/dra-quota:0.1.0
# Python 3.11: the version the test suite runs on (pyproject: >=3.11).
ARG PYTHON_IMAGE=python:3.11-slim

# Build stage: our wheel and every dependency's wheel (binary wheels exist for the
# compiled ones, cryptography and google-re2, so no compiler is needed either).
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY quota ./quota
COPY webhook ./webhook
COPY certs ./certs
# devcluster (the local cluster of `dra-quota demo` and the e2e tests) is part of the
# distribution; in the image, without Go, a binary or examples/, `demo` says it needs a checkout.
COPY devcluster ./devcluster
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# Final stage: the wheels installed from a bind mount (nothing of the build stage stays
# in a layer); no compiler, no sources, no wheel files.
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels dra-quota
# Numeric, so that runAsNonRoot can verify it without an /etc/passwd entry.
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["dra-quota"]
CMD ["serve"]
