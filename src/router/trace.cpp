// Router trace files (format in trace.h and docs/router.md).
#include "router/trace.h"

#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/byte_reader.h"
#include "common/error.h"

namespace tandem::router {
namespace {

static_assert(std::endian::native == std::endian::little,
              "trace files are little-endian; add byte swapping for this host");

constexpr char kMagic[12] = {'T', 'N', 'D', 'M', 'T', 'R', 'A', 'C', 'E', 0, 0, 0};
constexpr uint32_t kSeqTag = 0x31514553;  // "SEQ1"
constexpr uint32_t kMaxName = 4096;
constexpr uint32_t kMaxEmbd = 1 << 16, kMaxTopK = 256;
// position .. flags, 4 bytes each: version 1 has no outcome.
size_t record_scalars(uint32_t version) {
  return version >= 2 ? 12 : 11;
}

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void put_floats(std::vector<uint8_t>& out, const std::vector<float>& v, size_t n) {
  const size_t at = out.size();
  out.resize(at + n * sizeof(float));
  std::memcpy(out.data() + at, v.data(), n * sizeof(float));
}

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

TraceHeader parse_header(ByteReader& c) {
  const uint8_t* magic = c.skip(sizeof kMagic, "the magic");
  if (std::memcmp(magic, kMagic, sizeof kMagic) != 0)
    c.fail(0, "not a tandem router trace (expected magic \"TNDMTRACE\")");
  TraceHeader h;
  size_t at = c.pos();
  h.version = c.read<uint32_t>("version");
  if (h.version != 1 && h.version != kTraceVersion) {
    c.fail(at, "version " + std::to_string(h.version) + " (this build reads versions 1 and " +
                   std::to_string(kTraceVersion) + ")");
  }
  at = c.pos();
  h.n_embd = c.read<uint32_t>("n_embd");
  if (h.n_embd == 0 || h.n_embd > kMaxEmbd)
    c.fail(at, "n_embd " + std::to_string(h.n_embd) + " (expected 1.." + std::to_string(kMaxEmbd) +
                   ")");
  at = c.pos();
  h.top_k = c.read<uint32_t>("top_k");
  if (h.top_k < 2 || h.top_k > kMaxTopK)
    c.fail(at,
           "top_k " + std::to_string(h.top_k) + " (expected 2.." + std::to_string(kMaxTopK) + ")");
  h.n_vocab = c.read<uint32_t>("n_vocab");
  h.vocab_fingerprint = c.read<uint64_t>("vocab fingerprint");
  h.flags = c.read<uint32_t>("flags");
  at = c.pos();
  const uint32_t name_len = c.read<uint32_t>("name length");
  if (name_len > kMaxName)
    c.fail(at, "name length " + std::to_string(name_len) + " (at most " + std::to_string(kMaxName) +
                   ")");
  const uint8_t* name = c.skip(name_len, "the model name");
  h.model_name.assign(reinterpret_cast<const char*>(name), name_len);
  return h;
}

}  // namespace

size_t trace_record_bytes(const TraceHeader& h) {
  return 4 * (record_scalars(h.version) + h.top_k + h.n_embd);
}

size_t TraceFile::n_records() const {
  size_t n = 0;
  for (const auto& s : sequences) n += s.records.size();
  return n;
}

std::vector<uint8_t> encode_trace_header(const TraceHeader& h) {
  std::vector<uint8_t> out(kMagic, kMagic + sizeof kMagic);
  put(out, h.version);
  put(out, h.n_embd);
  put(out, h.top_k);
  put(out, h.n_vocab);
  put(out, h.vocab_fingerprint);
  put(out, h.flags);
  const uint32_t n = static_cast<uint32_t>(std::min<size_t>(h.model_name.size(), kMaxName));
  put(out, n);
  out.insert(out.end(), h.model_name.begin(), h.model_name.begin() + n);
  return out;
}

std::vector<uint8_t> encode_trace_sequence(const TraceHeader& h, const TraceSequence& seq) {
  std::vector<uint8_t> out;
  out.reserve(16 + seq.records.size() * trace_record_bytes(h) + 8);
  put(out, kSeqTag);
  put(out, seq.id);
  put(out, static_cast<uint32_t>(seq.records.size()));
  for (const auto& r : seq.records) {
    if (r.log_top.size() != h.top_k || r.hidden.size() != h.n_embd) {
      throw Error("trace sequence " + std::to_string(seq.id) + ": a record has " +
                  std::to_string(r.log_top.size()) + " top log-probs and " +
                  std::to_string(r.hidden.size()) + " hidden values, expected " +
                  std::to_string(h.top_k) + " and " + std::to_string(h.n_embd));
    }
    put(out, r.position);
    put(out, r.edge_top1);
    put(out, r.true_token);
    put(out, r.cloud_top1);
    put(out, r.cloud_lp_edge);
    put(out, r.cloud_lp_true);
    put(out, r.edge_lp_true);
    put(out, r.entropy);
    put(out, r.margin);
    put(out, r.kl_cloud_edge);
    if (h.version >= 2) put(out, r.outcome);
    put(out, r.flags);
    put_floats(out, r.log_top, h.top_k);
    put_floats(out, r.hidden, h.n_embd);
  }
  put(out, fnv1a(out.data(), out.size()));
  return out;
}

namespace {

// One record of rec_bytes at p (little-endian 4-byte fields, layout in trace.h): the scalars,
// then log_top [top_k] and hidden [n_embd] floats.
void decode_record(const uint8_t* p, const TraceHeader& h, TraceRecord& r) {
  auto f32 = [&](size_t k) {
    float v;
    std::memcpy(&v, p + 4 * k, 4);
    return v;
  };
  auto i32 = [&](size_t k) {
    int32_t v;
    std::memcpy(&v, p + 4 * k, 4);
    return v;
  };
  const uint32_t K = h.top_k, D = h.n_embd;
  r.position = i32(0);
  r.edge_top1 = i32(1);
  r.true_token = i32(2);
  r.cloud_top1 = i32(3);
  r.cloud_lp_edge = f32(4);
  r.cloud_lp_true = f32(5);
  r.edge_lp_true = f32(6);
  r.entropy = f32(7);
  r.margin = f32(8);
  r.kl_cloud_edge = f32(9);
  const size_t scalars = record_scalars(h.version);
  if (h.version >= 2) r.outcome = f32(10);
  r.flags = static_cast<uint32_t>(i32(scalars - 1));
  r.log_top.resize(K);
  std::memcpy(r.log_top.data(), p + 4 * scalars, 4 * K);
  r.hidden.resize(D);
  std::memcpy(r.hidden.data(), p + 4 * (scalars + K), 4 * D);
}

// Positions are never negative; token ids lie below n_vocab when the header names it. Checked
// after the hash, so that damage is reported as damage. The records end at hash_at.
void check_record_ids(const ByteReader& c, const TraceHeader& h, const TraceSequence& seq,
                      size_t hash_at, size_t rec_bytes) {
  const size_t count = seq.records.size();
  for (size_t i = 0; i < count; ++i) {
    const TraceRecord& r = seq.records[i];
    const size_t rec_at = hash_at - (count - i) * rec_bytes;
    if (r.position < 0 || (h.n_vocab && (r.edge_top1 < 0 || r.cloud_top1 < 0 ||
                                         r.edge_top1 >= static_cast<int32_t>(h.n_vocab) ||
                                         r.cloud_top1 >= static_cast<int32_t>(h.n_vocab) ||
                                         r.true_token >= static_cast<int32_t>(h.n_vocab)))) {
      c.fail(rec_at, "record " + std::to_string(i) + " of sequence " + std::to_string(seq.id) +
                         ": a position or token id is out of range (n_vocab " +
                         std::to_string(h.n_vocab) + ")");
    }
  }
}

// One sequence: tag "SEQ1", id, record count, the records, the FNV-1a hash of all of it.
// Throws TruncatedInput when the file ends inside it, Error on any other damage.
TraceSequence read_sequence(ByteReader& c, const TraceHeader& h, const std::string& name,
                            size_t rec_bytes) {
  const size_t start = c.pos();
  const uint32_t tag = c.read<uint32_t>("a sequence tag");
  if (tag != kSeqTag) {
    c.fail(start, "expected a sequence tag \"SEQ1\" (0x31514553), found 0x" + hex(tag));
  }
  const uint64_t id = c.read<uint64_t>("the sequence id");
  const size_t count_at = c.pos();
  const uint32_t count = c.read<uint32_t>("the record count");
  // Checked before anything is allocated: the records must fit in what is left.
  if (static_cast<uint64_t>(count) * rec_bytes + 8 > c.remaining()) {
    throw TruncatedInput(
        name + ": byte offset " + std::to_string(count_at) + ": truncated: sequence " +
        std::to_string(id) + " says " + std::to_string(count) + " records (" +
        std::to_string(static_cast<uint64_t>(count) * rec_bytes + 8) +
        " bytes with its hash), found " + std::to_string(c.remaining()) + " bytes (the file ends)");
  }
  TraceSequence seq;
  seq.id = id;
  seq.records.resize(count);
  for (uint32_t i = 0; i < count; ++i)
    decode_record(c.skip(rec_bytes, "a record"), h, seq.records[i]);
  const size_t hash_at = c.pos();
  const uint64_t stored = c.read<uint64_t>("the sequence hash");
  const uint64_t computed = fnv1a(c.at(start), hash_at - start);
  if (stored != computed) {
    c.fail(hash_at, "sequence " + std::to_string(id) + " (starting at offset " +
                        std::to_string(start) + ") is damaged: hash expected " + hex(computed) +
                        ", found " + hex(stored));
  }
  check_record_ids(c, h, seq, hash_at, rec_bytes);
  return seq;
}

}  // namespace

TraceFile parse_trace(const uint8_t* data, size_t size, const std::string& name,
                      const TraceReadOptions& options, size_t* valid_bytes) {
  ByteReader c(data, size, name);
  TraceFile tf;
  tf.header = parse_header(c);
  if (valid_bytes) *valid_bytes = c.pos();
  const size_t rec_bytes = trace_record_bytes(tf.header);
  while (c.remaining() > 0) {
    try {
      tf.sequences.push_back(read_sequence(c, tf.header, name, rec_bytes));
      if (valid_bytes) *valid_bytes = c.pos();
    } catch (const TruncatedInput&) {
      // A sequence that runs past the end is a half-written tail; anything else is damage.
      if (options.allow_truncated_tail) break;
      throw;
    }
  }
  return tf;
}

TraceFile read_trace(const std::string& path, const TraceReadOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read trace file " + path);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
  return parse_trace(bytes.data(), bytes.size(), path, options);
}

// ---- TraceWriter ----

TraceWriter::TraceWriter(const std::string& path, const TraceHeader& header, bool resume)
    : path_(path), header_(header) {
  namespace fs = std::filesystem;
  if (resume && fs::exists(path) && fs::file_size(path) > 0) {
    std::ifstream in(path, std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
    size_t valid = 0;
    TraceReadOptions ro;
    ro.allow_truncated_tail = true;
    const TraceFile old = parse_trace(bytes.data(), bytes.size(), path, ro, &valid);
    auto differs = [&](const char* field, const std::string& file_v, const std::string& want) {
      throw Error(path + ": cannot resume: the file's " + field + " is " + file_v +
                  ", this collection's is " + want + " (use another --out)");
    };
    if (old.header.n_embd != header.n_embd)
      differs("n_embd", std::to_string(old.header.n_embd), std::to_string(header.n_embd));
    if (old.header.top_k != header.top_k)
      differs("top_k", std::to_string(old.header.top_k), std::to_string(header.top_k));
    if (old.header.vocab_fingerprint != header.vocab_fingerprint)
      differs("vocabulary fingerprint", hex(old.header.vocab_fingerprint),
              hex(header.vocab_fingerprint));
    for (const auto& s : old.sequences) present_.push_back(s.id);
    std::sort(present_.begin(), present_.end());
    cut_bytes_ = bytes.size() - valid;
    if (cut_bytes_) fs::resize_file(path, valid);
    f_ = std::fopen(path.c_str(), "ab");
    if (!f_) throw Error("cannot append to trace file " + path);
    return;
  }
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) throw Error("cannot write trace file " + path);
  const auto head = encode_trace_header(header);
  if (std::fwrite(head.data(), 1, head.size(), f_) != head.size() || std::fflush(f_) != 0)
    throw Error("failed writing trace file " + path);
}

TraceWriter::~TraceWriter() {
  if (f_) std::fclose(f_);
}

bool TraceWriter::has(uint64_t id) const {
  return std::binary_search(present_.begin(), present_.end(), id);
}

void TraceWriter::append(const TraceSequence& seq) {
  const auto bytes = encode_trace_sequence(header_, seq);
  if (std::fwrite(bytes.data(), 1, bytes.size(), f_) != bytes.size() || std::fflush(f_) != 0)
    throw Error("failed writing trace file " + path_);
  present_.insert(std::upper_bound(present_.begin(), present_.end(), seq.id), seq.id);
}

}  // namespace tandem::router
