// Writes a small seed corpus for fuzz_gguf with GgufWriter:
//   make_gguf_seeds OUT_DIR [GGUF...]
// - empty.gguf, values.gguf (every value type, arrays of each, nested arrays), tensors.gguf (one
//   tensor of every type, alignment 64), v2.gguf
// - for each GGUF given: a shrunken copy (arrays cut to 16 elements, the first 8 tensors replaced
//   by one block of the same type) and the first 4 KiB of the file (a truncated copy).
// Seeds are kept small so that libFuzzer runs many inputs a second.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/tensor_type.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

namespace fs = std::filesystem;
using namespace tandem;

namespace {

constexpr uint64_t kMaxElems = 16;
constexpr size_t kMaxTensors = 8;
constexpr size_t kPrefix = 4096;

void write_bytes(const fs::path& p, const uint8_t* data, size_t n) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!f) throw Error(p.string() + ": write failed");
}

GgufValue shrink(const GgufValue& v) {
  GgufValue s = v;
  if (v.type != GgufValueType::ARRAY) return s;
  s.count = std::min(v.count, kMaxElems);
  if (v.elem_type == GgufValueType::STRING) s.strings.resize(s.count);
  if (v.elem_type == GgufValueType::ARRAY) {
    s.items.clear();
    for (uint64_t i = 0; i < s.count; ++i) s.items.push_back(shrink(v.items[i]));
  }
  return s;
}

void shrunken_copy(const std::string& path, const fs::path& out_dir) {
  const auto src = GgufFile::open(path);
  const std::string stem = fs::path(path).stem().string();
  GgufWriter w;
  for (const auto& [key, v] : src->metadata()) w.set_value(key, shrink(v));
  std::vector<std::vector<uint8_t>> blocks;
  for (size_t i = 0; i < std::min(src->tensors().size(), kMaxTensors); ++i) {
    const auto& t = src->tensors()[i];
    const auto& tt = traits(t.type);
    const int64_t ne[] = {static_cast<int64_t>(tt.block_size), 1};
    const size_t n = std::min<size_t>(tt.type_size, t.nbytes);
    blocks.emplace_back(t.data, t.data + n);
    w.add_tensor(t.name, t.type, std::span<const int64_t>(ne, t.n_dims > 1 ? 2 : 1), blocks.back());
  }
  w.write((out_dir / (stem + ".mini.gguf")).string());
  write_bytes(out_dir / (stem + ".prefix.gguf"), src->base(), std::min(kPrefix, src->file_size()));
}

void synthetic(const fs::path& out_dir) {
  GgufWriter empty;
  empty.write((out_dir / "empty.gguf").string());

  GgufWriter v;
  v.set_string("general.architecture", "llama");
  v.set_u8("u8", 1);
  v.set_i8("i8", -1);
  v.set_u16("u16", 2);
  v.set_i16("i16", -2);
  v.set_u32("u32", 3);
  v.set_i32("i32", -3);
  v.set_u64("u64", 4);
  v.set_i64("i64", -4);
  v.set_f32("f32", 0.5f);
  v.set_f64("f64", 0.25);
  v.set_bool("bool", true);
  v.set_array<uint32_t>("arr.u32", {1, 2, 3});
  v.set_array<float>("arr.f32", {1.0f, -1.0f});
  v.set_array<int64_t>("arr.i64", {-1});
  v.set_bool_array("arr.bool", {true, false});
  const std::vector<std::string> toks = {"<unk>", "<s>", "</s>", "▁a", "b", "<0x0A>"};
  v.set_string_array("tokenizer.ggml.tokens", toks);
  const uint32_t nums[] = {7, 8};
  GgufValue inner;
  inner.type = GgufValueType::ARRAY;
  inner.elem_type = GgufValueType::UINT32;
  inner.count = 2;
  inner.elems = reinterpret_cast<const uint8_t*>(nums);
  GgufValue outer;
  outer.type = GgufValueType::ARRAY;
  outer.elem_type = GgufValueType::ARRAY;
  outer.count = 2;
  outer.items = {inner, inner};
  v.set_value("arr.nested", outer);
  v.write((out_dir / "values.gguf").string());

  GgufWriter t;
  t.set_alignment(64);
  for (TensorType type :
       {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q4_0, TensorType::Q4_1,
        TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0, TensorType::Q2_K, TensorType::Q3_K,
        TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K, TensorType::Q8_K, TensorType::I32}) {
    const auto& tt = traits(type);
    const int64_t ne[] = {static_cast<int64_t>(tt.block_size), 2};
    std::vector<uint8_t> data(2 * tt.type_size);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 13);
    t.add_tensor(std::string("t.") + std::string(tt.name), type, ne, data);
  }
  t.write((out_dir / "tensors.gguf").string());

  // The same small file with version 2 in its header.
  auto bytes = v.to_bytes();
  bytes[4] = 2;
  write_bytes(out_dir / "v2.gguf", bytes.data(), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR [GGUF...]\n", argv[0]);
    return 2;
  }
  try {
    const fs::path out_dir = argv[1];
    fs::create_directories(out_dir);
    synthetic(out_dir);
    for (int i = 2; i < argc; ++i) shrunken_copy(argv[i], out_dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_gguf_seeds: %s\n", e.what());
    return 1;
  }
  return 0;
}
