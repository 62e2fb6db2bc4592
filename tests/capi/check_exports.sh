#!/usr/bin/env bash
# Checks libveloxquant.so's dynamic symbol table: the SONAME carries the ABI version, and every
# exported symbol is part of the C API (vq_*) or the public C++ API (namespace vq, but not the
# internal vq::detail / vq::engine / vq::eval, except the assert hook the public VQ_ASSERT
# macro calls). Usage: check_exports.sh LIB ABI_VERSION
set -euo pipefail
lib=$1
abi=$2
soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
if [ "$soname" != "libveloxquant.so.$abi" ]; then
  echo "SONAME is '$soname', expected libveloxquant.so.$abi" >&2
  exit 1
fi
# Defined, exported (global or weak) symbols, demangled.
syms=$(nm -D --defined-only -C "$lib" | awk '$2 ~ /^[TDBRVWu]$/ { $1 = ""; $2 = ""; sub(/^  /, ""); print }')
n_c=$(grep -c '^vq_' <<<"$syms" || true)
for f in vq_abi_version vq_config_parse vq_layer_begin_step vq_layer_view_head vq_layer_end_step \
         vq_model_cache_create vq_registry_field; do
  grep -qx "$f" <<<"$syms" || { echo "missing C API symbol $f" >&2; exit 1; }
done
for s in 'vq::LayerCache::begin_step' 'vq::CacheConfig::parse' 'vq::ModelCache::ModelCache' \
         'typeinfo for vq::Error'; do
  grep -qF "$s" <<<"$syms" || { echo "missing C++ API symbol $s" >&2; exit 1; }
done
# Anything that is neither C API nor public vq:: (templates of the standard library that the
# public API instantiates are allowed: their names start with std:: or are operator new/delete).
bad=$(grep -v -e '^vq_' -e '^vq::' -e '^typeinfo for vq::' -e '^typeinfo name for vq::' \
        -e '^vtable for vq::' -e '^std::' -e '^typeinfo for std::' -e '^typeinfo name for std::' \
        -e '^vtable for std::' -e '^void std::' -e '^bool std::' -e '^_init$' -e '^_fini$' \
        -e '^guard variable for ' -e '^__' -e '^_edata$' -e '^_end$' <<<"$syms" || true)
internal=$(grep -E '(^|for )vq::(detail|engine|eval)::' <<<"$syms" | grep -v 'vq::detail::assert_fail' || true)
if [ -n "$bad" ] || [ -n "$internal" ]; then
  echo "unexpected exported symbols:" >&2
  printf '%s\n%s\n' "$bad" "$internal" | sed '/^$/d' | head -40 >&2
  exit 1
fi
echo "libveloxquant.so: SONAME $soname, $n_c C API functions, $(wc -l <<<"$syms") exported symbols"
