#!/usr/bin/env bash
# GPU check: builds the cuda test binaries and, on a host with a GPU, runs the
# GPU tier end to end through real CUDA IPC (a daemon process and client
# processes exchanging blocks through the asynchronous device API, batches
# pipelined on one stream and committed at their events, every byte verified:
# itest TestGPUTier) and measures the copy paths against plain baselines
# (scripts/gpucheck). Bounded to 5 minutes. Without a GPU it only builds and
# says so.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
out=${OUT:-$(mktemp -d)}
mkdir -p "$out/bin"
echo "== building with -tags cuda"
go vet -tags cuda ./cudaipc/ ./scripts/gpucheck/
go test -tags cuda -c -o "$out/bin/itest.test" ./itest/
go test -tags cuda -c -o "$out/bin/cudaipc.test" ./cudaipc/
go build -tags cuda -o "$out/bin/gpucheck" ./scripts/gpucheck/
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
	echo "no GPU here (nvidia-smi absent or failing): cuda build checked, nothing run"
	exit 0
fi
nvidia-smi -L
echo "== cudaipc conformance on the real device"
timeout 90 "$out/bin/cudaipc.test" -test.count=1
echo "== daemon + client processes through CUDA IPC (every byte verified)"
(cd itest && KVTIER_ITEST_REAL_GPU=1 timeout 120 "$out/bin/itest.test" -test.run '^TestGPUTier$' -test.v -test.count=1)
echo "== bandwidth vs baselines (target: ratios >= 0.90)"
timeout 60 "$out/bin/gpucheck"
