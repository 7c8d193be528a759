#!/usr/bin/env bash
# Inputs of the drafter's GPU runs (H100 or H200), built on the CPU into git-ignored folders that the device calls
# carry: .h200a/ and .h200b/ (the first two thirds of the target's GGUF), .h200c/ (the last third, its checksum, the
# training and held-out prompts, the adaptation stream, gzipped) and .whl/ (the gguf package, missing on the image).
# Each folder with the repository stays under a device call's 64 MiB. Then four back-to-back device calls (a machine
# stays warm 30 s, and /tmp with it):
#   1. carry .h200a:        cp .h200a/gguf.part.aa /tmp/
#   2. carry .h200b:        cp .h200b/gguf.part.ab /tmp/
#   3. carry .h200c, .whl:  the training run (10 minutes at most: the h200-10min recipe's wall budget is 560 s)
#      cat /tmp/gguf.part.aa /tmp/gguf.part.ab .h200c/gguf.part.ac > /tmp/smollm2.gguf && sha256sum -c .h200c/gguf.sha256 &&
#      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl &&
#      gunzip -kf .h200c/*.gz && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 &&
#      python3 -m tabletune drafter train --recipe h200-10min --prompts .h200c/train_prompts.jsonl
#        --eval-prompts .h200c/eval_prompts.jsonl --gguf /tmp/smollm2.gguf --device cuda --out /tmp/drafter;
#      cp -r /tmp/drafter $OUT/
#   4. carry .h200c, .whl:  the adaptation run in the engine loop, with the new head
#      gunzip -kf .h200c/*.gz && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 &&
#      python3 benchmarks/drafter_online.py --stream .h200c/stream.json --gguf /tmp/smollm2.gguf --device cuda
#        --head /tmp/drafter/head --checkpoint .h200c/online.jsonl --out $OUT/drafter_online.md;
#      cp .h200c/online.jsonl $OUT/
#      (the frozen run takes about 4 minutes on an H100: if the call ends first, copy the returned online.jsonl into
#      .h200c/ here, and the next call reads the finished frozen run back and runs the adapting one)
# Back on the CPU, with call 2's drafter/ folder: the held-out table and the traces (calibration / scoring halves)
#   tabletune drafter eval --head drafter/head --trajectories drafter/eval_trajectories.json
#   python benchmarks/drafter_traces.py --head drafter/head --trajectories drafter/eval_trajectories.json --name eagle-h200
set -euo pipefail
py=${PYTHON:-python}
exclude=$(git rev-parse --git-path info/exclude)
for d in .h200a .h200b .h200c .whl; do grep -qx "/$d/" "$exclude" 2>/dev/null || echo "/$d/" >> "$exclude"; done
mkdir -p .h200a .h200b .h200c .whl
$py -m tabletune drafter prompts --out .h200c/train_prompts.jsonl
$py -m tabletune drafter eval-prompts --workload code --workload code-edit --workload chat --out .h200c/eval_prompts.jsonl
$py benchmarks/drafter_online.py --write-stream .h200c/stream.json
gzip -f .h200c/train_prompts.jsonl .h200c/eval_prompts.jsonl .h200c/stream.json
gguf=$($py -c "from tabletune.drafter.target import default_gguf; print(default_gguf())")
split -n 3 "$gguf" .h200c/gguf.part.
mv .h200c/gguf.part.aa .h200a/
mv .h200c/gguf.part.ab .h200b/
echo "$(sha256sum "$gguf" | cut -d' ' -f1)  /tmp/smollm2.gguf" > .h200c/gguf.sha256
$py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d .whl "gguf==$($py -c 'import importlib.metadata as m; print(m.version("gguf"))')"
du -sh .h200a .h200b .h200c .whl
