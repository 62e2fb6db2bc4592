#!/usr/bin/env bash
# Installs the build tree into a fresh prefix under it, then builds and runs a separate project
# against the installed package only: through find_package(VeloxQuant CONFIG) (a C and a C++
# program, shared and static) and through pkg-config (the C program, and examples/c/llama.c run
# over the shipped model against the installed CLI). When the Python module was built, runs
# examples/python/numpy_llama.py from the installed site-packages path.
# Usage: consumer_test.sh BUILD_DIR SOURCE_DIR [SANITIZERS]
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
sanitize=${3:-}
work=$build/install-consumer
prefix=$work/prefix
rm -rf "$work"
mkdir -p "$work"

cmake --install "$build" --prefix "$prefix" >"$work/install.log"

flags=""
if [ -n "$sanitize" ]; then
  flags="-fsanitize=$sanitize -fno-omit-frame-pointer"
fi
cmake -S "$src/tests/install/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="$flags" >"$work/configure.log"
cmake --build "$work/build" -j2 >"$work/build.log"
"$work/build/consumer_c"
"$work/build/consumer_cpp"
"$work/build/consumer_cpp_static"

# pkg-config: compile the C consumer by hand with the flags the .pc file gives.
pc_dir=$(dirname "$(find "$prefix" -name veloxquant.pc | head -1)")
export PKG_CONFIG_PATH=$pc_dir
cc_flags=$(pkg-config --cflags --libs veloxquant)
libdir=$(pkg-config --variable=libdir veloxquant)
# shellcheck disable=SC2086
cc -std=c99 $flags "$src/tests/install/consumer/consumer.c" $cc_flags -o "$work/consumer_pc"
LD_LIBRARY_PATH=$libdir "$work/consumer_pc"
# The Llama forward in C over the installed library, against the installed CLI's eval.
# shellcheck disable=SC2086
cc -std=c99 -O2 $flags "$src/examples/c/llama.c" $cc_flags -lm -o "$work/llama_c"
LD_LIBRARY_PATH=$libdir bash "$src/tests/capi/llama_c_test.sh" "$prefix/bin/veloxquant" \
  "$work/llama_c" "$src/data" 64 32 5e-4 full streaming_llm

site=$(find "$prefix" -type d -name veloxquant -path '*-packages/*' | head -1)
if [ -n "$site" ]; then
  # The installed module only (not the build tree's), running the NumPy Llama example.
  export PYTHONPATH
  PYTHONPATH=$(dirname "$site")
  # A sanitized build's module needs its runtimes preloaded into the uninstrumented interpreter
  # (as python/CMakeLists.txt does for the pytest suite); leak checking off for CPython.
  py=(/usr/bin/python3)
  if [ -n "$sanitize" ]; then
    preload=""
    case $sanitize in *address*) preload=$(c++ -print-file-name=libasan.so) ;; esac
    case $sanitize in *undefined*) preload="${preload:+$preload:}$(c++ -print-file-name=libubsan.so)" ;; esac
    py=(env LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 /usr/bin/python3)
  fi
  "${py[@]}" -c 'import veloxquant as v; print("python: veloxquant", v.__version__, "from", v.__file__)'
  "${py[@]}" "$src/examples/python/numpy_llama.py" --tokens 64 --method full --method streaming_llm
fi
echo "consumer: all checks passed"
