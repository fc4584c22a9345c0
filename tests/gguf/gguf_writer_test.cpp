// GgufWriter: everything written reads back identically with GgufFile.
#include "gguf/gguf_writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <numeric>
#include <string>

#include "common/testdata.h"
#include "gguf/gguf.h"
#include "gguf_test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::parse;

// Deep equality of two values as the reader returns them (ignores file offsets).
void expect_same_value(const GgufValue& a, const GgufValue& b, const std::string& where) {
  ASSERT_EQ(a.type, b.type) << where;
  switch (a.type) {
    case GgufValueType::STRING:
      EXPECT_EQ(a.str, b.str) << where;
      return;
    case GgufValueType::FLOAT32:
    case GgufValueType::FLOAT64:
      EXPECT_EQ(std::memcmp(&a.f64, &b.f64, sizeof(double)), 0) << where;
      return;
    case GgufValueType::ARRAY:
      break;
    default:
      EXPECT_EQ(a.u64, b.u64) << where;
      EXPECT_EQ(a.i64, b.i64) << where;
      return;
  }
  ASSERT_EQ(a.elem_type, b.elem_type) << where;
  ASSERT_EQ(a.count, b.count) << where;
  if (a.elem_type == GgufValueType::STRING) {
    EXPECT_EQ(a.strings, b.strings) << where;
  } else if (a.elem_type == GgufValueType::ARRAY) {
    ASSERT_EQ(a.items.size(), b.items.size()) << where;
    for (size_t i = 0; i < a.items.size(); ++i) {
      expect_same_value(a.items[i], b.items[i], where + "[" + std::to_string(i) + "]");
    }
  } else if (a.count) {
    EXPECT_EQ(std::memcmp(a.elems, b.elems, a.count * gguf_scalar_size(a.elem_type)), 0) << where;
  }
}

void expect_same_file(const GgufFile& a, const GgufFile& b) {
  ASSERT_EQ(a.metadata().size(), b.metadata().size());
  for (size_t i = 0; i < a.metadata().size(); ++i) {
    const auto& [ka, va] = a.metadata()[i];
    const auto& [kb, vb] = b.metadata()[i];
    ASSERT_EQ(ka, kb);
    expect_same_value(va, vb, ka);
  }
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const auto& ta = a.tensors()[i];
    const auto& tb = b.tensors()[i];
    ASSERT_EQ(ta.name, tb.name);
    EXPECT_EQ(ta.type, tb.type) << ta.name;
    EXPECT_EQ(ta.n_dims, tb.n_dims) << ta.name;
    EXPECT_EQ(ta.shape_string(), tb.shape_string()) << ta.name;
    ASSERT_EQ(ta.nbytes, tb.nbytes) << ta.name;
    EXPECT_EQ(std::memcmp(ta.data, tb.data, ta.nbytes), 0) << ta.name;
  }
}

// A temporary directory removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "tandem-gguf-XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

TEST(GgufWriter, EmptyFile) {
  GgufWriter w;
  const auto bytes = w.to_bytes();
  EXPECT_EQ(bytes.size(), 32u);  // 24-byte header padded to the alignment
  const auto f = parse(bytes);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_TRUE(f->metadata().empty());
  EXPECT_TRUE(f->tensors().empty());
}

TEST(GgufWriter, ScalarsRoundTrip) {
  GgufWriter w;
  w.set_u8("u8", 255);
  w.set_i8("i8", -128);
  w.set_u16("u16", 65535);
  w.set_i16("i16", -32768);
  w.set_u32("u32", 4294967295u);
  w.set_i32("i32", std::numeric_limits<int32_t>::min());
  w.set_u64("u64", std::numeric_limits<uint64_t>::max());
  w.set_i64("i64", std::numeric_limits<int64_t>::min());
  w.set_f32("f32", 1e-6f);
  w.set_f64("f64", -1.0 / 3.0);
  w.set_bool("t", true);
  w.set_bool("f", false);
  w.set_string("s", "héllo\n");
  w.set_string("empty", "");
  w.set_string("nul", std::string_view("a\0b", 3));
  const auto bytes = w.to_bytes();
  const auto f = parse(bytes);
  ASSERT_EQ(f->metadata().size(), 15u);
  EXPECT_EQ(f->get_u64("u8"), 255u);
  EXPECT_EQ(f->get_i64_or("i8", 0), -128);
  EXPECT_EQ(f->get_u64("u16"), 65535u);
  EXPECT_EQ(f->get_i64_or("i16", 0), -32768);
  EXPECT_EQ(f->get_u64("u32"), 4294967295u);
  EXPECT_EQ(f->get_i64_or("i32", 0), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(f->get_u64("u64"), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f->get_i64_or("i64", 0), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f->get_f64("f32"), static_cast<double>(1e-6f));
  EXPECT_EQ(f->get_f64("f64"), -1.0 / 3.0);
  EXPECT_TRUE(f->get_bool_or("t", false));
  EXPECT_FALSE(f->get_bool_or("f", true));
  EXPECT_EQ(f->get_string("s"), "héllo\n");
  EXPECT_EQ(f->get_string("empty"), "");
  EXPECT_EQ(f->get_string("nul"), std::string_view("a\0b", 3));
  EXPECT_EQ(f->find("u8")->type, GgufValueType::UINT8);
  EXPECT_EQ(f->find("i16")->type, GgufValueType::INT16);
  EXPECT_EQ(f->find("f32")->type, GgufValueType::FLOAT32);
  EXPECT_EQ(f->find("t")->type, GgufValueType::BOOL);
}

TEST(GgufWriter, ArraysRoundTrip) {
  GgufWriter w;
  w.set_array<uint8_t>("a.u8", {0, 1, 255});
  w.set_array<int8_t>("a.i8", {-1, 2});
  w.set_array<uint16_t>("a.u16", {7});
  w.set_array<int16_t>("a.i16", {-7, 7});
  w.set_array<uint32_t>("a.u32", {1, 2, 3});
  w.set_array<int32_t>("a.i32", {-1, 0, 1});
  w.set_array<uint64_t>("a.u64", {std::numeric_limits<uint64_t>::max()});
  w.set_array<int64_t>("a.i64", {-5});
  w.set_array<float>("a.f32", {0.5f, -2.0f, 1e30f});
  w.set_array<double>("a.f64", {0.25, 1e300});
  w.set_array("a.empty", std::vector<float>{});
  w.set_bool_array("a.bool", {true, false, true});
  const std::vector<std::string> strs = {"<s>", "", "▁the", std::string("x\0y", 3)};
  w.set_string_array("a.str", strs);
  const std::vector<std::string_view> views = {"a", "bc"};
  w.set_string_array("a.sv", views);
  const auto bytes = w.to_bytes();
  const auto f = parse(bytes);
  EXPECT_EQ(f->get_int_array("a.u8"), (std::vector<int64_t>{0, 1, 255}));
  EXPECT_EQ(f->get_int_array("a.i8"), (std::vector<int64_t>{-1, 2}));
  EXPECT_EQ(f->get_int_array("a.u16"), (std::vector<int64_t>{7}));
  EXPECT_EQ(f->get_int_array("a.i16"), (std::vector<int64_t>{-7, 7}));
  EXPECT_EQ(f->get_int_array("a.u32"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(f->get_int_array("a.i32"), (std::vector<int64_t>{-1, 0, 1}));
  EXPECT_EQ(f->get_int_array("a.u64"), (std::vector<int64_t>{-1}));
  EXPECT_EQ(f->get_int_array("a.i64"), (std::vector<int64_t>{-5}));
  EXPECT_EQ(f->get_f32_array("a.f32"), (std::vector<float>{0.5f, -2.0f, 1e30f}));
  EXPECT_EQ(f->get_f32_array("a.f64"), (std::vector<float>{0.25f, INFINITY}));
  EXPECT_TRUE(f->get_f32_array("a.empty").empty());
  EXPECT_EQ(f->find("a.empty")->elem_type, GgufValueType::FLOAT32);
  EXPECT_EQ(f->find("a.bool")->elem_type, GgufValueType::BOOL);
  EXPECT_EQ(f->get_int_array("a.bool"), (std::vector<int64_t>{1, 0, 1}));
  const auto& s = f->get_string_array("a.str");
  ASSERT_EQ(s.size(), strs.size());
  for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(s[i], strs[i]);
  EXPECT_EQ(f->get_string_array("a.sv"), views);
  EXPECT_EQ(f->find("a.u16")->elem_type, GgufValueType::UINT16);
  EXPECT_EQ(f->find("a.f64")->elem_type, GgufValueType::FLOAT64);
}

TEST(GgufWriter, NestedArraysRoundTrip) {
  // [[1, 2], [], [["x", "y"]]] would mix kinds, which GGUF forbids; build [[u32 x2], [u32 x0]]
  // and an 8-level chain, the deepest the reader takes.
  const uint32_t nums[] = {1, 2};
  GgufValue inner1;
  inner1.type = GgufValueType::ARRAY;
  inner1.elem_type = GgufValueType::UINT32;
  inner1.count = 2;
  inner1.elems = reinterpret_cast<const uint8_t*>(nums);
  GgufValue inner2 = inner1;
  inner2.count = 0;
  inner2.elems = nullptr;
  GgufValue outer;
  outer.type = GgufValueType::ARRAY;
  outer.elem_type = GgufValueType::ARRAY;
  outer.count = 2;
  outer.items = {inner1, inner2};

  GgufValue chain = inner1;
  for (int i = 1; i < 8; ++i) {
    GgufValue up;
    up.type = GgufValueType::ARRAY;
    up.elem_type = GgufValueType::ARRAY;
    up.count = 1;
    up.items = {chain};
    chain = up;
  }
  GgufWriter w;
  w.set_value("nested", outer);
  w.set_value("chain", chain);
  const auto bytes = w.to_bytes();
  const auto f = parse(bytes);
  expect_same_value(*f->find("nested"), outer, "nested");
  expect_same_value(*f->find("chain"), chain, "chain");

  // One level more would be unreadable, so the writer refuses it.
  GgufValue too_deep;
  too_deep.type = GgufValueType::ARRAY;
  too_deep.elem_type = GgufValueType::ARRAY;
  too_deep.count = 1;
  too_deep.items = {chain};
  try {
    w.set_value("deep", too_deep);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("key 'deep': arrays nested deeper than 8 levels"));
  }
  // Inconsistent counts are refused too.
  GgufValue bad = outer;
  bad.count = 3;
  EXPECT_THROW(w.set_value("bad", bad), Error);
}

TEST(GgufWriter, SetReplacesInPlaceAndRemove) {
  GgufWriter w;
  w.set_u32("a", 1);
  w.set_string("b", "x");
  w.set_u32("c", 3);
  w.set_string("a", "now a string");
  w.remove("b");
  EXPECT_FALSE(w.has("b"));
  EXPECT_TRUE(w.has("a"));
  EXPECT_EQ(w.metadata_count(), 2u);
  const auto bytes = w.to_bytes();
  const auto f = parse(bytes);
  ASSERT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->metadata()[0].first, "a");
  EXPECT_EQ(f->get_string("a"), "now a string");
  EXPECT_EQ(f->metadata()[1].first, "c");
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

TEST(GgufWriter, TensorsRoundTripWithAlignment) {
  for (uint64_t alignment : {32u, 64u, 4096u}) {
    GgufWriter w;
    w.set_string("general.architecture", "test");
    if (alignment != 32) w.set_alignment(alignment);
    const int64_t ne_f32[] = {3, 5};
    const int64_t ne_q4[] = {64, 2, 3};
    const int64_t ne_q6[] = {256};
    const int64_t ne_f16[] = {1, 1, 1, 7};
    const auto d_f32 = pattern(3 * 5 * 4, 1);
    const auto d_q4 = pattern(2 * 6 * 18, 2);
    const auto d_q6 = pattern(210, 3);
    const auto d_f16 = pattern(14, 4);
    w.add_tensor("a.f32", TensorType::F32, ne_f32, d_f32);
    w.add_tensor("b.q4_0", TensorType::Q4_0, ne_q4, d_q4);
    w.add_tensor_view("c.q6_k", TensorType::Q6_K, ne_q6, d_q6);
    w.add_tensor("d.f16", TensorType::F16, ne_f16, d_f16);
    EXPECT_EQ(w.tensor_count(), 4u);
    const auto bytes = w.to_bytes();
    EXPECT_EQ(bytes.size() % alignment, 0u);
    const auto f = parse(bytes);
    EXPECT_EQ(f->alignment(), alignment);
    ASSERT_EQ(f->tensors().size(), 4u);
    const std::vector<const std::vector<uint8_t>*> data = {&d_f32, &d_q4, &d_q6, &d_f16};
    for (size_t i = 0; i < 4; ++i) {
      const auto& t = f->tensors()[i];
      EXPECT_EQ((f->data_offset() + t.offset) % alignment, 0u) << t.name;
      ASSERT_EQ(t.nbytes, data[i]->size()) << t.name;
      EXPECT_EQ(std::memcmp(t.data, data[i]->data(), t.nbytes), 0) << t.name;
    }
    EXPECT_EQ(f->tensors()[1].shape_string(), "[64, 2, 3]");
    EXPECT_EQ(f->tensors()[3].n_dims, 4u);
    EXPECT_EQ(f->tensors()[3].ne[3], 7);
  }
}

TEST(GgufWriter, TensorErrors) {
  GgufWriter w;
  const auto d = pattern(32, 0);
  const int64_t ne8[] = {8};
  w.add_tensor("w", TensorType::F32, ne8, d);
  auto expect_error = [&](auto&& fn, const std::string& text) {
    try {
      fn();
      ADD_FAILURE() << "expected an error containing: " << text;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr(text));
    }
  };
  expect_error([&] { w.add_tensor("w", TensorType::F32, ne8, d); },
               "tensor 'w': duplicate tensor name");
  const int64_t ne9[] = {9};
  expect_error([&] { w.add_tensor("x", TensorType::F32, ne9, d); },
               "tensor 'x': F32 9 elements need 36 bytes, got 32");
  const int64_t ne16[] = {16};
  expect_error([&] { w.add_tensor("q", TensorType::Q4_0, ne16, d); },
               "row length 16 is not a multiple of the Q4_0 block size 32");
  const int64_t ne0[] = {8, 0};
  expect_error([&] { w.add_tensor("z", TensorType::F32, ne0, d); }, "dimension 1 = 0");
  const int64_t ne5[] = {1, 1, 1, 1, 8};
  expect_error([&] { w.add_tensor("five", TensorType::F32, ne5, d); },
               "expected 1..4 dimensions, got 5");
  expect_error([&] { w.set_alignment(48); }, "power of two");
  expect_error([&] { w.set_u32("", 1); }, "empty metadata key");
  EXPECT_EQ(w.tensor_count(), 1u);
}

// Copying a real file's metadata and tensors reproduces it: same values, same bytes.
TEST(GgufWriter, CopyRealFileRoundTrip) {
  TempDir dir;
  for (const char* name : {"models/synth-gemma3-Q4_K_M.gguf", "models/synth-qwen3-BF16.gguf",
                           "tokenizers/ggml-vocab-llama-spm.gguf"}) {
    const auto src = GgufFile::open(testing::testdata_path(name));
    GgufWriter w;
    w.copy_metadata(*src);
    for (const auto& t : src->tensors()) w.add_tensor_view(t);
    const auto out = (dir.path / "copy.gguf").string();
    w.write(out);
    const auto copy = GgufFile::open(out);
    expect_same_file(*src, *copy);
    EXPECT_EQ(copy->data_offset(), src->data_offset()) << name;
    // gguf-py lays files out the same way, so the copy is byte-identical up to trailing padding.
    const std::string a = testing::read_file(src->path());
    const std::string b = testing::read_file(out);
    const size_t n = std::min(a.size(), b.size());
    EXPECT_EQ(a.substr(0, n), b.substr(0, n)) << name;
  }
}

TEST(GgufWriter, WriteIsAtomicAndReplaces) {
  TempDir dir;
  const auto path = (dir.path / "m.gguf").string();
  GgufWriter w;
  w.set_u32("v", 1);
  w.write(path);
  w.set_u32("v", 2);
  const auto d = pattern(4096, 9);
  const int64_t ne[] = {1024};
  w.add_tensor("t", TensorType::F32, ne, d);
  w.write(path);
  const auto f = GgufFile::open(path);
  EXPECT_EQ(f->get_u64("v"), 2u);
  EXPECT_EQ(f->tensors().size(), 1u);
  // Nothing but the target is left in the directory.
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    ++n;
    EXPECT_EQ(e.path().filename(), "m.gguf");
  }
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(fs::status(path).permissions() & fs::perms::owner_read, fs::perms::owner_read);
  try {
    w.write((dir.path / "no" / "such" / "dir.gguf").string());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("dir.gguf.tmp."));
    EXPECT_THAT(e.what(), HasSubstr("cannot create"));
  }
}

}  // namespace
}  // namespace tandem
