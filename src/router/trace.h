// Router traces: what `tandem router collect` records per position for `tandem router train`.
// Format version 2 (this build writes it and reads 1 and 2), little-endian, documented in
// docs/router.md:
//
//   file header   "TNDMTRACE\0\0\0" (12 bytes), u32 version, u32 n_embd, u32 top_k,
//                 u32 n_vocab, u64 vocab fingerprint, u32 flags, u32 name length, name bytes
//                 (the edge model's general.name, at most 4096)
//   sequences     repeated until the end of the file:
//     u32 "SEQ1" tag, u64 sequence id, u32 record count, then count records of
//     record_bytes() each, then u64 FNV-1a hash of the sequence's bytes from the tag on
//   record        i32 position, i32 edge top-1, i32 true next token (-1: none), i32 cloud top-1,
//                 f32 cloud log p(edge top-1), f32 cloud log p(true), f32 edge log p(true),
//                 f32 entropy, f32 margin, f32 KL(cloud || edge) of the next-token
//                 distributions, f32 outcome (version 2 only; NaN: not measured), u32 flags,
//                 f32 edge log top-k probs[top_k], f32 hidden[n_embd]
//
// Sequences are whole units: splits for training go by sequence, and a resumed collection
// appends whole sequences after cutting a half-written tail.
#pragma once

#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace tandem::router {

inline constexpr uint32_t kTraceVersion = 2;

struct TraceHeader {
  uint32_t version = kTraceVersion;
  uint32_t n_embd = 0, top_k = 8, n_vocab = 0;
  uint64_t vocab_fingerprint = 0;
  uint32_t flags = 0;  // reserved, 0
  std::string model_name;
  bool operator==(const TraceHeader&) const = default;
};

// Record flag: the cloud's log-probability of the edge token is an upper bound (the cloud
// reported only its top-n and the edge token was not among them; the value is the n-th's).
inline constexpr uint32_t kCloudEdgeLogprobIsBound = 1;
// Record flag: the KL divergence sums over the cloud's top-n tokens only (HTTP), a lower bound.
inline constexpr uint32_t kKlOverCloudTopN = 2;

struct TraceRecord {
  int32_t position = 0;
  int32_t edge_top1 = 0, true_token = -1, cloud_top1 = 0;
  float cloud_lp_edge = 0, cloud_lp_true = 0, edge_lp_true = 0;
  float entropy = 0, margin = 0;
  float kl_cloud_edge = 0;  // Σ_x p_cloud(x) (log p_cloud(x) − log p_edge(x)), nats
  // The outcome of routing this position (collect --outcome-share): how much closer to the
  // cloud-only continuation the edge's greedy continuation gets when this one token is the
  // cloud's instead of its own, in [-1, 1] (0 where the two top-1s agree); NaN: not measured
  // (and always in version 1 files).
  float outcome = std::numeric_limits<float>::quiet_NaN();
  uint32_t flags = 0;
  std::vector<float> log_top;  // [top_k]
  std::vector<float> hidden;   // [n_embd]
};

struct TraceSequence {
  uint64_t id = 0;
  std::vector<TraceRecord> records;
};

size_t trace_record_bytes(const TraceHeader& h);

// Appends sequences to a trace file. Opening an existing file checks that its header equals
// `header` (else throws naming the field) and, when `resume` is set, cuts a half-written last
// sequence and remembers the ids present; without `resume` an existing file is replaced.
class TraceWriter {
 public:
  TraceWriter(const std::string& path, const TraceHeader& header, bool resume);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;
  bool has(uint64_t id) const;
  size_t n_present() const { return present_.size(); }
  size_t cut_bytes() const { return cut_bytes_; }
  // Writes one whole sequence and flushes it.
  void append(const TraceSequence& seq);

 private:
  std::string path_;
  TraceHeader header_;
  std::FILE* f_ = nullptr;
  std::vector<uint64_t> present_;
  size_t cut_bytes_ = 0;
};

struct TraceFile {
  TraceHeader header;
  std::vector<TraceSequence> sequences;
  size_t n_records() const;
};

struct TraceReadOptions {
  // Stop quietly before a half-written last sequence instead of throwing (resume).
  bool allow_truncated_tail = false;
};

// Reads a whole trace; throws tandem::Error naming the file, byte offset, field, expected and
// found for anything damaged.
TraceFile read_trace(const std::string& path, const TraceReadOptions& options = {});
// The same over bytes in memory (fuzzing, tests); `name` appears in errors. `valid_bytes`, when
// given, receives the length of the well-formed prefix (header plus whole sequences).
TraceFile parse_trace(const uint8_t* data, size_t size, const std::string& name,
                      const TraceReadOptions& options = {}, size_t* valid_bytes = nullptr);
std::vector<uint8_t> encode_trace_header(const TraceHeader& h);
std::vector<uint8_t> encode_trace_sequence(const TraceHeader& h, const TraceSequence& seq);

}  // namespace tandem::router
