#!/usr/bin/env bash
# The default workload (workloads/smoke.toml): validate the device, then write latency and
# bandwidth between two rdmabench processes on one RDMA device (rxe0 in the lab), with a
# verdict per threshold. Runs where verbs work: inside the lab guest (lab/demo) or directly
# on an RDMA host. WORKLOAD=workloads/acceptance.toml lab/demo runs another suite.
set -euo pipefail
bin=${RDMABENCH_BIN:-target/release/rdmabench}
addr=${RDMABENCH_LAB_ADDR:-10.77.0.1}
workload=${WORKLOAD:-workloads/smoke.toml}
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

"$bin" devices
"$bin" run --serve --connect-timeout 30 > "$log/server.out" 2>&1 &
server=$!
rc=0
"$bin" run "$workload" --peer "$addr" --connect-timeout 30 || rc=$?
wait "$server" || { echo "the serving side failed:"; tail -20 "$log/server.out"; rc=1; }
exit $rc
