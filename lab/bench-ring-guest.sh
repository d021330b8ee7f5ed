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
# Every run with --cpu-util: each side's CPU per record (message) goes with its figure.
# Goals as the ring promises them: 64 KiB records at write-bw's rate with the default wait,
# 64 B records at 4x send-bw's message rate, ring-lat within 2 % of write-lat. The -u 0
# pair runs the same records with RC's retransmission timer off on both sides: on rxe
# (6.1) the ring's sender takes about one ACK-timeout retry per timeout period (67 ms at
# the default -u 14) whatever its batch, capacity, notify or wait, write-bw's a handful a
# run; the retries and duplicates of every run are in the table (docs/faq.md says more).
cases=(
  "64 KiB records vs write-bw 64 KiB (MB/s), wait adaptive (default)|ring-bw|-s 65536 -n 5000 --cpu-util|write-bw|-s 65536 -n 5000 --cpu-util|$mbps|1.0|higher"
  "64 KiB records vs write-bw 64 KiB (MB/s), wait spin|ring-bw|-s 65536 -n 5000 --wait spin --cpu-util|write-bw|-s 65536 -n 5000 --cpu-util|$mbps|0.9|higher"
  "64 KiB records vs write-bw 64 KiB (MB/s), wait sleep|ring-bw|-s 65536 -n 5000 --wait sleep --cpu-util|write-bw|-s 65536 -n 5000 --cpu-util|$mbps|0.9|higher"
  "64 KiB records vs write-bw 64 KiB (MB/s), both with rxe's ACK timer off (-u 0)|ring-bw|-s 65536 -n 5000 -u 0 --cpu-util|write-bw|-s 65536 -n 5000 -u 0 --cpu-util|$mbps|1.0|higher"
  "64 B records vs send-bw 64 B (Mpps), defaults (imm, adaptive)|ring-bw|-s 64 -n 200000 --cpu-util|send-bw|-s 64 -n 200000 --cpu-util|$mpps|4.0|higher"
  "ring-lat vs write-lat 64 B (p50 usec), defaults (poll, spin)|ring-lat|-s 64 -n 5000 --cpu-util|write-lat|-s 64 -n 5000 --cpu-util|$p50|1.02|lower"
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
