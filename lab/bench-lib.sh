# Sourced by the lab benchmark scripts (inside the guest): where things are, CPU pinning,
# and one rdmabench run that prints a "BENCH {json}" line.
bin=${RDMABENCH_BIN:-target/release/rdmabench}
addr=${RDMABENCH_LAB_ADDR:-10.77.0.1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Both tools run pinned the same way (server on one CPU, client on the other): where the
# scheduler puts the two spinning processes otherwise swings latency by 40 % under TCG.
ncpu=$(nproc)
server_cpu=0
client_cpu=$(( ncpu > 1 ? 1 : 0 ))

# The driver's count of a hw counter over every RDMA device (rxe: one device in the loopback
# guest, both ends of every run), read before and after a run of either tool: what RC's
# retransmissions cost shows beside the figure, measured the same way for both.
hw_count() { # counter name
  local total=0 f
  for f in /sys/class/infiniband/*/ports/*/hw_counters/"$1"; do
    [ -r "$f" ] && total=$(( total + $(cat "$f") ))
  done
  echo "$total"
}
# Marks the counters before a run; retransmits_since prints the JSON fields of what moved.
mark_counters() { retries0=$(hw_count completer_retry_err); dups0=$(hw_count duplicate_request); }
retransmits_since() {
  echo "\"retries\":$(( $(hw_count completer_retry_err) - retries0 )),\"duplicates\":$(( $(hw_count duplicate_request) - dups0 ))"
}

run_ours() { # name test args metric scale [tool label] [more JSON fields of the BENCH line]
  local name=$1 test=$2 args=$3 metric=$4 scale=$5 label=${6:-rdmabench} more=${7:+,$7}
  mark_counters
  taskset -c "$server_cpu" "$bin" "$test" -p 18516 > "$tmp/os.out" 2>&1 &
  local srv=$!
  # shellcheck disable=SC2086
  timeout 120 taskset -c "$client_cpu" "$bin" "$test" -p 18516 --connect-timeout 10 $args --json - "$addr" \
    > "$tmp/oc.json" 2> "$tmp/oc.err" || true
  wait "$srv" || true
  local v
  # The value; for a latency, the run's fastest sample too (a two-speed guest moves the
  # median of a run with its minute, its fastest sample far less); with --cpu-util in the
  # args each side's CPU time per message (us).
  v=$(python3 -c "
import json
r = json.load(open('$tmp/oc.json'))['results'][0]
a, b = '$metric'.split('.')
cpu = lambda pct: pct / 100 * r['duration_ns'] / r['iterations'] / 1000
extra = ''.join(f',\"{k}\":{cpu(r[f])}' for k, f in (('cpu_us', 'cpu_util_pct'), ('peer_cpu_us', 'peer_cpu_util_pct')) if f in r)
if a == 'latency':
    extra += f',\"fastest\":{r[a][\"min_ns\"] * $scale}'
print(f'{r[a][b] * $scale}{extra}')" 2>/dev/null) || { echo "rdmabench $test failed: $(tail -2 "$tmp/oc.err")"; return; }
  echo "BENCH {\"case\":\"$name\",\"tool\":\"$label\",\"value\":$v,$(retransmits_since)$more}"
}

