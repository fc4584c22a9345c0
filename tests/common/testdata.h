// Locating the shared reference data. Tests read ../shared/testdata and ../shared/data in
// place (relative to the repository root) and fail loudly when a file is missing: a vector
// that silently is not checked is worse than a red test.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace tandem::testing {

inline std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("TANDEM_SHARED_DIR")) return env;
  return std::filesystem::path(TANDEM_SOURCE_DIR) / ".." / "shared";
}

// Absolute path of a file under ../shared/testdata; fails the test (fatally) when missing.
inline std::string testdata_path(const std::string& rel) {
  const auto p = shared_dir() / "testdata" / rel;
  if (!std::filesystem::exists(p)) {
    ADD_FAILURE() << "missing reference file " << p.string()
                  << " (tests read ../shared/testdata in place)";
    throw std::runtime_error("missing reference file " + p.string());
  }
  return p.string();
}

inline std::string data_path(const std::string& rel) {
  const auto p = shared_dir() / "data" / rel;
  if (!std::filesystem::exists(p)) {
    ADD_FAILURE() << "missing data file " << p.string();
    throw std::runtime_error("missing data file " + p.string());
  }
  return p.string();
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline std::vector<float> read_f32(const std::string& path) {
  const std::string bytes = read_file(path);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

}  // namespace tandem::testing
