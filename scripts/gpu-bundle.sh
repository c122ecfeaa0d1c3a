#!/usr/bin/env bash
# Packs built programs, with the shared libraries they load that a bare GPU
# host lacks, and the model fixtures, into DIR (default .gpu/), so that a
# build made here runs on a GPU host that has the NVIDIA driver and CUDA 13
# (cuBLAS, cudart) but none of the build dependencies. scripts/gpu-env.sh,
# sourced there from the repository root, unpacks it and sets the paths.
#
#   scripts/gpu-bundle.sh [--dir DIR] [PROGRAM...]   # names under build/bin
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.gpu
if [[ "${1:-}" == "--dir" ]]; then dir=$2; shift 2; fi
programs=("$@")
if [[ ${#programs[@]} -eq 0 ]]; then
  programs=(tandem-prefill tandem-decode tandem-router tandem-generate tandem-engine-bench
            tandem-bench tandem-kvbench tandem-convert tandem-synth cuda_backend_test cuda_create_test
            staged_workers_cuda_test gpu_cluster_test)
fi
rm -rf "$dir" && mkdir -p "$dir/lib" "$dir/shared"
paths=()
for p in "${programs[@]}"; do
  [[ -x build/bin/$p ]] || { echo "gpu-bundle: build/bin/$p is not built" >&2; exit 1; }
  paths+=("build/bin/$p")
done
tar -cJf "$dir/bin.tar.xz" "${paths[@]}"
# The CPU backend loads OpenBLAS by its configured path at run time.
blas=$(sed -n 's/^OPENBLAS_LIBRARY:FILEPATH=//p' build/CMakeCache.txt)
# Everything the programs and OpenBLAS link, except what every Linux host
# has (C and C++ runtimes) and what the GPU host's CUDA provides.
skip='/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libcuda|libcublas|libcublasLt|libcudart)\.so|ld-linux'
{ for p in "${paths[@]}"; do ldd "$p"; done; ldd "$(readlink -f "$blas")"; } |
  awk '/=> \//{print $3}' | sort -u | grep -Ev "$skip" | while read -r lib; do
    cp -L "$lib" "$dir/lib/"
  done
# UCX opens its transport modules itself (ldd never lists them), from ucx/
# beside the libucs it was loaded from: without libuct_cma, same-host KV
# moves through shared-memory fragments instead of one process_vm_readv.
ucx_modules=$(dirname "$(ldd build/bin/tandem-prefill | awk '/libucs\.so/{print $3}')")/ucx
mkdir -p "$dir/lib/ucx"
for lib in "$ucx_modules"/libuct_cma.so*; do
  [[ $lib == *.a ]] || cp -L "$lib" "$dir/lib/ucx/"
done
cp -L /usr/local/cuda/lib64/libcudart.so.13 "$dir/lib/" 2>/dev/null ||
  cp -L /usr/local/cuda/lib/libcudart.so.13 "$dir/lib/"
mkdir -p "$dir/blas" && cp -L "$blas" "$dir/blas/$(basename "$blas")"
echo "$blas" >"$dir/blas/path"
pwd >"$dir/source_dir"
tar -cJf "$dir/lib.tar.xz" -C "$dir" lib blas && rm -rf "$dir/lib" "$dir/blas"
models=${TANDEM_MODELS:-../shared/models}
cp -r "$models" "$dir/shared/models"
du -sh "$dir"
