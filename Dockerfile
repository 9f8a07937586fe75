# attnserve: one image per attention variant.
#
#   exporter stage  PyTorch (CPU) + attnserve: exports any model, or serves one exporting it on
#                   first start (`--target exporter`: a model of your own mounted or named by
#                   ATTNSERVE_MODEL, and the Kubernetes init container of components/model)
#   export stage    the exporter run for VARIANT on the bundled model, at build time
#   runtime stage   onnxruntime-gpu + the service + that export; no torch, non-root (the default)
#
# BASE_IMAGE is a CUDA runtime image (CUDA 13 + cuDNN 9: onnxruntime-gpu 1.31's CUDA provider
# links libcudart.so.13) so the CUDA execution provider works on a GPU host; the service falls
# back to the CPU provider elsewhere. Any Debian/Ubuntu image works: python3 and venv are
# installed when the base lacks them. `docker build -t attnserve .` builds on the CUDA base
# below; docker/README.md has the path for machines that cannot pull public images.
ARG BASE_IMAGE=nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04

# ---------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS python
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# CUDA images ship without Python; the local base already has it (then apt is skipped).
RUN if ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv python3-pip ca-certificates \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && python3 -m venv /opt/venv \
    && (useradd --system --create-home --uid 10001 --shell /usr/sbin/nologin attnserve \
        || useradd --create-home --uid 10001 attnserve)
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

# ---------------------------------------------------------------------------------------
# Dependency lists straight from pyproject.toml. The stages below COPY these files, and a
# COPY is cached by content, so editing pyproject.toml elsewhere (test extras, metadata)
# does not re-run the pip layers; only a changed dependency list does.
FROM python AS requirements
COPY pyproject.toml /tmp/pyproject.toml
RUN mkdir /req && python -c "import tomllib; p = tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']; \
open('/req/runtime.txt', 'w').write('\n'.join(p['dependencies']) + '\n'); \
open('/req/export.txt', 'w').write('\n'.join(p['optional-dependencies']['export']) + '\n')"

# ---------------------------------------------------------------------------------------
FROM python AS server
COPY --from=requirements /req/runtime.txt /req/runtime.txt
RUN pip install -r /req/runtime.txt
COPY pyproject.toml ./
COPY src ./src
RUN (test -f README.md || echo "# attnserve" > README.md) && pip install --no-deps . \
    && rm -rf /src/build /src/*.egg-info
# As an image of its own (`docker build --target server -t attnserve:server .`), it serves an
# export made elsewhere: ATTNSERVE_EXPORT_DIR on a volume, such as the one the init container of
# deploy/kubernetes/components/model fills. 0.0.0.0 so `docker run -p` works; compose and the
# smoke test use host networking and set ATTNSERVE_HOST=127.0.0.1.
ENV ATTNSERVE_HOST=0.0.0.0 \
    ATTNSERVE_PORT=8080
USER attnserve
WORKDIR /home/attnserve
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('ATTNSERVE_PORT', '8080'), timeout=4)"
CMD ["attnserve", "serve"]

# ---------------------------------------------------------------------------------------
FROM python AS exporter
# torch==2.13.0 from PyPI is the multi-GB CUDA build; the exporter only needs the CPU one.
# Put a CPU wheel in ./wheels/ (git-ignored) to install it offline, otherwise it comes from
# PyTorch's CPU index. The glob copies .dockerignore (always there, rarely changed) plus
# wheels/ if it exists, so the build also works from a fresh clone without that folder.
COPY .dockerignore wheel[s] /wheels/
RUN if ls /wheels/torch-*.whl >/dev/null 2>&1; then \
        pip install --find-links /wheels "torch==2.13.0"; \
    else \
        pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"; \
    fi
COPY --from=requirements /req/ /req/
RUN pip install --find-links /wheels -r /req/runtime.txt -r /req/export.txt
COPY pyproject.toml ./
COPY src ./src
RUN (test -f README.md || echo "# attnserve" > README.md) && pip install --no-deps .
# The adapted weights the repository ships (README "Using adapted weights"), for WEIGHTS below.
COPY weights ./weights
# As an image of its own (`docker build --target exporter -t attnserve:exporter .`), it serves
# the model ATTNSERVE_MODEL names (a mounted folder or a Hugging Face Hub id), exporting it on
# first start into ~/.cache/attnserve (mount a volume there to keep it), or runs
# `attnserve prepare` / `attnserve export` (docs/deploy.md, "Your own model").
ENV ATTNSERVE_HOST=0.0.0.0 \
    ATTNSERVE_PORT=8080
USER attnserve
WORKDIR /home/attnserve
EXPOSE 8080
CMD ["attnserve", "serve"]

# ---------------------------------------------------------------------------------------
FROM exporter AS export
USER root
WORKDIR /src
# The variant is chosen last so every variant shares the layers above. VARIANT is a variant
# name or a schedule, a variant per layer (README "A variant per layer: schedules").
ARG VARIANT=longformer
# Space-separated key=value pairs, e.g. "window=512 n_hashes=4".
ARG PARAMS=""
ARG MAX_LENGTH=16384
# float32, int8 (for CPUs) or float16 (for GPUs): the precision of the weight matrix products.
ARG PRECISION=float32
# Adapted weights exported into the graphs: a folder under weights/ made for VARIANT, e.g.
# weights/sinkhorn-x5.longformer for sinkhorn*5,longformer; empty, the pretrained weights.
ARG WEIGHTS=""
RUN set -e; args=""; \
    for kv in $PARAMS; do args="$args --param $kv"; done; \
    if [ -n "$WEIGHTS" ]; then args="$args --weights $WEIGHTS"; fi; \
    attnserve export --variant "$VARIANT" $args --max-length "$MAX_LENGTH" --precision "$PRECISION" --out /export \
    && ls -l /export

# ---------------------------------------------------------------------------------------
FROM server AS runtime
ARG VARIANT=longformer
ARG MAX_LENGTH=16384
ARG PRECISION=float32
ARG WEIGHTS=""
COPY --from=export --chown=root:root /export /opt/attnserve/export
ENV ATTNSERVE_EXPORT_DIR=/opt/attnserve/export \
    ATTNSERVE_VARIANT=${VARIANT} \
    ATTNSERVE_MAX_LENGTH=${MAX_LENGTH} \
    ATTNSERVE_PRECISION=${PRECISION}
LABEL org.opencontainers.image.title="attnserve-${VARIANT}" \
      attnserve.variant="${VARIANT}" \
      attnserve.max_length="${MAX_LENGTH}" \
      attnserve.precision="${PRECISION}" \
      attnserve.weights="${WEIGHTS}"
