#!/usr/bin/env bash
# Keep Triton's compile cache between device calls (each call starts a fresh machine, and compiling the
# engine's kernels and the GEMM chooser's candidates takes 50-150 s of the 130-230 s start-up).
#
#   source benchmarks/device_triton_cache.sh restore   # first thing in a device command
#   ... the benchmark ...
#   benchmarks/device_triton_cache.sh save             # last thing: $OUT/triton_cache.tgz.part* come back
#
# Here, between calls: copy the returned triton_cache.tgz.part* to .tcache/ (ignored by git) and name .tcache in the
# next call's carry. The cache is keyed by Triton's version, the GPU and each kernel's source, so a stale entry is
# never used. The engine's cache is ~20 MB compressed, over the 16 MiB a returned file may have: it comes back in
# 15 MiB parts.
set -u
dir="$PWD/.cache/triton"
case "${1:-}" in
  restore)
    mkdir -p "$dir"
    if ls .tcache/triton_cache.tgz.part* >/dev/null 2>&1; then cat .tcache/triton_cache.tgz.part* | tar xz -C "$dir"; fi
    export TRITON_CACHE_DIR="$dir"
    echo "triton cache: $(find "$dir" -type f | wc -l) files" ;;
  save)
    if [ -z "${OUT:-}" ]; then echo "save: \$OUT is not set" >&2; exit 1; fi
    tar cz -C "$dir" . | split -b 15M - "$OUT/triton_cache.tgz.part" && ls -l "$OUT"/triton_cache.tgz.part* ;;
  *)
    echo "usage: source $0 restore | $0 save" >&2; return 2 2>/dev/null || exit 2 ;;
esac
