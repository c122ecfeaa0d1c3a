# Sourced on a GPU host from the repository root, after scripts/gpu-bundle.sh
# packed .gpu/ here: unpacks the programs into build/bin, links the paths the
# build compiled in (this tree as /work/main, the fixtures as
# /work/shared), installs OpenBLAS where the build looks for it, and puts the
# packed libraries and the host's cuBLAS on LD_LIBRARY_PATH.
root=$PWD
tar -xJf .gpu/bin.tar.xz
mkdir -p /tmp/gpu-libs && tar -xJf .gpu/lib.tar.xz -C /tmp/gpu-libs
blas_path=$(cat /tmp/gpu-libs/blas/path)
mkdir -p "$(dirname "$blas_path")" && cp /tmp/gpu-libs/blas/"$(basename "$blas_path")" "$blas_path"
src=$(cat .gpu/source_dir)
if [[ -n "$src" && "$src" != "$root" ]]; then mkdir -p "$(dirname "$src")" && ln -sfn "$root" "$src"; fi
mkdir -p /work && ln -sfn "$root/.gpu/shared" /work/shared
export TANDEM_MODELS=$root/.gpu/shared/models
cublas_dir=$(dirname "$(find /usr/local/cuda*/ /opt /usr/lib -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=/tmp/gpu-libs/lib:$cublas_dir:${LD_LIBRARY_PATH:-}
echo "gpu-env: cuBLAS from $cublas_dir; sources linked at ${src:-$root}"
