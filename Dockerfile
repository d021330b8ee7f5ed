# rdmabench container image: build with cargo, run on a slim Debian with the verbs userspace.
#   docker build -t REGISTRY/rdmabench:0.1.0 .
#   docker push REGISTRY/rdmabench:0.1.0
# then render Jobs with `rdmabench k8s render --image REGISTRY/rdmabench:0.1.0 ...`.

FROM rust:1-bookworm AS build
# sideway's rdma-mummy-sys runs cmake and bindgen (libclang).
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake libclang-dev pkg-config \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY benches benches
COPY tests tests
RUN cargo build --release --locked --bin rdmabench

FROM debian:bookworm-slim
# libibverbs1 and librdmacm1 are loaded at run time; ibverbs-providers holds the drivers
# (mlx5, rxe, ...); rdma-core gives ibv_devinfo/rdma for debugging a pod by hand.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libibverbs1 librdmacm1 ibverbs-providers rdma-core \
      ibverbs-utils iproute2 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/rdmabench /usr/local/bin/rdmabench
# The man page and bash completions, generated from the same definitions as --help.
RUN mkdir -p /usr/share/man/man1 /usr/share/bash-completion/completions \
 && rdmabench docs man > /usr/share/man/man1/rdmabench.1 \
 && rdmabench completions bash > /usr/share/bash-completion/completions/rdmabench
# The Jobs of k8s-jobs/ run the workloads from here (RDMABENCH_WORKLOADS).
COPY workloads /usr/share/rdmabench/workloads
ENTRYPOINT ["rdmabench"]
CMD ["--help"]
