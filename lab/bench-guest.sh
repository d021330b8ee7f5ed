#!/usr/bin/env bash
# Runs inside the lab guest (or on an RDMA host): rdmabench against its perftest twin,
# alternating which goes first each round, same device, same GID, same sizes and counts.
# Prints one "BENCH {json}" line per run; lab/bench turns them into medians and ratios.
set -euo pipefail
rounds=${1:-5}
bin=${RDMABENCH_BIN:-target/release/rdmabench}
addr=${RDMABENCH_LAB_ADDR:-10.77.0.1}
tmp=$(mktemp -d)
# Both tools run pinned the same way (server on one CPU, client on the other): where the
# scheduler puts the two spinning processes otherwise swings latency by 40 % under TCG.
ncpu=$(nproc)
server_cpu=0
client_cpu=$(( ncpu > 1 ? 1 : 0 ))
trap 'rm -rf "$tmp"' EXIT

# perftest prints one data row: bytes iterations then the figures.
perftest_row() { awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= 5 {row=$0} END {print row}' "$1"; }

run_perftest() { # name tool field args...
  local name=$1 tool=$2 field=$3; shift 3
  taskset -c "$server_cpu" "$tool" -x 1 -p 18515 "$@" > "$tmp/ps.out" 2>&1 &
  local srv=$!
  sleep 0.3
  timeout 120 taskset -c "$client_cpu" "$tool" -x 1 -p 18515 "$@" "$addr" > "$tmp/pc.out" 2>&1
  wait "$srv"
  local v
  v=$(perftest_row "$tmp/pc.out" | awk -v f="$field" '{print $f}')
  echo "BENCH {\"case\":\"$name\",\"tool\":\"perftest\",\"value\":$v}"
}

run_ours() { # name jq-path scale args...
  local name=$1 path=$2 scale=$3; shift 3
  local test=${name%%:*}
  taskset -c "$server_cpu" "$bin" "$test" -p 18516 > "$tmp/os.out" 2>&1 &
  local srv=$!
  timeout 120 taskset -c "$client_cpu" "$bin" "$test" -p 18516 --connect-timeout 10 "$@" --json - "$addr" > "$tmp/oc.json" 2> "$tmp/oc.err"
  wait "$srv"
  local v
  v=$(python3 -c "import json,sys; d=json.load(open('$tmp/oc.json')); r=d['results'][0]; print($path * $scale)")
  echo "BENCH {\"case\":\"$name\",\"tool\":\"rdmabench\",\"value\":$v}"
}

for r in $(seq 1 "$rounds"); do
  for turn in 1 2; do
    # Odd rounds: perftest first; even rounds: rdmabench first.
    if [ $(( (r + turn) % 2 )) -eq 0 ]; then who=perftest; else who=ours; fi
    if [ $who = perftest ]; then
      # t_typical (the median) is column 5 of ib_write_lat; BW average[MB/sec] is column 4 of ib_write_bw.
      run_perftest "write-lat:2B default" ib_write_lat 5 -s 2 -n 5000
      run_perftest "write-lat:2B inline 0" ib_write_lat 5 -s 2 -n 5000 -I 0
      run_perftest "write-bw:64KiB" ib_write_bw 4 -s 65536 -n 5000
    else
      run_ours "write-lat:2B default" "r['latency']['p50_ns']" 0.001 -s 2 -n 5000
      run_ours "write-lat:2B inline 0" "r['latency']['p50_ns']" 0.001 -s 2 -n 5000 -I 0
      run_ours "write-bw:64KiB" "r['bandwidth']['avg_bytes_per_sec']" "1/1048576" -s 65536 -n 5000
    fi
  done
done
