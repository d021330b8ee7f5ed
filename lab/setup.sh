#!/usr/bin/env bash
# Installs what building rdmabench and running the soft-RoCE lab need, only when missing.
# Sourced by lab/run, lab/demo, lab/test and lab/bench; safe to run on its own.
set -euo pipefail

lab_packages=(
  # building: sideway's rdma-mummy-sys runs cmake and bindgen (libclang)
  cmake libclang1-14 libclang-common-14-dev pkg-config
  # verbs userspace and the perftest twins used by the benchmark
  rdma-core ibverbs-providers ibverbs-utils perftest rdmacm-utils
  # the guest: Debian's kernel (ships rdma_rxe), QEMU, and the initramfs tools
  qemu-system-x86 linux-image-amd64 busybox-static iproute2 kmod cpio xz-utils util-linux
  # a lab test captures a run's packets on a veth cable
  tcpdump
  # lab/image builds the container image from Debian packages without a registry; the
  # lab runs its pods under crun with the RuntimeDefault seccomp profile of containers-common
  mmdebstrap umoci skopeo crun golang-github-containers-common
  # lab/test and lab/bench read cargo's and rdmabench's JSON with it; lab/test validates
  # the Kubernetes manifests with kubernetes-validate (PyPI) in a virtual environment
  python3 python3-venv
  # tests/history.rs starts a real PostgreSQL server for the history's shared store
  postgresql
)

# The Kubernetes version the manifests are validated against (k8s-openapi's feature too).
KUBE_VERSION=1.35.0
KUBERNETES_VALIDATE=1.37.0

# Validates manifests offline, strictly (unknown fields are errors): core kinds against
# the real Kubernetes schemas (kubernetes-validate), a Volcano Job and a JobSet against
# their CRDs' published schemas (k8s-jobs/schemas/), by lab/validate-manifests. Installs
# kubernetes-validate (and with it jsonschema and PyYAML) into target/kv once.
lab_kubernetes_validate() {
  local venv=target/kv
  if ! "$venv/bin/kubernetes-validate" --version 2>/dev/null | grep -qx "$KUBERNETES_VALIDATE"; then
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q "kubernetes-validate==$KUBERNETES_VALIDATE" >&2
  fi
  "$venv/bin/python" lab/validate-manifests "$KUBE_VERSION" "$@"
}

missing_packages() {
  local p
  for p in "${lab_packages[@]}"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || echo "$p"
  done
}

lab_install_packages() {
  local missing
  missing=$(missing_packages | tr '\n' ' ')
  [ -z "${missing// /}" ] && return 0
  echo "lab: installing missing packages: $missing" >&2
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $missing >&2
}

# The Rust toolchain is the one prerequisite apt cannot give (Debian 12's rustc is too old):
# says what is missing and how to get it, before a build fails in a less clear way.
# With "components", also rustfmt and clippy (lab/test runs them).
lab_check_rust() {
  local need have missing=""
  need=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
  if ! command -v cargo >/dev/null 2>&1 || ! command -v rustc >/dev/null 2>&1; then
    echo "lab: cargo and rustc $need or newer are needed and not on PATH. Install Rust with rustup" \
      "(rustup toolchain install stable --component clippy,rustfmt); Debian's rustc is too old. See the README: Before you start." >&2
    return 1
  fi
  have=$(rustc --version | awk '{print $2}')
  if ! printf '%s\n%s\n' "$need" "$have" | sort -V -C; then
    echo "lab: rustc $have is too old; rdmabench needs $need or newer (Cargo.toml rust-version). Run: rustup update stable" >&2
    return 1
  fi
  if [ "${1:-}" = components ]; then
    cargo fmt --version >/dev/null 2>&1 || missing="rustfmt"
    cargo clippy --version >/dev/null 2>&1 || missing="$missing clippy"
    if [ -n "$missing" ]; then
      echo "lab: the rustup component(s) $missing are missing; lab/test runs them. Run: rustup component add$(printf ' %s' $missing)" >&2
      return 1
    fi
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  lab_install_packages
fi
