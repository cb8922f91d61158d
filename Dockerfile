# saria serve and the vLLM connector (CPU build of vLLM; use your CUDA vLLM image as the
# base instead for GPUs, then `pip install .` on top).
#   docker build -t saria:0.2.0 .
#   docker run --rm -v /mnt/nvme0/saria:/mnt/nvme0/saria -v /run/saria:/run/saria \
#       --ipc=host saria:0.2.0 serve --dram 16GB --ssd-dir /mnt/nvme0/saria --ssd-bytes 1TB \
#       --listen ipc:///run/saria/serve.sock
FROM python:3.11-slim
# a C++17 compiler and CMake build the native core; libibverbs1 is the Mooncake client's
RUN apt-get update && apt-get install -y --no-install-recommends g++ cmake libibverbs1 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/saria
COPY . .
RUN pip install --no-cache-dir '.[vllm,mooncake]'
ENTRYPOINT ["saria"]
CMD ["serve", "--config", "/etc/saria/serve.toml"]
