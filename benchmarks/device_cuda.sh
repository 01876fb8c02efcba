#!/usr/bin/env bash
# CUDA checks and kernel numbers on a lent NVIDIA machine (the `device` tool of this workplace),
# where nothing can be installed from the network and at most 64 MiB travel per call.
#
# The apache-tvm wheel does not fit one call, so it travels in two parts, prepared here:
#   .gpu1/libtvm_compiler.so.xz   xz -9 of site-packages/tvm/lib/libtvm_compiler.so
#   .gpu2/tvm_rest.tar.xz         the rest of site-packages/tvm (no cutlass headers, no caches)
#   .gpu2/*.whl                   cp312 wheels of apache-tvm-ffi==0.1.14.post1, xgboost-cpu, platformdirs
# (both folders listed in .git/info/exclude; `bash benchmarks/device_cuda.sh prepare` makes them here, on the
# CPU host, from the package index: a few minutes, most of it xz). Call 1: `bash benchmarks/device_cuda.sh stage`
# carrying .gpu1; call 2, on the still-warm machine: `bash benchmarks/device_cuda.sh run`
# carrying .gpu2 (env: PYTEST_ARGS, BENCH_S, KERNELS, TRIALS, EXPLOIT, SEEDS, BENCH_ARGS). The run installs into /tmp/site, checks the GPU, runs tests/measure/test_cuda.py
# (the GPU test included) and benchmarks/bench_kernels.py --target cuda; logs and JSON go to $OUT.
# MODEL=resnet18 (MODEL_ARGS="--resolution 56", MODEL_BUDGET=240): then `tune --model` on the GPU, with
# -vv logging to $OUT/model.log. GPU_MODEL=resnet18 (GPU_MODEL_ARGS, MODEL_BUDGET): benchmarks/gpu_model.py,
# torchvision's network exported, tuned and timed against PyTorch on the GPU ($OUT: gpu_model.json, and
# gpu_model.tgz with each tune's JSON, log and database; GPU_MODEL_ARGS="--hub ab": with and without the hub).
# $OUT takes 8 files at most: the kernels' table is printed (bench.log), not kept as a file. THROUGHPUT=1 (TP_ARGS): benchmarks/bench_cuda_throughput.py, candidates per
# minute of stormdrop's gateway and MetaSchedule's builder/runner ($OUT/results_cuda_throughput.json).
# BENCH_S=0 skips the kernels.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/stage /tmp/site
export PYTHONUNBUFFERED=1
step=${1:-run}

if [ "$step" = prepare ]; then  # here, not on the GPU machine
    set -e
    tmp=$(mktemp -d); mkdir -p .gpu1 .gpu2 .git/info
    for d in /.gpu1/ /.gpu2/; do grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude; done
    plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64"
    plat="$plat --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat -d "$tmp" \
        apache-tvm==0.27.0.post1 apache-tvm-ffi==0.1.14.post1 "xgboost-cpu==$(python3 -c 'import xgboost; print(xgboost.__version__)')" platformdirs
    (cd "$tmp" && python3 -m zipfile -e apache_tvm-*.whl x)
    rm -f .gpu2/*; cp "$tmp"/apache_tvm_ffi-*.whl "$tmp"/xgboost_cpu-*.whl "$tmp"/platformdirs-*.whl .gpu2/
    tar -C "$tmp/x" --exclude=tvm/3rdparty/cutlass --exclude=tvm/lib/libtvm_compiler.so --exclude=__pycache__ \
        -cJf .gpu2/tvm_rest.tar.xz tvm
    xz -9 -T0 -c "$tmp/x/tvm/lib/libtvm_compiler.so" > .gpu1/libtvm_compiler.so.xz
    rm -rf "$tmp"; ls -la .gpu1 .gpu2
    exit 0
fi

if [ "$step" = stage ]; then
    cp .gpu1/libtvm_compiler.so.xz /tmp/stage/ && ls -la /tmp/stage
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv
    python3 -c "from cuda.bindings import nvrtc; print('nvrtc', nvrtc.nvrtcVersion())"
    python3 -c "import nvidia, os; [print(p, sorted(os.listdir(p))) for p in nvidia.__path__]"
    ls -d /usr/local/cuda* 2>&1; command -v nvcc
    exit 0
fi

t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu2/*.whl || exit 1
python3 -c "import tarfile; tarfile.open('.gpu2/tvm_rest.tar.xz').extractall('/tmp/site')" || exit 1
if [ ! -f /tmp/site/tvm/lib/libtvm_compiler.so ]; then
    [ -f /tmp/stage/libtvm_compiler.so.xz ] || { echo "no staged libtvm_compiler.so.xz: run the stage call first"; exit 1; }
    xz -dc /tmp/stage/libtvm_compiler.so.xz > /tmp/site/tvm/lib/libtvm_compiler.so || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests
echo "installed in $(( $(date +%s) - t0 )) s"
python3 - <<'EOF' 2>&1 | tee "$OUT/gpu.txt" || exit 1
import tvm
dev = tvm.cuda(0)
print("tvm", tvm.__version__, "cuda runtime", tvm.runtime.enabled("cuda"), "GPU", dev.exist,
      dev.device_name, dev.compute_version, dev.multi_processor_count, "SMs")
from stormdrop.tvm_compat import nvrtc as _nvrtc
print("CUDA roots", _nvrtc._cuda_roots())
try:
    print("NVRTC headers", _nvrtc.cuda_headers())
except RuntimeError as err:
    print(err)
EOF
timeout -s INT 150 python3 -m pytest -q -p no:cacheprovider tests/measure/test_cuda.py -rs ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/test_cuda.log"
echo "tests done at $(( $(date +%s) - t0 )) s"
if [ -n "${THROUGHPUT:-}" ]; then
    timeout -s INT 300 python3 benchmarks/bench_cuda_throughput.py ${TP_ARGS:-} --json "$OUT/results_cuda_throughput.json" \
        2>&1 | tee "$OUT/throughput.log"
    echo "throughput done at $(( $(date +%s) - t0 )) s"
fi
[ "${BENCH_S:-330}" = 0 ] || timeout -s INT "${BENCH_S:-330}" python3 benchmarks/bench_kernels.py --target cuda \
    --kernels "${KERNELS:-mm1024,r50_c2_b8}" --trials "${TRIALS:-64}" --exploit-trials "${EXPLOIT:-32}" \
    --seeds "${SEEDS:-0}" ${BENCH_ARGS:---skip-3x --no-postopt} --json "$OUT/results_kernels_cuda.json" --out /tmp/RESULTS_cuda.md 2>&1 | tee "$OUT/bench.log"
echo "done at $(( $(date +%s) - t0 )) s"
if [ -n "${MODEL:-}" ]; then
    timeout -s INT $(( ${MODEL_BUDGET:-240} + 120 )) python3 -m stormdrop.cli.main -vv tune --model "$MODEL" ${MODEL_ARGS:---resolution 56} \
        --target cuda --time-budget "${MODEL_BUDGET:-240}" --db "$OUT/model.db" --json "$OUT/model.json" --no-progress \
        > "$OUT/model.log" 2>&1
    echo "model tune exit $? at $(( $(date +%s) - t0 )) s"; grep -v "^\[" "$OUT/model.log" | tail -30
fi
if [ -n "${GPU_MODEL:-}" ]; then
    rm -rf /tmp/gm
    timeout -s INT $(( ${MODEL_BUDGET:-240} + 240 )) python3 benchmarks/gpu_model.py --network "$GPU_MODEL" \
        --budget "${MODEL_BUDGET:-240}" ${GPU_MODEL_ARGS:-} --out /tmp/gm 2>&1 | grep -v "^\[torch.onnx\]"
    echo "GPU model exit ${PIPESTATUS[0]} at $(( $(date +%s) - t0 )) s"
    cp /tmp/gm/gpu_model.json "$OUT/" 2>/dev/null  # and the tunes' JSON, logs and databases in one file
    (cd /tmp/gm && tar -czf "$OUT/gpu_model.tgz" $(ls model*.json model*.log model*.db 2>/dev/null))
    for f in /tmp/gm/model*.log; do grep -v "^\[" "$f" | tail -25; done
fi
