#!/usr/bin/env bash
# Issue 20's checks on a lent GPU machine (16 cores, one CUDA GPU), as one prepared script.
#
# Here, first:   bash benchmarks/device_prepare.sh      (wheels for the device's Python, and the data)
# There:         bash benchmarks/device_check.sh gpu     (CUDA tests, layer and training on the GPU with
#                                                         their profiles, the layer at 1/2/16 CPU threads,
#                                                         an encrypted smoke: ~3 min)
#                bash benchmarks/device_check.sh graphs  (the gpu part's CUDA tests, training with and without
#                                                         CUDA graphs, the vector profile and the layer: ~2 min)
#                bash benchmarks/device_check.sh cpu16   (the layer's per-operator profile at 1/2/16 threads,
#                                                         graph scale at ogbn-arxiv's size: <= 8 min)
#                bash benchmarks/device_check.sh server16 (the round pool's start, files vs arguments, then the
#                                                         server's compute on a 16-worker round pool,
#                                                         1,500 of Cora's tasks, against its op bound: ~3 min)
#                bash benchmarks/device_check.sh round16 (the Cora encrypted round on 16 cores: <= 9 min)
#                bash benchmarks/device_check.sh encrypt16 (a client's 7,500 encryptions, Cora's largest
#                                                         client's, in process vs pools of 2-16 workers: ~1 min)
#                bash benchmarks/device_check.sh gpu profile16 round16   (several parts in one call, in order;
#                                                         ROUND_LIMIT=seconds caps the round's step, SMOKE=0 skips
#                                                         the gpu part's encrypted smoke, BUDGET=seconds
#                                                         caps the whole call: later steps get what is left,
#                                                         SERVER_TASKS=n sizes server16's sample,
#                                                         ROUND_BASELINE=an overhead JSON to compare with)
# (run through the device tool with carry [".whl", ".devdata"]; each part fits one call, and a session's
# 15 minutes of device time fit about two: call the next part at once while the machine is warm).
# Every step has its own time limit and failing steps do not stop the others; logs and results are
# re-packed into $OUT/<part>.tgz after each step, so what finished comes back even if the call is cut off.
# Measured with it on 2026-11-26 (H100 host, 16 cores): gpu 180 s; the old cpu16 part (Cora round, then
# graph scale 10k-169k) ran out of its step limits (round > 330 s, 169k > 200 s), hence the split.
set -u
OUT=${OUT:-/tmp/fedgat-device-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/device_check.log") 2>&1

# bytecode compiled at install, as a deployment's pip does: the round pool's 16 workers each import the
# package (2026-11-28: 6.5 s to start 16 workers, >= ~2 CPU-s each, against 0.22 s for one on the 2-core VM)
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "device_check: wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site FEDGAT_DATA="$PWD/.devdata/planetoid" MPLBACKEND=Agg PYTHONUNBUFFERED=1
export FLWR_TELEMETRY_ENABLED=0 RAY_USAGE_STATS_ENABLED=0 TQDM_DISABLE=1
machine="${DEVICE_MACHINE:-lent GPU machine ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) host)}"

pack() { tar -C "$stage" -czf "$OUT/$part.tgz" . 2>/dev/null; }
stage=/tmp/fedgat-device/none

step() {  # step NAME SECONDS COMMAND...: time-limited, logged, never fatal
    local name=$1 limit=$2
    shift 2
    if [ -n "${BUDGET:-}" ]; then  # the whole call's seconds: no step runs past them
        local left=$((BUDGET - SECONDS - 15))
        [ "$left" -lt 20 ] && { echo "=== $name: skipped, ${left}s of BUDGET left"; return; }
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    local t0=$SECONDS
    echo "=== $name (limit ${limit}s): $*"
    timeout -k 10 "$limit" "$@" >"$stage/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$stage/$name.log"
    echo "=== $name: rc=$rc in $((SECONDS - t0)) s"
    echo "$name rc=$rc s=$((SECONDS - t0))" >>"$stage/steps.txt"
    pack
}

echo "machine: $machine; $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv 2>/dev/null
python3 -c "import sys, torch, fedgat, tenseal; print(sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.cuda.is_available(), 'threads', torch.get_num_threads(), 'fedgat', fedgat.__file__)"
# what one server worker pays to import its code, cold, and whether bytecode may be written
echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset}"
python3 -X importtime -c "import fedgat.crypto.tasks" 2>&1 | sort -t'|' -k2 -n | tail -4

for part in "${@:-gpu}"; do
stage=/tmp/fedgat-device/$part
mkdir -p "$stage"
echo "##### part $part: $(date -u +%FT%TZ)"
case "$part" in
gpu)
    step cuda_tests 120 python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_device.py \
        tests/test_cuda_graphs.py
    step layer_cuda 120 python3 benchmarks/layer_speed.py --dataset cora --device cuda --repeats 30 \
        --machine "$machine" --out "$stage/layer_cuda"
    step train_cuda 150 python3 benchmarks/train_speed.py --dataset cora --device cuda --epochs 50 --rounds 10 \
        --variants vector,matrix --cuda-graphs --machine "$machine" --suffix cuda --out "$stage/train_cuda"
    step profile_vector 90 python3 benchmarks/gpu_profile.py --dataset cora --variant vector \
        --json "$stage/gpu_profile_vector.json"
    step profile_matrix 90 python3 benchmarks/gpu_profile.py --dataset cora --variant matrix \
        --json "$stage/gpu_profile_matrix.json"
    step layer_cpu 150 python3 benchmarks/layer_speed.py --dataset cora --threads 1,2,16 --repeats 9 \
        --machine "$machine" --out "$stage/layer_cpu"
    [ "${SMOKE:-1}" = 0 ] || step encrypted_smoke 90 python3 benchmarks/overhead.py --dataset synthetic --nodes 200 --clients 3 \
        --no-train --engine process --out "$stage/smoke"
    ;;
cpu16)
    step layer_profile_vector 90 python3 benchmarks/layer_profile.py --dataset cora --variant vector \
        --threads 1,2,16 --machine "$machine" --out "$stage/layer_profile"
    step layer_profile_matrix 90 python3 benchmarks/layer_profile.py --dataset cora --variant matrix \
        --threads 1,2,16 --machine "$machine" --out "$stage/layer_profile"
    # 10k-80k were measured on 2026-11-26 (benchmarks/results/graph_scale_16core.md)
    step graph_scale 270 python3 benchmarks/graph_scale.py --modes plain --rounds 1 \
        --nodes 80000 169343 --out "$stage/graph_scale" \
        --notes "Run on the lent GPU machine's 16 cores ($machine), plaintext mode only."
    ;;
graphs)
    step cuda_tests 120 python3 -m pytest -q -o addopts="" -p no:cacheprovider tests/test_device.py \
        tests/test_cuda_graphs.py
    step train_graphs 150 python3 benchmarks/train_speed.py --dataset cora --device cuda --epochs 50 --rounds 10 \
        --variants vector,matrix --cuda-graphs --machine "$machine" --suffix cuda --out "$stage/train_cuda"
    step profile_vector 90 python3 benchmarks/gpu_profile.py --dataset cora --variant vector \
        --json "$stage/gpu_profile_vector.json"
    step layer_cuda 120 python3 benchmarks/layer_speed.py --dataset cora --device cuda --repeats 30 \
        --machine "$machine" --out "$stage/layer_cuda"
    # a small encrypted round on 16 cores: wall, critical path and the server against its op bound
    step round_synthetic "${ROUND_LIMIT:-100}" python3 benchmarks/overhead.py --dataset synthetic --nodes 600 \
        --clients 5 --no-train --engine process --out "$stage/round_synthetic"
    ;;
profile16)
    step layer_profile_vector 60 python3 benchmarks/layer_profile.py --dataset cora --variant vector \
        --threads 1,16 --machine "$machine" --out "$stage/layer_profile"
    step layer_profile_matrix 60 python3 benchmarks/layer_profile.py --dataset cora --variant matrix \
        --threads 1,16 --machine "$machine" --out "$stage/layer_profile"
    ;;
server16)
    # the server's compute on a round pool of every core, against its op bound / 16 (no clients)
    # the round pool's start: recipients' setup as files (now) vs as initializer arguments (before)
    step pool_start 60 python3 benchmarks/pool_start.py --workers 16 --recipients 10 --repeats 2 \
        --name pool_start_16core --out "$stage/server16"
    step server_pool 240 python3 benchmarks/server_profile.py --tasks "${SERVER_TASKS:-1500}" --wires compact --workers 16 \
        --quiet --name server_pool_16core --out "$stage/server16"
    ;;
encrypt16)
    step client_encrypt 120 python3 benchmarks/client_encrypt.py --rows 834 --recipients 3 --workers 2 4 8 16 \
        --name client_encrypt_16core --out "$stage/encrypt16"
    ;;
round16)
    step overhead_cora "${ROUND_LIMIT:-500}" env -u TQDM_DISABLE python3 benchmarks/overhead.py --dataset cora --clients 10 --engine process \
        --no-train --progress --out "$stage/overhead16" \
        ${ROUND_BASELINE:+--baseline "$ROUND_BASELINE" --baseline-label "${ROUND_BASELINE_LABEL:-before}"}
    ;;
*)
    echo "device_check: unknown part '$part' (gpu, graphs, cpu16, profile16, server16, encrypt16 or round16)"
    continue
    ;;
esac
pack
cat "$stage/steps.txt"
done
