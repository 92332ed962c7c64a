#!/usr/bin/env bash
# Side by side (issue: evidence, point 4), in one run:
#   1. kvtier's host tier vs Redis (Debian's redis-server, Unix socket,
#      persistence off): the same 2 MiB blocks stored from a client buffer
#      and fetched back into one, at equal concurrency (1, 2 and 4), through
#      scripts/redisbench (RESP spoken directly; kvtier through the Go
#      client library, copying calls, and its zero-copy calls separately).
#      redis-benchmark's own SET/GET figures follow as a cross-check.
#   2. kvtier's host tier vs this machine's memcpy (kvtierctl bench).
#   3. kvtier's NVMe tier vs raw O_DIRECT I/O on the same filesystem
#      (tiers/nvme TestRawVsStore).
#
# Environment (defaults in brackets): DURATION [5s] per measured run,
# ROUNDS [3] interleaved rounds of step 1 (median shown), KEYS [256] live
# working set in blocks, CONC [1,2,4], HOST_CAP [2GiB], NVME_DIR [/var/tmp]
# (the filesystem step 3 measures), NVME_MIB [512] bytes per NVMe
# measurement, SKIP_NVME=1 skips step 3.
#
# Usage: scripts/bench-redis.sh   (as root if redis-server must be installed)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
DURATION=${DURATION:-5s} ROUNDS=${ROUNDS:-3} KEYS=${KEYS:-256} CONC=${CONC:-1,2,4}
HOST_CAP=${HOST_CAP:-2GiB} NVME_DIR=${NVME_DIR:-/var/tmp} NVME_MIB=${NVME_MIB:-512}

if ! command -v redis-server >/dev/null; then
	echo "--- installing redis-server (Debian)"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server redis-tools >/dev/null
fi

work=$(mktemp -d /tmp/kvbr.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT

echo "--- build"
go build -o "$work/kvtierd" ./cmd/kvtierd
go build -o "$work/kvtierctl" ./cmd/kvtierctl
go build -o "$work/redisbench" ./scripts/redisbench

echo "--- machine"
echo "nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); $(uname -r); $(go version | cut -d' ' -f3-)"
redis-server --version

rsock="$work/redis.sock"
redis-server --port 0 --unixsocket "$rsock" --unixsocketperm 700 --save '' --appendonly no \
	--dir "$work" --logfile "$work/redis.log" --protected-mode no &
pids+=($!)
"$work/kvtierd" -runtime-dir "$work/kv" -state-dir "$work/kv/state" -host-capacity "$HOST_CAP" \
	-no-nvme -metrics-listen "" 2>"$work/kvtierd.log" &
pids+=($!)
ksock="$work/kv/kvtierd.sock"
for _ in $(seq 100); do
	[ -S "$rsock" ] && [ -S "$ksock" ] && break
	sleep 0.1
done
[ -S "$rsock" ] || { echo "redis-server did not start"; cat "$work/redis.log"; exit 1; }
[ -S "$ksock" ] || { echo "kvtierd did not start"; cat "$work/kvtierd.log"; exit 1; }
redis-cli -s "$rsock" config get io-threads | tr '\n' ' '; echo

echo "--- 1. kvtier host tier vs Redis: 2 MiB store+fetch pairs, equal concurrency"
"$work/redisbench" -redis "$rsock" -kvtier "$ksock" -concurrency "$CONC" -duration "$DURATION" \
	-keys "$KEYS" -rounds "$ROUNDS"

echo
echo "--- 1b. redis-benchmark (cross-check of the Redis figure; 2 MiB values, one key)"
for c in ${CONC//,/ }; do
	echo "clients $c:"
	# --csv: "test","rps",...; GB/s counts the 2 MiB value once per request.
	redis-benchmark -s "$rsock" -d 2097152 -t set,get -n $((400 * c)) -c "$c" --csv |
		awk -F'"' 'NR > 1 { printf "  %s %8.0f req/s = %5.2f GB/s, p50 %s ms\n", $2, $4, $4 * 2097152 / 1e9, $8 }'
done
redis-cli -s "$rsock" flushall >/dev/null

echo
echo "--- 2. kvtier host tier vs memcpy (kvtierctl bench, putget, 2 MiB, 1 session)"
"$work/kvtierctl" bench --socket "$ksock" --duration "$DURATION"
"$work/kvtierctl" bench --socket "$ksock" --duration "$DURATION" --zero-copy
"$work/kvtierctl" bench --socket "$ksock" --duration "$DURATION" --sessions 4

if [ "${SKIP_NVME:-0}" != 1 ]; then
	echo
	echo "--- 3. kvtier NVMe tier vs raw O_DIRECT ($NVME_DIR, $NVME_MIB MiB per measurement)"
	go test ./tiers/nvme/ -run '^TestRawVsStore$' -count=1 -v -nvme.rawbench -nvme.benchdir="$NVME_DIR" \
		-nvme.rawbench.mib="$NVME_MIB" -nvme.rawbench.rounds=2 | grep -v '^=== '
fi
