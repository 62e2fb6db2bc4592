// Symbol export for the shared library. libveloxquant.so is built with -fvisibility=hidden, so
// only what is marked VQ_API (the public C++ API in include/veloxquant) and VQ_C_API (the C API,
// veloxquant_c.h) is visible to programs that link it. In the static library the mark changes
// nothing.
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define VQ_API __attribute__((visibility("default")))
#else
#define VQ_API
#endif
