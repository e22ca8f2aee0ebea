# RoboCache image: CUDA runtime, torch, robocache with its data, ray, metrics and video extras;
# entrypoint `robocache`, non-root user.
#
#   docker build -t robocache:0.1.0 .
#   docker run --rm robocache:0.1.0 info                      # smoke test (no GPU needed)
#   docker run --rm --gpus all -v /data:/data robocache:0.1.0 ingest /data/src /data/cache
#
# Two stages: the build stage compiles nothing but keeps pip, caches and build tools out of the
# runtime image, which receives only the virtual environment.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128

FROM ${CUDA_IMAGE} AS build
ARG TORCH_INDEX
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/robocache
ENV PATH=/opt/robocache/bin:$PATH
RUN pip install --no-cache-dir --index-url ${TORCH_INDEX} torch==2.13.0 triton==3.6.0
COPY pyproject.toml README.md /src/
COPY src /src/src
RUN pip install --no-cache-dir "/src[data,ray,metrics,video]" \
 && python -c "import robocache, ray.data, lance, prometheus_client"

FROM ${CUDA_IMAGE}
# python3 for the environment; wget for KubeRay's health probes
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 wget \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 --user-group robocache
COPY --from=build /opt/robocache /opt/robocache
ENV PATH=/opt/robocache/bin:$PATH \
    PYTHONUNBUFFERED=1
USER 10001
WORKDIR /home/robocache
ENTRYPOINT ["robocache"]
CMD ["info"]
