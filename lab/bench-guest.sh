#!/usr/bin/env bash
# Runs inside the lab guest (or on an RDMA host): every rdmabench test against its
# perftest twin, alternating which goes first each round, same device, GID, sizes and
# counts, both tools pinned alike. Prints one "BENCH {json}" line per run; lab/bench
# turns them into medians and ratios.
set -euo pipefail
rounds=${1:-5}
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"

# case name | rdmabench test | rdmabench args | JSON metric | scale | perftest tool | perftest args | perftest column
# perftest columns: latency t_typical = 5; bandwidth BW average[MB/sec] = 4, MsgRate[Mpps] = 5.
cases=(
  "write-lat 2B default|write-lat|-s 2 -n 5000|latency.p50_ns|0.001|ib_write_lat|-s 2 -n 5000|5"
  "write-lat 2B inline 0|write-lat|-s 2 -n 5000 -I 0|latency.p50_ns|0.001|ib_write_lat|-s 2 -n 5000 -I 0|5"
  "write-bw 64KiB|write-bw|-s 65536 -n 5000|bandwidth.avg_bytes_per_sec|9.5367431640625e-07|ib_write_bw|-s 65536 -n 5000|4"
  "write-bw 8B -l 16 (Mpps)|write-bw|-s 8 -n 20000 -l 16|bandwidth.msg_rate_mpps|1|ib_write_bw|-s 8 -n 20000 -l 16|5"
  "write-bw 8B adaptive chains vs plain, depth 128 (Mpps)|write-bw|-s 8 -n 20000 -t 128|bandwidth.msg_rate_mpps|1|ib_write_bw|-s 8 -n 20000 -t 128|5"
  "read-lat 2B (round trip)|read-lat|-s 2 -n 3000|latency.p50_ns|0.001|ib_read_lat|-s 2 -n 3000|5"
  "read-bw 64KiB|read-bw|-s 65536 -n 2000|bandwidth.avg_bytes_per_sec|9.5367431640625e-07|ib_read_bw|-s 65536 -n 2000|4"
  "send-lat 2B|send-lat|-s 2 -n 5000|latency.p50_ns|0.001|ib_send_lat|-s 2 -n 5000|5"
  "send-bw 64KiB|send-bw|-s 65536 -n 2000|bandwidth.avg_bytes_per_sec|9.5367431640625e-07|ib_send_bw|-s 65536 -n 2000|4"
  "atomic-lat FETCH_AND_ADD (round trip)|atomic-lat|-n 3000|latency.p50_ns|0.001|ib_atomic_lat|-n 3000|5"
  "atomic-bw FETCH_AND_ADD (Mpps)|atomic-bw|-n 5000|bandwidth.msg_rate_mpps|1|ib_atomic_bw|-n 5000|5"
)

# perftest prints one data row: bytes iterations then the figures.
perftest_row() { awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && NF >= 5 {row=$0} END {print row}' "$1"; }

run_perftest() { # name tool args column
  local name=$1 tool=$2 args=$3 col=$4
  mark_counters
  # shellcheck disable=SC2086
  taskset -c "$server_cpu" "$tool" -x 1 -p 18515 $args > "$tmp/ps.out" 2>&1 &
  local srv=$!
  sleep 0.3
  # shellcheck disable=SC2086
  timeout 120 taskset -c "$client_cpu" "$tool" -x 1 -p 18515 $args "$addr" > "$tmp/pc.out" 2>&1 || true
  wait "$srv" || true
  local row v fastest=""
  row=$(perftest_row "$tmp/pc.out")
  v=$(awk -v f="$col" '{print $f}' <<< "$row")
  # A latency row (t_typical in column 5) has t_min in column 3: the run's fastest sample.
  [ "$col" = 5 ] && grep -q t_typical "$tmp/pc.out" && fastest=",\"fastest\":$(awk '{print $3}' <<< "$row")"
  [ -n "$v" ] && echo "BENCH {\"case\":\"$name\",\"tool\":\"perftest\",\"value\":$v$fastest,$(retransmits_since)}" || echo "perftest $tool failed: $(tail -2 "$tmp/pc.out")"
}

for r in $(seq 1 "$rounds"); do
  for c in "${cases[@]}"; do
    IFS='|' read -r name test args metric scale tool targs col <<< "$c"
    # Odd rounds: perftest first; even rounds: rdmabench first.
    if [ $((r % 2)) -eq 1 ]; then
      run_perftest "$name" "$tool" "$targs" "$col"
      run_ours "$name" "$test" "$args" "$metric" "$scale"
    else
      run_ours "$name" "$test" "$args" "$metric" "$scale"
      run_perftest "$name" "$tool" "$targs" "$col"
    fi
  done
done
