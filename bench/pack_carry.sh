#!/usr/bin/env bash
# Packs binaries built here (cuda preset) for the GPU machine: stripped, with
# the one shared library it lacks (cpp-httplib), into build/carry.txz (xz
# shares the bytes two builds of one tree have in common: three binaries
# fit the 64 MiB a call carries).
#   bench/pack_carry.sh build/cuda/kvgraph build/cuda/kvgraph_gpu_tests /tmp/kvgraph_base ...
# A name may be given as PATH=NAME to rename it in the pack. On the GPU
# machine (carry build/carry.txz):
#   mkdir -p build/cuda && xz -dc build/carry.txz | tar -C build/cuda -xf - \
#     && export LD_LIBRARY_PATH=$PWD/build/cuda/lib
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: bench/pack_carry.sh BINARY[=NAME] ..." >&2; exit 2; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
for spec in "$@"; do
  path=${spec%%=*}
  name=$(basename "${spec#*=}")
  [ -f "$path" ] || { echo "pack_carry: no file $path" >&2; exit 1; }
  strip -o "$stage/$name" "$path"
done
httplib=$(find /lib/x86_64-linux-gnu -maxdepth 1 -name "libcpp-httplib.so.*" 2>/dev/null | head -1 || true)
[ -n "$httplib" ] && cp -L "$httplib" "$stage/lib/"
mkdir -p build
# One xz stream with a dictionary larger than a binary: the binaries share
# most of their bytes (the same kernels), and xz finds them only within its
# dictionary and block. That pays when the fatbins are stored uncompressed
# (configure the trees with -DCMAKE_CUDA_FLAGS=--no-compress: main, this
# branch and its tests took 14.8 MB for two binaries, 2026-12-07, against
# 24 MB with nvcc's compressed fatbins, which xz cannot share).
(cd "$stage" && tar cf - .) | xz -T1 --lzma2=preset=9,dict=384MiB > build/carry.txz.tmp
mv build/carry.txz.tmp build/carry.txz
size=$(stat -c %s build/carry.txz)
echo "build/carry.txz: $((size / 1048576)) MiB ($*)"
if [ "$size" -gt $((64 * 1048576)) ]; then
  echo "pack_carry: over the 64 MiB a device call carries" >&2
  exit 1
fi
