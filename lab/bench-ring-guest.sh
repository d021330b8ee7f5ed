#!/usr/bin/env bash
# Runs inside the lab guest (or on an RDMA host): the zero-copy ring (ring-bw, ring-lat)
# against rdmabench's own verbs tests at the same record/message sizes, alternating which
# goes first each round, both pinned alike. Prints one "BENCH {json}" line per run;
# lab/bench-ring turns them into medians and ratios (ring / reference).
set -euo pipefail
rounds=${1:-5}
. "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"

mpps="bandwidth.msg_rate_mpps|1"
mbps="bandwidth.avg_bytes_per_sec|9.5367431640625e-07"
p50="latency.p50_ns|0.001"
# case name | ring test | ring args | reference test | reference args | metric | scale | goal | better
cases=(
  "64 B records vs send-bw 64 B (Mpps), imm (default)|ring-bw|-s 64 -n 200000|send-bw|-s 64 -n 200000|$mpps|2.0|higher"
  "64 B records vs send-bw 64 B (Mpps), poll|ring-bw|-s 64 -n 200000 --notify poll|send-bw|-s 64 -n 200000|$mpps|2.0|higher"
  "64 KiB records vs write-bw 64 KiB (MB/s), imm (default)|ring-bw|-s 65536 -n 5000|write-bw|-s 65536 -n 5000|$mbps|0.9|higher"
  "64 KiB records vs write-bw 64 KiB (MB/s), poll|ring-bw|-s 65536 -n 5000 --notify poll|write-bw|-s 65536 -n 5000|$mbps|0.9|higher"
  "ring-lat vs write-lat 64 B (p50 usec), poll (default)|ring-lat|-s 64 -n 5000|write-lat|-s 64 -n 5000|$p50|1.1|lower"
  "ring-lat vs write-lat 64 B (p50 usec), imm|ring-lat|-s 64 -n 5000 --notify imm|write-lat|-s 64 -n 5000|$p50|1.1|lower"
  # The framing's share: a record carries 8 B more than its payload (its frame word).
  # Compared at equal bytes on the wire, what is left is the ring's own cost.
  "same bytes on the wire: ring-lat 56 B vs write-lat 64 B (p50 usec)|ring-lat|-s 56 -n 5000|write-lat|-s 64 -n 5000|$p50|1.1|lower"
  "same bytes on the wire: ring-lat 64 B vs write-lat 72 B (p50 usec)|ring-lat|-s 64 -n 5000|write-lat|-s 72 -n 5000|$p50|1.1|lower"
)

for r in $(seq 1 "$rounds"); do
  for c in "${cases[@]}"; do
    IFS='|' read -r name test args ref rargs metric scale goal better <<< "$c"
    more="\"goal\":$goal,\"better\":\"$better\""
    # Odd rounds: the reference first; even rounds: the ring first.
    if [ $((r % 2)) -eq 1 ]; then
      run_ours "$name" "$ref" "$rargs" "$metric" "$scale" reference "$more"
      run_ours "$name" "$test" "$args" "$metric" "$scale" ring "$more"
    else
      run_ours "$name" "$test" "$args" "$metric" "$scale" ring "$more"
      run_ours "$name" "$ref" "$rargs" "$metric" "$scale" reference "$more"
    fi
  done
done
