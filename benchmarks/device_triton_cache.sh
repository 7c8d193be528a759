#!/usr/bin/env bash
# Keep Triton's compile cache between device calls (each call starts a fresh machine, and compiling the
# engine's kernels and the GEMM chooser's candidates takes 50-150 s of the 130-230 s start-up).
#
#   source benchmarks/device_triton_cache.sh restore   # first thing in a device command
#   ... the benchmark ...
#   benchmarks/device_triton_cache.sh save             # last thing: $OUT/triton_cache_<stamp>.txz.part* come back
#
# Here, between calls: copy the returned triton_cache_*.txz.part* to .tcache/ (ignored by git) and name .tcache in
# the next call's carry. Archives are xz: the kernels' files share most of their bytes, so the whole cache packs to
# about a quarter of what gzip made of it (17 against 63 MB), which keeps the carry under its 64 MiB; restore also
# takes .tgz. The cache is keyed by Triton's version, the GPU and each kernel's source, so a stale entry is never
# used. A call returns at most 8 files of 16 MiB, so `save` packs only what this call compiled (the files
# newer than the restore) in 15 MiB parts, and `restore` unpacks every archive in .tcache, each on its own (a
# truncated archive still gives the files before the cut).
set -u
dir="$PWD/.cache/triton"
case "${1:-}" in
  restore)
    mkdir -p "$dir"
    for a in $(ls .tcache/ 2>/dev/null | sed -n 's/\(.*\.t[gx]z\)\.part.*/\1/p' | sort -u); do
      case "$a" in *.txz) unpack="xJ" ;; *) unpack="xz" ;; esac
      cat .tcache/"$a".part* | tar "$unpack" -C "$dir" 2>/dev/null
    done
    touch "$dir/.restored"
    export TRITON_CACHE_DIR="$dir"
    echo "triton cache: $(find "$dir" -type f | wc -l) files" ;;
  save)
    if [ -z "${OUT:-}" ]; then echo "save: \$OUT is not set" >&2; exit 1; fi
    (cd "$dir" && find . -type f -newer .restored ! -name .restored) > "$dir/.new"
    echo "triton cache: $(wc -l < "$dir/.new") new files"
    tar cJ -C "$dir" -T "$dir/.new" | split -b 15M - "$OUT/triton_cache_$(date +%m%d%H%M).txz.part" &&
      ls -l "$OUT"/triton_cache_*.txz.part* ;;
  *)
    echo "usage: source $0 restore | $0 save" >&2; return 2 2>/dev/null || exit 2 ;;
esac
