# rdmabench container image: build with cargo, run on a slim Debian with the verbs userspace.
# lab/image builds the same image from Debian packages without docker (k8s-jobs/README.md).
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
# The shipped workloads are compiled in too (include_str!), as well as copied below.
COPY workloads workloads
RUN cargo build --release --locked --bin rdmabench

FROM debian:bookworm-slim
# image/packages is the one package list; lab/image builds the same image without docker.
COPY image/packages /tmp/packages
RUN apt-get update \
 && sed -e 's/#.*//' /tmp/packages | xargs apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/packages
COPY --from=build /src/target/release/rdmabench /usr/local/bin/rdmabench
# The man page and bash completions, generated from the same definitions as --help.
RUN mkdir -p /usr/share/man/man1 /usr/share/bash-completion/completions \
 && rdmabench docs man > /usr/share/man/man1/rdmabench.1 \
 && rdmabench completions bash > /usr/share/bash-completion/completions/rdmabench
# The Jobs of k8s-jobs/ run the workloads from here (RDMABENCH_WORKLOADS).
COPY workloads /usr/share/rdmabench/workloads
ENTRYPOINT ["rdmabench"]
CMD ["--help"]
