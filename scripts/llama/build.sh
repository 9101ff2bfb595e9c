#!/usr/bin/env bash
# Builds ik_llama.cpp or mainline llama.cpp with cupool's ggml shim (and the ballast) on a
# machine with CUDA, nvcc, CMake and ninja:
#
#     scripts/llama/build.sh SOURCE.tar.gz BUILD_DIR [extra cmake arguments]
#
# Unpacks the source into BUILD_DIR/src, copies the shim (ggml/ggml-cupool.{h,cu} and libcupool's
# header) into ggml/src/ggml-cuda/, applies the engine's patch (ggml/llama.cpp.patch for a
# mainline tree, which has tools/; ggml/ik_llama.cpp.patch otherwise), configures and builds
# TARGETS (mainline: llama-bench llama-server llama-cli; ik_llama.cpp: llama-sweep-bench llama-bench
# llama-cli) for CUDA_ARCH (default: 90). A second run with the same BUILD_DIR resumes the build.
# The engine finds libcupool at run time (CUPOOL_LIB, beside the executable, or the loader's
# path); nothing links against it.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
if [ $# -lt 2 ]; then
    sed -n '2,10p' "$0" >&2
    exit 2
fi
src=$1
dir=$2
shift 2
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
if [ ! -e "$dir/src/.cupool-patched" ]; then
    rm -rf "$dir/src"
    mkdir -p "$dir/src"
    tar xzf "$src" -C "$dir/src"
    cp "$root/ggml/ggml-cupool.h" "$root/ggml/ggml-cupool.cu" "$root/capi/include/cupool.h" \
        "$dir/src/ggml/src/ggml-cuda/"
    patch_file=$root/ggml/ik_llama.cpp.patch
    [ -d "$dir/src/tools" ] && patch_file=$root/ggml/llama.cpp.patch
    (cd "$dir/src" && patch -p1 -s --no-backup-if-mismatch <"$patch_file")
    touch "$dir/src/.cupool-patched"
fi
if [ -d "$dir/src/tools" ]; then
    # mainline: llama-server without its prebuilt web UI and without OpenSSL (offline builds)
    engine_args=(-DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF)
    targets=${TARGETS:-llama-bench llama-server llama-cli}
else
    # ik_llama.cpp's server needs web-UI assets its source tarball lacks
    engine_args=(-DLLAMA_BUILD_SERVER=OFF)
    targets=${TARGETS:-llama-sweep-bench llama-bench llama-cli}
fi
if [ ! -e "$dir/build/build.ninja" ]; then
    cmake -S "$dir/src" -B "$dir/build" -G Ninja -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" "${engine_args[@]}" \
        -DLLAMA_BUILD_TESTS=OFF -DGGML_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release "$@" >"$dir/configure.log"
fi
# shellcheck disable=SC2086
cmake --build "$dir/build" -j"$(nproc)" --target $targets
nvcc -O2 -o "$dir/build/bin/ballast" "$root/scripts/llama/ballast.cu"
echo "build.sh: $dir/build/bin: $(ls "$dir/build/bin" | tr '\n' ' ')"
