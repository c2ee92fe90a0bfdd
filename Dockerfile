# hftoolkit on GPU servers. Build and run (see "Docker on GPU servers" in README.md):
#   docker build -t hftoolkit .
#   docker run --rm --gpus all --ipc=host -v hf-cache:/home/app/.cache/huggingface \
#     -v "$PWD/runs:/workspace/runs" hftoolkit train recipes/encoder-classification.yaml
#
# Base: the official PyTorch runtime image, whose torch 2.13.0 is built against the
# CUDA 12.6 runtime and cuDNN 9 it ships. Host needs a CUDA 12 NVIDIA driver (525 or
# newer, 560+ best) and the NVIDIA Container Toolkit. No compiler toolchain: DeepSpeed
# runs ZeRO with the Trainer's torch optimizer; CPU/NVMe offload (DeepSpeedCPUAdam)
# compiles an extension and needs a -devel base.
FROM pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Non-root user; the uid/gid can match the host user who owns bind-mounted folders:
#   docker build --build-arg APP_UID="$(id -u)" --build-arg APP_GID="$(id -g)" -t hftoolkit .
ARG APP_UID=1000
ARG APP_GID=1000

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    HF_HOME=/home/app/.cache/huggingface

# Ubuntu base images may already hold a user or group with the wanted ids ("ubuntu",
# 1000): drop it so that "app" owns exactly those ids.
RUN user="$(getent passwd "${APP_UID}" | cut -d: -f1)"; \
    if [ -n "${user}" ]; then userdel "${user}"; fi; \
    group="$(getent group "${APP_GID}" | cut -d: -f1)"; \
    if [ -n "${group}" ]; then groupdel "${group}"; fi; \
    groupadd --gid "${APP_GID}" app \
    && useradd --uid "${APP_UID}" --gid app --create-home --shell /bin/bash app \
    && mkdir -p "${HF_HOME}" /workspace/runs /workspace/data \
    && chown -R app:app /home/app /workspace

# The package source, installed into the image's Python; the build context is
# filtered by .dockerignore. torch is held at the base image's CUDA build so that
# pip cannot swap it for another build while resolving the package's dependencies.
WORKDIR /opt/hftoolkit
COPY . .
RUN echo "torch==$(python -c 'import torch; print(torch.__version__)')" > /tmp/torch-constraint.txt \
    && pip install --no-cache-dir --constraint /tmp/torch-constraint.txt '.[deepspeed]' \
    && rm /tmp/torch-constraint.txt \
    && cp -r recipes /workspace/recipes \
    && hftoolkit --help > /dev/null

USER ${APP_UID}:${APP_GID}
WORKDIR /workspace

# Model/dataset downloads survive container restarts; run directories land outside.
VOLUME ["/home/app/.cache/huggingface", "/workspace/runs"]

ENTRYPOINT ["hftoolkit"]
CMD ["--help"]
