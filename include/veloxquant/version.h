#pragma once
namespace vq {
inline constexpr const char* kVersion = "0.1.0";
}
