#!/usr/bin/env bash
# All GPU work of one step in one go, on a CUDA machine: install, GPU tests, benchmarks.
# Results land in $OUT (or ./.out). Never touches the GPU's settings.
set -uo pipefail
OUT=${OUT:-$PWD/.out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
if [ -z "${KEVIN_INSTALLED:-}" ]; then  # several of these side by side: install once first, then set KEVIN_INSTALLED=1
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  fi
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -2
  nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
steps=${*:-gpu overhead e2e}
for step in $steps; do
  echo "== $step ($(date +%T))"
  case $step in
    gpu) python3 -m pytest -q -m gpu -s ${GPU_TESTS:-tests} 2>&1 | tee "$OUT/gpu_tests.log" | tail -40 ;;  # GPU_TESTS: some files only
    gpu-lanes)  # GPU test files in lanes side by side (GPU_LANES: lanes separated by ';', each a list of files run in turn
                # by one pytest; LANE_LIMIT: seconds for each lane), each lane's log and junit XML saved; for files that
                # judge correctness (a timing-sensitive file belongs in a lane of its own, or in a step alone)
      IFS=';' read -ra lanes <<< "${GPU_LANES:?GPU_LANES: lanes of test files separated by ;}"
      for i in "${!lanes[@]}"; do
        ( KEVIN_CACHE_DIR=$(mktemp -d) timeout "${LANE_LIMIT:-540}" python3 -m pytest -q -s -rA --durations=10 -p no:cacheprovider \
            --junitxml "$OUT/lane$i.xml" ${lanes[$i]} > "$OUT/lane$i.log" 2>&1
          echo "lane $i (${lanes[$i]}): exit $?" | tee -a "$OUT/lane$i.log" ) &
      done
      wait
      for i in "${!lanes[@]}"; do grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/lane$i.log" | tail -6; done ;;
    cpu) KEVIN_TESTS_FULL=1 python3 -m pytest -q -m "not gpu" -x tests 2>&1 | tee "$OUT/cpu_tests.log" | tail -5 ;;
    overhead) python3 benchmarks/bench_op_overhead.py --json "$OUT/overhead.json" ;;
    judge-gpu)  # the judge's pool, re-timing, eval over a folder, fast-build styles (host parts linked), and the GPU tests that assert kernels ran
      # JUDGE_GPU_TESTS: some of the files only (one device call has 10 minutes)
      tests=${JUDGE_GPU_TESTS:-tests/test_judge_pool_gpu.py tests/test_retime_gpu.py tests/test_judge_gpu.py tests/test_fast_build_styles.py tests/test_gpu_backend.py tests/test_generate_gpu.py tests/test_builtin_gpu.py}
      export KEVIN_CACHE_DIR=${KEVIN_CACHE_DIR:-$(mktemp -d)}
      timeout "${JUDGE_GPU_LIMIT:-570}" python3 -m pytest -q -s -rA --durations=0 --junitxml "$OUT/judge_gpu.xml" $tests 2>&1 | tee "$OUT/judge_gpu.log" | tail -60 ;;
    isolation)  # the candidate in its own process: the warm path's speed, then the GPU tests of its isolation
      python3 benchmarks/bench_isolation.py --tasks ${TASKS:-4} --workers 4 --json "$OUT/isolation_speed.json" 2>&1 \
        | tee "$OUT/isolation_speed.log" | tail -8
      timeout "${ISOLATION_LIMIT:-400}" python3 -m pytest -q -s -rA --junitxml "$OUT/isolation_gpu.xml" tests/test_judge_side_stream_gpu.py \
        tests/test_compare_fused_gpu.py tests/test_judge_pool_gpu.py tests/test_retime_gpu.py 2>&1 | tee "$OUT/isolation_gpu.log" | tail -20
      # a task of a twentieth of the GPU beside a process holding half: alone on the GPU (other tests' memory would make it RESOURCE)
      timeout 200 python3 -m pytest -q -s -rA tests/test_judge_real_gpu.py -k twentieth 2>&1 | tee "$OUT/isolation_tenth.log" | tail -8 ;;
    retime)  # the re-timing's decisions (RETIME_K: a -k expression, e.g. "faster" or "tied": each about 330 s alone)
      timeout "${RETIME_LIMIT:-570}" python3 -m pytest -q -s -rA tests/test_retime_gpu.py ${RETIME_K:+-k "$RETIME_K"} 2>&1 \
        | tee "$OUT/retime_gpu.log" | tail -20 ;;
    judge) python3 benchmarks/bench_judge.py --json "$OUT/judge_speed.json" 2>&1 | tee "$OUT/judge_speed.log" | tail -30 ;;
    e2e) python3 benchmarks/bench_e2e.py --json "$OUT/e2e.json" 2>&1 | tee "$OUT/e2e.log" | tail -30 ;;
    generate)  # the generator's loop with the replay policy: GPU test, then the command
      python3 -m pytest -q -s tests/test_generate_gpu.py 2>&1 | tee "$OUT/generate_test.log" | tail -15
      python3 -m kevin_backend.cli.main --cache-dir "$(mktemp -d)" generate examples/replay/gated_task.py --policy replay:examples/replay/replies.json \
        --trajectories 1 --turns 6 --trials 30 --json "$OUT/generate.json" 2>&1 | tee "$OUT/generate.log" ;;
    builtin) python3 benchmarks/bench_builtin.py --turns ${TURNS:-3} --json "$OUT/builtin.json" 2>&1 | tee "$OUT/builtin.log" | tail -70 ;;
    builtin-chains) python3 benchmarks/bench_builtin.py --categories chain1,chain2,chain3+ --json "$OUT/builtin_chains.json" 2>&1 | tee "$OUT/builtin_chains.log" | tail -40 ;;
    builtin-roofline)  # the roofline suite (ROOFLINE_CATEGORIES: some categories only; one device call has 10 minutes)
      timeout "${ROOFLINE_LIMIT:-560}" python3 benchmarks/bench_builtin.py --suite roofline ${ROOFLINE_CATEGORIES:+--categories $ROOFLINE_CATEGORIES} \
        --turns ${TURNS:-2} --at-once ${AT_ONCE:-8} --trials ${TRIALS:-20} --json "$OUT/builtin_roofline.json" 2>&1 | tee "$OUT/builtin_roofline.log" | tail -70 ;;
    builtin-roofline-quack)  # the roofline suite with QuACK timed beside the writer's kernels and Inductor (ROOFLINE_CATEGORIES as above;
      # QUACK_ONLY=1: QuACK alone, benchmarks/quack_peer.py, on the tasks it takes, and its refusals tried).
      # QuACK's wheels travel in .whl/, made on a machine with pip's index for the device's Python 3.12 on x86-64 (the device
      # already has torch, einops, cuda-bindings and protobuf):
      #   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      #     --platform manylinux_2_28_x86_64 -d .whl quack-kernels==0.6.5 nvidia-cutlass-dsl==4.8.1 \
      #     nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 \
      #     apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
      # (97 MiB together: nvidia-cutlass-dsl-libs-cu13 alone is 88 MiB, more than one device call carries; see shared/DEVICE.md).
      # Installed into the interpreter's own site-packages, not --target: nvidia-cutlass-dsl puts CuTe DSL on the path by a .pth file.
      if ! python3 -c "import quack, cutlass" 2>/dev/null && ls .whl/quack_kernels-*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --find-links .whl quack-kernels nvidia-cutlass-dsl \
          nvidia-cutlass-dsl-libs-base nvidia-cutlass-dsl-libs-core nvidia-cutlass-dsl-libs-cu13 apache-tvm-ffi torch-c-dlpack-ext 2>&1 | tail -3
      fi
      python3 -c "import quack; print('quack', quack.__version__)" || echo "QuACK is not importable: the bench runs without its column"
      if [ -n "${QUACK_ONLY:-}" ]; then
        timeout "${ROOFLINE_LIMIT:-560}" python3 benchmarks/quack_peer.py ${ROOFLINE_CATEGORIES:+--categories $ROOFLINE_CATEGORIES} --check-refusals \
          --trials ${TRIALS:-20} --json "$OUT/quack_roofline.json" 2>&1 | tee "$OUT/quack_roofline.log" | tail -40
      else
        timeout "${ROOFLINE_LIMIT:-560}" python3 benchmarks/bench_builtin.py --suite roofline --peers quack ${ROOFLINE_CATEGORIES:+--categories $ROOFLINE_CATEGORIES} \
          --turns ${TURNS:-2} --at-once ${AT_ONCE:-8} --trials ${TRIALS:-20} --peer-limit ${PEER_LIMIT:-240} \
          --json "$OUT/builtin_roofline_quack.json" 2>&1 | tee "$OUT/builtin_roofline_quack.log" | tail -80
      fi ;;
    sweep)  # every variant of some roofline-suite tasks, side by side (SWEEP_TASKS: comma-separated; SWEEP_VARIANTS: some numbers)
      timeout "${SWEEP_LIMIT:-540}" python3 benchmarks/sweep_variants.py --tasks "${SWEEP_TASKS:?SWEEP_TASKS: roofline-suite task names}" \
        ${SWEEP_VARIANTS:+--variants $SWEEP_VARIANTS} --json "$OUT/sweep.json" 2>&1 | grep -v -i warn | tee "$OUT/sweep.log" | tail -120 ;;
    builtin-rows) python3 benchmarks/bench_builtin.py --categories reduction,norm --at-once 22 --turns ${TURNS:-3} --json "$OUT/builtin_rows.json" 2>&1 | tee "$OUT/builtin_rows.log" | tail -40 ;;
    seed)  # the seed cache: the bench models prewarmed with the built-in writer, killed once mid-run and resumed
      export KEVIN_CACHE_DIR=${SEED_CACHE:-$(mktemp -d)}
      export TORCHINDUCTOR_CACHE_DIR=$KEVIN_CACHE_DIR/inductor
      args="prewarm --no-seed --policy builtin --bench-model ${SEED_MODELS:-all} --kernelbench examples/kernelbench --trajectories 1 --turns ${SEED_TURNS:-3} --per-gpu ${SEED_PER_GPU:-8}"
      setsid python3 -m kevin_backend.cli.main $args --json "$OUT/prewarm_killed.json" > "$OUT/prewarm.log" 2>&1 &
      pid=$!
      for _ in $(seq 1200); do
        [ "$(ls "$KEVIN_CACHE_DIR/entries" 2>/dev/null | wc -l)" -ge "${KILL_AFTER:-25}" ] && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.5
      done
      kill -9 -- -$pid 2>/dev/null; wait $pid 2>/dev/null
      echo "== killed (SIGKILL to the whole process group) with $(ls "$KEVIN_CACHE_DIR/entries" | wc -l) entries stored" | tee -a "$OUT/prewarm.log"
      ls "$KEVIN_CACHE_DIR/entries" > "$OUT/entries_at_kill.txt"
      python3 -m kevin_backend.cli.main $args --json "$OUT/prewarm.json" 2>&1 | tee -a "$OUT/prewarm.log" | tail -20
      python3 -m kevin_backend.cli.main cache ls 2>&1 | tee "$OUT/seed_ls.txt" | tail -40
      tar -czf "$OUT/seed.tgz" -C "$KEVIN_CACHE_DIR" entries ;;
    rl)  # the trainer's short run with the real judge (issue: RL trainer)
      timeout "${RL_LIMIT:-540}" python3 benchmarks/rl_h200.py --out /tmp/rl_h200 2>&1 | tee "$OUT/rl.log" | tail -40
      cp /tmp/rl_h200/rl_h200.json /tmp/rl_h200/metrics.png "$OUT/" 2>/dev/null  # not the checkpoints: too big to bring back
      cp /tmp/rl_h200/run/metrics.jsonl "$OUT/rl_metrics.jsonl" 2>/dev/null ;;
    ray2)  # prewarm through a local Ray cluster with one GPU actor per GPU (needs ray: carry .ray, see below)
      if ! python3 -c "import ray" 2>/dev/null && [ -f .ray/ray-slim.tar.xz ]; then
        mkdir -p /tmp/site && tar -xJf .ray/ray-slim.tar.xz -C /tmp/site
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .ray/*.whl
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
      fi
      python3 -c "import ray; ray.init(num_gpus=0, include_dashboard=False); print('ray', ray.__version__, 'ok'); ray.shutdown()" || exit 1
      export KEVIN_CACHE_DIR=$(mktemp -d)
      python3 -m ray.scripts.scripts start --head --num-gpus "$(nvidia-smi -L | wc -l)" --include-dashboard=false --disable-usage-stats >/dev/null
      python3 -m kevin_backend.cli.main prewarm --no-seed --policy builtin --tasks "${RAY_TASKS:-examples/kernelbench}" --ray auto \
        --trajectories 1 --turns 2 --json "$OUT/ray_prewarm.json" 2>&1 | tee "$OUT/ray_prewarm.log" | tail -20
      python3 -m ray.scripts.scripts stop --force >/dev/null ;;
    prewarm-budget)  # profile-guided prewarm of a bench model's steps with the built-in writer (BUDGET, BUDGET_MODEL;
                     # BUDGET_DTYPE, BUDGET_SIZE: the model's; PER_GPU: searches side by side); then, with the same
                     # KEVIN_CACHE_DIR, `bench` with BENCH_MODELS, BENCH_DTYPES and BENCH_SIZES alike times what it kept
      export KEVIN_CACHE_DIR=${KEVIN_CACHE_DIR:-$(mktemp -d)}
      python3 -m kevin_backend.cli.main prewarm --no-seed --policy builtin --bench-model "${BUDGET_MODEL:-gpt2}" \
        ${BUDGET_DTYPE:+--bench-dtype $BUDGET_DTYPE} ${BUDGET_SIZE:+--bench-size $BUDGET_SIZE} ${PER_GPU:+--per-gpu $PER_GPU} \
        --budget "${BUDGET:-6m}" --trajectories 1 --turns 2 --json "$OUT/prewarm_budget.json" 2>&1 | tee "$OUT/prewarm_budget.log" | tail -60 ;;
    roofline-backend)  # the roofline suite's tasks as models, compiled by the backend in generate mode (ROOFLINE_TASKS: some;
                       # AT_ONCE tasks side by side, each in its own process: about 45 s a task alone)
      timeout "${ROOFLINE_LIMIT:-560}" python3 benchmarks/bench_roofline_backend.py ${ROOFLINE_FROM:+--from $ROOFLINE_FROM} ${ROOFLINE_RESUME:+--resume $ROOFLINE_RESUME} \
        ${ROOFLINE_TASKS:+--tasks $ROOFLINE_TASKS} --turns ${TURNS:-2} --at-once ${AT_ONCE:-4} --json "$OUT/roofline_backend.json" 2>&1 | tee "$OUT/roofline_backend.log" | tail -40 ;;
    revalidate)  # kernels made under another torch, as a user on a newer torch sees them: roofline tasks (REVALIDATE_TASKS) prewarmed here
                 # as a KernelBench folder, their entries copied with keys naming torch 2.13.0 (tools/restamp_cache.py), revalidated,
                 # then run by kevin bench against that cache alone (about 2 minutes an entry to revalidate; both caches saved to $OUT)
      d=$(mktemp -d); mkdir -p "$d/tasks"
      python3 -c "import sys; from kevin_backend.generate.builtin.roofline_suite import ROOFLINE_SUITE as S
[open(sys.argv[1] + '/' + t.name.replace('-', '_') + '.py', 'w').write(t.source) for t in S if t.name in sys.argv[2].split(',')]" \
        "$d/tasks" "${REVALIDATE_TASKS:-softmax-last-bf16-32768x4096,max-dim0-f32-64x2048x1024}"
      k="python3 -m kevin_backend.cli.main"
      $k prewarm --cache-dir "$d/made" --no-seed --policy builtin --kernelbench "$d/tasks" --trajectories 1 --turns 2 --per-gpu 2 \
        --json "$OUT/revalidate_prewarm.json" 2>&1 | tee "$OUT/revalidate.log" | tail -4
      python3 tools/restamp_cache.py "$d/other" 2.13.0 --from "$d/made" 2>&1 | tee -a "$OUT/revalidate.log"
      $k cache --cache-dir "$d/other" --no-seed revalidate --dry-run 2>&1 | tee -a "$OUT/revalidate.log"
      $k cache --cache-dir "$d/other" --no-seed revalidate --json "$OUT/revalidate.json" 2>&1 | tee -a "$OUT/revalidate.log" | tail -8
      tar -czf "$OUT/revalidate_caches.tgz" -C "$d" made other
      $k bench --cache-dir "$d/other" --no-seed --kernelbench "$d/tasks" --json "$OUT/revalidate_bench.json" 2>&1 | tee -a "$OUT/revalidate.log" | tail -16 ;;
    gemm)  # the built-in writer's CUTLASS GEMMs on the GEMM suite through the judge (needs nvidia-cutlass's wheel in .whl:
           #   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
           #     --platform manylinux_2_28_x86_64 -d .whl nvidia-cutlass==4.2.0.0   (6 MiB))
      timeout "${GEMM_LIMIT:-560}" python3 benchmarks/bench_gemm.py ${GEMM_TASKS:+--tasks $GEMM_TASKS} --json "$OUT/gemm.json" 2>&1 \
        | tee "$OUT/gemm.log" | tail -40 ;;
    gemm-matmuls)  # the suite's matmul tasks (every one but the convolutions; those the writer declines listed with the reason),
                   # each task's first two tilings as a two-turn search tries them, no peers (GEMM_PEERS: some): the goal's
                   # geomean; GEMM_PART=I/N: every N-th task from the I-th (about 300 s for half of them on an H200)
      part=${GEMM_PART:-1/1}
      timeout "${GEMM_LIMIT:-560}" python3 benchmarks/bench_gemm.py --matmuls --part "$part" --first 2 --peers "${GEMM_PEERS:-}" \
        --builds /tmp/kevin-gemm-builds --json "$OUT/gemm_matmuls_${part/\//of}.json" 2>&1 | tee "$OUT/gemm_matmuls_${part/\//of}.log" | tail -40 ;;
    cudnn-peer)  # cuDNN's fused graphs (a convolution and its pointwise epilogue) beside Inductor on the GEMM suite's
                 # convolutions (needs cuDNN's frontend and its driver bindings in .whl, 18 MiB:
                 #   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
                 #     --platform manylinux_2_28_x86_64 -d .whl nvidia-cudnn-frontend==1.32.0 cuda-bindings==13.4.4 cuda-pathfinder==1.9.1)
      timeout "${CUDNN_LIMIT:-560}" python3 benchmarks/cudnn_peer.py ${CUDNN_TASKS:+--tasks $CUDNN_TASKS} --json "$OUT/cudnn_peer.json" 2>&1 \
        | tee "$OUT/cudnn_peer.log" | tail -30 ;;
    dynamic) python3 benchmarks/bench_dynamic.py --json "$OUT/dynamic.json" 2>&1 | tee "$OUT/dynamic.log" | tail -30 ;;  # 3 sizes, dynamic=True
    build) python3 benchmarks/bench_build.py --json "$OUT/build.json" 2>&1 | tee "$OUT/build.log" | tail -12 ;;
    compile) python3 benchmarks/bench_e2e.py --compile-only --json "$OUT/compile.json" 2>&1 | tee "$OUT/compile.log" | tail -20 ;;
    cold-variant)  # a new CUTLASS variant judged cold, alone on the host: the first of a fresh cache (its precompiled header
                   # made beside it), a next one, a change of tiling built ahead, nvcc's phases (COLD_TASK: a GEMM suite task)
      lscpu | grep -E "^CPU\(s\)|^Thread|^Core|^Socket|^Model name" | tee "$OUT/cold_variant.log"
      python3 benchmarks/bench_cold_variant.py ${COLD_TASK:+--task $COLD_TASK} --json "$OUT/cold_variant.json" 2>&1 | tee -a "$OUT/cold_variant.log" | tail -12 ;;
    bench)  # kevin bench: eager / Inductor / kevin (mode cache, this machine's kernel cache and the seed cache);
            # the KernelBench folder, then each model on its own (BENCH_MODELS), each report saved as it finishes
      if [ -z "${BENCH_MODELS:-}" ]; then
        python3 -m kevin_backend.cli.main bench --kernelbench examples/kernelbench --json "$OUT/bench_kernelbench.json" 2>&1 | tee "$OUT/bench_kernelbench.log" | tail -30
      fi
      for m in ${BENCH_MODELS:-mlp cnn gpt2 llama}; do  # BENCH_SIZES, BENCH_DTYPES: some of full,small and float32,bfloat16
        python3 -m kevin_backend.cli.main bench --models "$m" --size "${BENCH_SIZES:-full,small}" --dtype "${BENCH_DTYPES:-float32,bfloat16}" \
          --json "$OUT/bench_$m.json" 2>&1 | tee "$OUT/bench_$m.log" | tail -16
      done
      python3 -m kevin_backend.cli.main bench --merge "$OUT"/bench_*.json --json "$OUT/bench.json" --chart "$OUT/bench.png" --markdown "$OUT/bench.md" ;;
    bench-gpus)  # kevin bench over several GPUs of one host: one queue of model:size:dtype jobs per GPU, run side by side
                 # (BENCH_QUEUES: queues separated by ';'; BENCH_LIMIT: seconds for each queue); each job's report saved as it ends
      queues=${BENCH_QUEUES:-"cnn:full:float32 mlp:small:float32 mlp:small:bfloat16 llama:small:bfloat16;gpt2:full:float32 mlp:full:float32 cnn:small:float32 gpt2:small:bfloat16;llama:full:float32 cnn:full:bfloat16 mlp:full:bfloat16 cnn:small:bfloat16;gpt2:full:bfloat16 llama:full:bfloat16 gpt2:small:float32 llama:small:float32"}
      IFS=';' read -ra lanes <<< "$queues"
      for i in "${!lanes[@]}"; do
        ( end=$((SECONDS + ${BENCH_LIMIT:-540}))
          for job in ${lanes[$i]}; do
            IFS=: read -r m s d <<< "$job"; left=$((end - SECONDS)); [ $left -gt 20 ] || break
            echo "gpu $i: $job ($left s left)"
            CUDA_VISIBLE_DEVICES=$i timeout $left python3 -m kevin_backend.cli.main bench --models "$m" --size "$s" --dtype "$d" \
              --repeats "${BENCH_REPEATS:-9}" --trials "${BENCH_TRIALS:-20}" --json "$OUT/bench_${m}_${s}_$d.json" > "$OUT/bench_${m}_${s}_$d.log" 2>&1
          done ) &
      done
      wait
      python3 -m kevin_backend.cli.main bench --merge "$OUT"/bench_*.json --json "$OUT/bench.json" --chart "$OUT/bench.png" --markdown "$OUT/bench.md" ;;
    pack)  # everything written so far under $OUT in one archive (a device run brings back only a few files)
      tar -czf /tmp/results.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/results.tgz "$OUT/results.tgz" ;;
    profile)  # where a warm first compile spends its time, per compiler (mlp)
      d=$(mktemp -d)
      for c in inductor kevin; do
        TORCHINDUCTOR_CACHE_DIR=$d/$c python3 benchmarks/bench_e2e.py --worker mlp $c --kevin-cache $d/kevin-cache
        TORCHINDUCTOR_CACHE_DIR=$d/$c python3 benchmarks/bench_e2e.py --worker mlp $c --kevin-cache $d/kevin-cache --profile-dir "$OUT"
      done ;;
  esac
done
echo "== done ($(date +%T))"
