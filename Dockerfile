# hftoolkit on GPU servers. Build and run (see "Docker on GPU servers" in README.md):
#   docker build -t hftoolkit .
#   mkdir -p runs && docker run --rm --gpus all --ipc=host -v hf-cache:/home/app/.cache/huggingface \
#     -v "$PWD/runs:/workspace/runs" hftoolkit train recipes/encoder-classification.yaml
#
# Base: the official PyTorch runtime image, whose torch 2.13.0 is built against the
# CUDA 12.6 runtime and cuDNN 9 it ships. Host needs a CUDA 12 NVIDIA driver (525 or
# newer, 560+ best) and the NVIDIA Container Toolkit. No compiler toolchain: DeepSpeed
# runs ZeRO with the Trainer's torch optimizer; CPU/NVMe offload (DeepSpeedCPUAdam)
# compiles an extension and needs a -devel base. CI builds this file unchanged on a local
# stand-in with the same name (tests/docker/standin-base.sh).
FROM pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Non-root user; the uid/gid can match the host user who owns bind-mounted folders:
#   docker build --build-arg APP_UID="$(id -u)" --build-arg APP_GID="$(id -g)" -t hftoolkit .
# (or run with --user "$(id -u):$(id -g)": the writable folders below accept any uid).
ARG APP_UID=1000
ARG APP_GID=1000

# HOME is set for uids without an account (docker run --user), which Docker would give HOME=/.
# The toolkit's own cache (tiny init: checkpoints, converted GGUF files) lives on the cache volume.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    HOME=/home/app \
    HF_HOME=/home/app/.cache/huggingface \
    HFTOOLKIT_CACHE=/home/app/.cache/huggingface/hftoolkit

# Ubuntu base images may already hold a user or group with the wanted ids ("ubuntu",
# 1000): drop it so that "app" owns exactly those ids. Id 0 is root's, which cannot be
# dropped. The folders a run writes are open to every uid (sticky, as /tmp), so that
# `docker run --user` works with any uid; a fresh cache volume copies these modes.
RUN if [ "${APP_UID}" = 0 ] || [ "${APP_GID}" = 0 ]; then \
      echo "APP_UID=${APP_UID} APP_GID=${APP_GID}: id 0 is root's and the image runs as a non-root user; leave both unset, pass your own ids, or run a container as root with docker run --user 0" >&2; \
      exit 1; \
    fi; \
    user="$(getent passwd "${APP_UID}" | cut -d: -f1)"; \
    if [ -n "${user}" ]; then userdel "${user}"; fi; \
    group="$(getent group "${APP_GID}" | cut -d: -f1)"; \
    if [ -n "${group}" ]; then groupdel "${group}"; fi; \
    groupadd --gid "${APP_GID}" app \
    && useradd --uid "${APP_UID}" --gid app --create-home --shell /bin/bash app \
    && mkdir -p "${HFTOOLKIT_CACHE}" /workspace/runs /workspace/data \
    && chown -R app:app /home/app /workspace \
    && chmod 1777 /home/app /home/app/.cache "${HF_HOME}" "${HFTOOLKIT_CACHE}" /workspace /workspace/runs

# The package's dependencies first, read from pyproject.toml alone, at the versions the suite passed with
# (constraints.txt): this layer stays cached until they change, so editing the source reinstalls only the package.
# torch is held at the base image's CUDA build so that pip cannot swap it for another build while resolving.
WORKDIR /opt/hftoolkit
COPY pyproject.toml constraints.txt ./
RUN echo "torch==$(python -c 'import torch; print(torch.__version__)')" > /tmp/torch-constraint.txt \
    && python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
extras = p["optional-dependencies"]; \
print("\n".join(p["dependencies"] + [r for name, reqs in extras.items() if name not in ("test", "all") for r in reqs]))' \
       > /tmp/requirements.txt \
    && pip install --no-cache-dir --constraint /tmp/torch-constraint.txt --constraint constraints.txt \
       --requirement /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The package source, installed into the image's Python with every optional feature; the build context is filtered
# by .dockerignore. The recipes ship inside the package: `hftoolkit train NAME` (or recipes/NAME.yaml) finds them.
COPY . .
RUN pip install --no-cache-dir --constraint /tmp/torch-constraint.txt --constraint constraints.txt '.[all]' \
    && rm /tmp/torch-constraint.txt \
    && hftoolkit --help > /dev/null

USER ${APP_UID}:${APP_GID}
WORKDIR /workspace

# `hftoolkit serve RUN_DIR --host 0.0.0.0` listens here (publish it with -p 8000:8000).
EXPOSE 8000

# Model/dataset downloads survive container restarts; run directories land outside.
VOLUME ["/home/app/.cache/huggingface", "/workspace/runs"]

ENTRYPOINT ["hftoolkit"]
CMD ["--help"]
