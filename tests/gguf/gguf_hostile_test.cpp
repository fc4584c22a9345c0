// Hostile and malformed GGUF images: each must be rejected with a tandem::Error that names the
// byte offset and what was expected — never a crash, a hang or a huge allocation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>

#include "common/testdata.h"
#include "gguf/gguf.h"
#include "gguf_test_util.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using testing::Bytes;
using ::testing::HasSubstr;
using testing::parse;
using testing::parse_error;

std::string at(size_t offset) {
  return "byte offset " + std::to_string(offset) + ":";
}

// A valid file with one F32 tensor of 8 elements; used as the base that the cases break.
Bytes one_tensor_file(uint64_t offset = 0, uint32_t type = 0, std::vector<uint64_t> ne = {8}) {
  Bytes b;
  b.header(1, 1).kv_u32("general.alignment", 32).tensor("w", ne, type, offset).pad_to(32);
  b.zeros(32);
  return b;
}

TEST(GgufHostile, BaseFileIsValid) {
  const Bytes b = one_tensor_file();  // the parsed file views into b
  const auto f = parse(b.bytes());
  ASSERT_EQ(f->tensors().size(), 1u);
  EXPECT_EQ(f->tensors()[0].nbytes, 32u);
  EXPECT_EQ(f->data_offset() % 32, 0u);
}

TEST(GgufHostile, Empty) {
  EXPECT_THAT(parse_error({}), AllOf(HasSubstr(at(0)), HasSubstr("expected 4 bytes for magic")));
}

TEST(GgufHostile, BadMagic) {
  Bytes b;
  b.magic("GGML").u32(3).u64(0).u64(0);
  EXPECT_THAT(parse_error(b.bytes()),
              AllOf(HasSubstr(at(0)), HasSubstr("expected magic \"GGUF\", found \"GGML\"")));
  Bytes z;
  z.u32(0).u32(3).u64(0).u64(0);
  EXPECT_THAT(parse_error(z.bytes()), AllOf(HasSubstr(at(0)), HasSubstr("expected magic")));
}

TEST(GgufHostile, UnsupportedVersions) {
  for (uint32_t v : {0u, 1u, 4u, 0x03000000u}) {
    Bytes b;
    b.header(0, 0, v);
    EXPECT_THAT(parse_error(b.bytes()),
                AllOf(HasSubstr(at(4)),
                      HasSubstr("expected GGUF version 2 or 3, found " + std::to_string(v))));
  }
  Bytes v2;
  v2.header(0, 0, 2);
  EXPECT_EQ(parse(v2.bytes())->version(), 2u);
}

TEST(GgufHostile, HugeCounts) {
  Bytes kv;
  kv.header(0, std::numeric_limits<uint64_t>::max());
  EXPECT_THAT(parse_error(kv.bytes()), AllOf(HasSubstr(at(16)), HasSubstr("metadata count")));
  Bytes t;
  t.header(uint64_t{1} << 62, 0);
  EXPECT_THAT(parse_error(t.bytes()), AllOf(HasSubstr(at(8)), HasSubstr("tensor count")));
  // A count that the file could hold only if every entry were tiny still fails on the entries.
  Bytes small;
  small.header(0, 2).kv_u32("a", 1).zeros(5);
  EXPECT_THAT(parse_error(small.bytes()), HasSubstr("byte offset"));
}

TEST(GgufHostile, HugeStringLengths) {
  // Key length beyond the 64 KiB key limit.
  Bytes key;
  key.header(0, 1).u64(uint64_t{1} << 63).zeros(16);
  EXPECT_THAT(parse_error(key.bytes()),
              AllOf(HasSubstr(at(24)), HasSubstr("metadata key: length 9223372036854775808")));
  // A string value longer than the file.
  Bytes val;
  val.header(0, 1).str("k").u32(8).u64(std::numeric_limits<uint64_t>::max());
  const size_t data_at = val.size();
  EXPECT_THAT(parse_error(val.bytes()),
              AllOf(HasSubstr(at(data_at)), HasSubstr("expected 18446744073709551615 bytes for "
                                                      "string value, found only 0")));
  // A string inside an array.
  Bytes arr;
  arr.header(0, 1).str("k").u32(9).u32(8).u64(1).u64(1000);
  EXPECT_THAT(parse_error(arr.bytes()),
              AllOf(HasSubstr(at(arr.size())), HasSubstr("expected 1000 bytes for array string")));
}

TEST(GgufHostile, HugeArrayCount) {
  Bytes b;
  b.header(0, 1).str("k").u32(9).u32(4);
  const size_t count_at = b.size();
  b.u64(uint64_t{1} << 60).zeros(64);
  EXPECT_THAT(parse_error(b.bytes()),
              AllOf(HasSubstr(at(count_at)), HasSubstr("array of 1152921504606846976 elements of "
                                                       "type uint32 does not fit in the remaining "
                                                       "64 bytes")));
  // Arrays of strings and of arrays too (each element needs at least 8 and 12 bytes).
  for (uint32_t elem : {8u, 9u}) {
    Bytes s;
    s.header(0, 1).str("k").u32(9).u32(elem).u64(100).zeros(96);
    EXPECT_THAT(parse_error(s.bytes()), AllOf(HasSubstr(at(count_at)), HasSubstr("does not fit")));
  }
}

// n levels of arrays: [[[...[7]...]]].
Bytes nested(int levels) {
  Bytes b;
  b.header(0, 1).str("k").u32(9);
  for (int i = 1; i < levels; ++i) b.u32(9).u64(1);
  b.u32(4).u64(1).u32(7);
  return b;
}

TEST(GgufHostile, NestedArrays) {
  const Bytes b = nested(8);  // the parsed file views into b
  const auto f = parse(b.bytes());
  const GgufValue* v = f->find("k");
  ASSERT_NE(v, nullptr);
  for (int i = 1; i < 8; ++i) {
    ASSERT_EQ(v->type, GgufValueType::ARRAY);
    ASSERT_EQ(v->elem_type, GgufValueType::ARRAY);
    ASSERT_EQ(v->items.size(), 1u);
    v = &v->items[0];
  }
  EXPECT_EQ(v->elem_type, GgufValueType::UINT32);
  ASSERT_EQ(v->count, 1u);
  uint32_t x;
  std::memcpy(&x, v->elems, 4);
  EXPECT_EQ(x, 7u);

  // One level more is refused where the ninth array would start.
  const size_t ninth_at = 24 + 9 + 4 + 8 * 12;
  EXPECT_THAT(parse_error(nested(9).bytes()),
              AllOf(HasSubstr(at(ninth_at)), HasSubstr("arrays nested deeper than 8 levels")));
  // Very deep nesting does not recurse without bound.
  EXPECT_THAT(parse_error(nested(100000).bytes()), HasSubstr("nested deeper than 8"));
}

TEST(GgufHostile, UnknownValueTypes) {
  Bytes b;
  b.header(0, 1).str("key").u32(13).u32(0);
  EXPECT_THAT(parse_error(b.bytes()),
              AllOf(HasSubstr(at(24 + 11)), HasSubstr("key 'key': expected a value type 0..12, "
                                                      "found 13")));
  Bytes a;
  a.header(0, 1).str("key").u32(9).u32(0xffffffff).u64(0);
  EXPECT_THAT(parse_error(a.bytes()),
              AllOf(HasSubstr(at(24 + 15)), HasSubstr("expected an array element type 0..12, "
                                                      "found 4294967295")));
}

TEST(GgufHostile, DuplicateKey) {
  Bytes b;
  b.header(0, 2).kv_u32("a.b", 1);
  const size_t second = b.size();
  b.kv_u32("a.b", 2);
  EXPECT_THAT(parse_error(b.bytes()),
              AllOf(HasSubstr(at(second)), HasSubstr("duplicate metadata key 'a.b'")));
}

TEST(GgufHostile, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u, 1u << 21}) {
    Bytes b;
    b.header(0, 1).kv_u32("general.alignment", a);
    EXPECT_THAT(parse_error(b.bytes()),
                AllOf(HasSubstr(at(24 + 8 + 17 + 4)),
                      HasSubstr("general.alignment: expected a power of two up to 1 MiB, found " +
                                std::to_string(a))));
  }
  Bytes neg;
  neg.header(0, 1).str("general.alignment").u32(5).i32(-32);
  EXPECT_THAT(parse_error(neg.bytes()), HasSubstr("expected a power of two"));
  Bytes str;
  str.header(0, 1).str("general.alignment").u32(8).str("32");
  EXPECT_THAT(parse_error(str.bytes()),
              HasSubstr("expected a power of two up to 1 MiB, found string"));
}

TEST(GgufHostile, TensorOffsetOutOfRange) {
  const auto b = one_tensor_file(/*offset=*/64);
  const auto f_err = parse_error(b.bytes());
  // data starts at 96 (header of 90 bytes padded to 32): 96 + 64 = 160 > 128-byte file.
  EXPECT_THAT(f_err, AllOf(HasSubstr("tensor 'w' [8] F32: expected 32 bytes at byte offset 160"),
                           HasSubstr("the file ends at 128")));
  // Offsets near 2^64 must not wrap around.
  const auto wrap = one_tensor_file(/*offset=*/std::numeric_limits<uint64_t>::max() - 31);
  EXPECT_THAT(parse_error(wrap.bytes()), HasSubstr("tensor 'w' [8] F32: expected 32 bytes"));
}

TEST(GgufHostile, MisalignedTensorOffset) {
  const auto b = one_tensor_file(/*offset=*/8);
  const size_t off_at = 24 + 8 + 17 + 4 + 4 + 8 + 1 + 4 + 8 + 4;
  EXPECT_THAT(parse_error(b.bytes()),
              AllOf(HasSubstr(at(off_at)),
                    HasSubstr("tensor 'w': data offset 8 is not a multiple of the alignment 32")));
}

TEST(GgufHostile, UnknownTensorType) {
  const auto b = one_tensor_file(0, /*type=*/99);
  const size_t type_at = 24 + 8 + 17 + 4 + 4 + 8 + 1 + 4 + 8;
  EXPECT_THAT(parse_error(b.bytes()),
              AllOf(HasSubstr(at(type_at)), HasSubstr("tensor 'w': unsupported ggml type id 99")));
  // Removed ggml types 4 and 5 (Q4_2, Q4_3) are unknown as well.
  EXPECT_THAT(parse_error(one_tensor_file(0, 4).bytes()), HasSubstr("unsupported ggml type id 4"));
}

TEST(GgufHostile, BadTensorShapes) {
  const size_t dims_at = 24 + 8 + 17 + 4 + 4 + 8 + 1;
  // No dimensions, too many.
  EXPECT_THAT(parse_error(one_tensor_file(0, 0, {}).bytes()),
              AllOf(HasSubstr(at(dims_at)), HasSubstr("expected 1..4 dimensions, found 0")));
  EXPECT_THAT(parse_error(one_tensor_file(0, 0, {1, 1, 1, 1, 1}).bytes()),
              HasSubstr("expected 1..4 dimensions, found 5"));
  // A zero dimension; a product that overflows 64 bits.
  EXPECT_THAT(parse_error(one_tensor_file(0, 0, {8, 0}).bytes()),
              AllOf(HasSubstr(at(dims_at + 12)), HasSubstr("dimension 1 = 0 is zero")));
  EXPECT_THAT(parse_error(one_tensor_file(0, 0, {1ull << 40, 1ull << 40}).bytes()),
              HasSubstr("impossibly large"));
  // Q4_0 rows must be a multiple of 32 elements.
  EXPECT_THAT(parse_error(one_tensor_file(0, 2, {16}).bytes()),
              AllOf(HasSubstr(at(dims_at)),
                    HasSubstr("row length 16 is not a multiple of the Q4_0 block size 32")));
}

TEST(GgufHostile, DuplicateTensorName) {
  Bytes b;
  b.header(2, 0).tensor("w", {8}, 0, 0);
  const size_t second = b.size();
  b.tensor("w", {8}, 0, 32).pad_to(32).zeros(64);
  EXPECT_THAT(parse_error(b.bytes()),
              AllOf(HasSubstr(at(second)), HasSubstr("duplicate tensor name 'w'")));
}

TEST(GgufHostile, HeaderBeyondEndOfFile) {
  Bytes b;
  b.header(1, 0).tensor("w", {8}, 0, 0);  // 57 bytes: no padding, no data
  EXPECT_THAT(parse_error(b.bytes()),
              AllOf(HasSubstr(at(57)), HasSubstr("expected tensor data to start at byte 64")));
  b.pad_to(32);  // padding, no data
  EXPECT_THAT(parse_error(b.bytes()),
              HasSubstr("expected 32 bytes at byte offset 64, but the file ends at 64"));
}

// Every prefix of a real file shorter than the end of its last tensor must fail cleanly: each
// byte of the header region, then a stride through the tensor data and every tensor boundary.
TEST(GgufHostile, TruncatedRealFile) {
  const std::string bytes =
      testing::read_file(testing::testdata_path("models/synth-llama-Q2_K.gguf"));
  std::vector<uint8_t> file(bytes.begin(), bytes.end());
  const auto full = parse(file);
  size_t needed = full->data_offset();
  std::vector<size_t> cuts;
  for (const auto& t : full->tensors()) {
    const size_t end = full->data_offset() + t.offset + t.nbytes;
    needed = std::max(needed, end);
    cuts.push_back(end - 1);
  }
  // Every byte of the header; under the sanitizers (about 4x slower) every byte of the first
  // 8 KiB and around each metadata value, then every 7th byte.
#if defined(__SANITIZE_ADDRESS__)
  const size_t step = 7;
#else
  const size_t step = 1;
#endif
  for (size_t n = 0; n <= full->data_offset(); n += (n < 8192 ? 1 : step)) cuts.push_back(n);
  for (const auto& kv : full->metadata()) {
    for (size_t n = kv.second.file_offset - 16; n < kv.second.file_offset + 16; ++n) {
      cuts.push_back(n);
    }
  }
  for (size_t n = full->data_offset(); n < needed; n += 4093) cuts.push_back(n);
  cuts.push_back(needed - 1);
  for (size_t n : cuts) {
    ASSERT_LT(n, needed);
    std::vector<uint8_t> prefix(file.begin(), file.begin() + n);
    const std::string msg = parse_error(prefix);
    ASSERT_THAT(msg, HasSubstr("byte offset")) << "prefix of " << n << " bytes";
    if (::testing::Test::HasFailure()) break;
  }
  // The prefix up to the last tensor's end still parses.
  std::vector<uint8_t> exact(file.begin(), file.begin() + needed);
  EXPECT_EQ(parse(exact)->tensors().size(), full->tensors().size());
}

// Flipping bytes of a real header never crashes (a poor man's fuzz run in the unit tests).
TEST(GgufHostile, CorruptedHeaderBytes) {
  const std::string bytes =
      testing::read_file(testing::testdata_path("models/synth-qwen3-Q4_K_M.gguf"));
  std::vector<uint8_t> file(bytes.begin(), bytes.end());
  const size_t header = parse(file)->data_offset();
  uint32_t rng = 12345;
  int failures = 0;
  for (int i = 0; i < 3000; ++i) {
    size_t pos[4];
    uint8_t bit[4];
    for (int k = 0; k < 4; ++k) {
      rng = rng * 1664525u + 1013904223u;
      pos[k] = (rng >> 8) % header;
      bit[k] = static_cast<uint8_t>(1u << (rng & 7));
      file[pos[k]] ^= bit[k];
    }
    try {
      parse(file);
    } catch (const Error& e) {
      ++failures;
      ASSERT_THAT(e.what(), HasSubstr("mem.gguf: "));
    }
    for (int k = 3; k >= 0; --k) file[pos[k]] ^= bit[k];
  }
  EXPECT_GT(failures, 0);
}

}  // namespace
}  // namespace tandem
