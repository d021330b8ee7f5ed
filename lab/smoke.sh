#!/usr/bin/env bash
# The default workload: write latency and write bandwidth between two rdmabench
# processes on one RDMA device (rxe0 in the lab). Runs where verbs work: inside the lab
# guest (lab/demo) or directly on an RDMA host. Prints the client's tables.
set -euo pipefail
bin=${RDMABENCH_BIN:-target/release/rdmabench}
addr=${RDMABENCH_LAB_ADDR:-10.77.0.1}
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

"$bin" devices

pair() {
  local test=$1; shift
  "$bin" "$test" --timeout 10 > "$log/server.out" 2>&1 &
  local server=$!
  local rc=0
  "$bin" "$test" --timeout 10 "$@" "$addr" || rc=$?
  wait "$server" || { echo "server of $test failed:"; cat "$log/server.out"; rc=1; }
  return $rc
}

pair write-lat -s 2 -n 1000
pair write-lat -s 4096 -n 1000
pair write-bw -s 65536 -n 5000
pair write-bw -s 4096 -n 5000
