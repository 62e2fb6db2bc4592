# libveloxquant.so: the C API (include/veloxquant/veloxquant_c.h) and the public C++ API
# (include/veloxquant, marked VQ_API) over the whole static core library. Built with
# -fvisibility=hidden, so nothing else is exported; SONAME libveloxquant.so.<VQ_ABI_VERSION>.

# The static libraries are compiled as position-independent code so they can go into the
# shared library and the Python module; the core hides every symbol not marked VQ_API.
set_target_properties(veloxquant veloxquant_engine veloxquant_eval PROPERTIES
  POSITION_INDEPENDENT_CODE ON)
set_target_properties(veloxquant PROPERTIES
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON EXPORT_NAME veloxquant_static)
target_include_directories(veloxquant PUBLIC $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)

file(STRINGS ${PROJECT_SOURCE_DIR}/include/veloxquant/veloxquant_c.h VQ_ABI_LINE
  REGEX "^#define VQ_ABI_VERSION [0-9]+$")
string(REGEX REPLACE "^#define VQ_ABI_VERSION ([0-9]+)$" "\\1" VELOXQUANT_ABI_VERSION "${VQ_ABI_LINE}")
if(NOT VELOXQUANT_ABI_VERSION MATCHES "^[0-9]+$")
  message(FATAL_ERROR "cannot read VQ_ABI_VERSION from include/veloxquant/veloxquant_c.h")
endif()

add_library(veloxquant_shared SHARED src/capi/veloxquant_c.cpp)
target_link_libraries(veloxquant_shared PRIVATE $<LINK_LIBRARY:WHOLE_ARCHIVE,veloxquant>)
target_include_directories(veloxquant_shared PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
# The library's internal headers (base/finite_check.h), for the C API's own source only.
target_include_directories(veloxquant_shared PRIVATE ${PROJECT_SOURCE_DIR}/src)
set_target_properties(veloxquant_shared PROPERTIES
  OUTPUT_NAME veloxquant
  EXPORT_NAME veloxquant
  VERSION ${PROJECT_VERSION}
  SOVERSION ${VELOXQUANT_ABI_VERSION}
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON)
if(NOT VELOXQUANT_SANITIZE)
  target_link_options(veloxquant_shared PRIVATE -Wl,--no-undefined)
endif()

# The C API seen from C: a test compiled as C99 and the C twin of examples/embed.cpp.
add_executable(embed_c_example examples/c/embed.c)
target_link_libraries(embed_c_example PRIVATE veloxquant_shared)
set_target_properties(embed_c_example PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
# The C twin of examples/python/numpy_llama.py: a Llama forward in C over the C API's caches.
add_executable(llama_c_example examples/c/llama.c)
target_link_libraries(llama_c_example PRIVATE veloxquant_shared m)
set_target_properties(llama_c_example PROPERTIES C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
if(VELOXQUANT_BUILD_TESTS)
  add_executable(veloxquant_capi_test tests/capi/test_capi.c)
  target_link_libraries(veloxquant_capi_test PRIVATE veloxquant_shared Threads::Threads m)
  set_target_properties(veloxquant_capi_test PROPERTIES
    C_STANDARD 99 C_STANDARD_REQUIRED ON C_EXTENSIONS OFF)
  target_compile_options(veloxquant_capi_test PRIVATE -pedantic)
  add_test(NAME capi COMMAND veloxquant_capi_test)
  set_tests_properties(capi PROPERTIES LABELS unit)
  add_test(NAME embed_c_example COMMAND embed_c_example)
  set_tests_properties(embed_c_example PROPERTIES LABELS unit
    PASS_REGULAR_EXPRESSION "kept 128 of 1000 tokens")
  # llama.c against `veloxquant eval`: fp16 caches within 5e-4 relative (a key that differs in
  # its last fp32 bit can round to the neighbouring fp16 value), fp32 caches within 1e-6.
  add_test(NAME llama_c_example COMMAND bash ${PROJECT_SOURCE_DIR}/tests/capi/llama_c_test.sh
    $<TARGET_FILE:veloxquant_cli> $<TARGET_FILE:llama_c_example> ${PROJECT_SOURCE_DIR}/data 128 32
    5e-4 full streaming_llm h2o:source=attention h2o:source=attention,headwise=true)
  add_test(NAME llama_c_example_f32 COMMAND bash ${PROJECT_SOURCE_DIR}/tests/capi/llama_c_test.sh
    $<TARGET_FILE:veloxquant_cli> $<TARGET_FILE:llama_c_example> ${PROJECT_SOURCE_DIR}/data 128 32
    1e-6 full:kv_dtype=f32 h2o:source=attention,kv_dtype=f32 tova:kv_dtype=f32
    morphkv:source=attention,kv_dtype=f32,headwise=true)
  set_tests_properties(llama_c_example llama_c_example_f32 PROPERTIES LABELS model
    PASS_REGULAR_EXPRESSION "llama.c: matches veloxquant eval")
  add_test(NAME capi_exports COMMAND bash ${PROJECT_SOURCE_DIR}/tests/capi/check_exports.sh
    $<TARGET_FILE:veloxquant_shared> ${VELOXQUANT_ABI_VERSION})
  set_tests_properties(capi_exports PROPERTIES LABELS unit)
endif()
