// The native session protocol's names (docs/protocol.md), written once for both of its sides:
// the device's NativeBackend (src/client/native_backend.cpp) writes the requests and reads the
// answers that the server's Api (src/server/api_native.cpp, api.cpp) reads and writes. A field
// renamed here is renamed on both sides; the prose of error messages keeps its words.
#pragma once

namespace tandem::protocol {

inline constexpr int kVersion = 1;  // the "protocol" a session is created with

inline constexpr char kInfoPath[] = "/tandem/v1/info";
inline constexpr char kSessionsPath[] = "/tandem/v1/sessions";
inline constexpr char kSessionPrefix[] = "/tandem/v1/sessions/";  // + id [+ kStep | kCancel]
inline constexpr char kStep[] = "/step";
inline constexpr char kCancel[] = "/cancel";

// Additions to protocol 1 a server lists under "features" and a client uses only when listed.
inline constexpr char kFeatureRewind[] = "rewind";             // a step's rewind_to
inline constexpr char kFeatureQueue[] = "queue";               // a step waits behind another
inline constexpr char kFeatureHistoryHash[] = "history_hash";  // a step's expected_hash
inline constexpr char kFeatureCancel[] = "cancel";             // POST {sessions}/{id}/cancel

// Creating a session: the request's version; the answer's id, model and limits.
inline constexpr char kProtocol[] = "protocol";
inline constexpr char kSession[] = "session";
inline constexpr char kFeatures[] = "features";
inline constexpr char kModel[] = "model";
inline constexpr char kLimits[] = "limits";

// A step: {expected_pos, expected_hash?, rewind_to?, append, generate | verify, top_n?, queue?}.
inline constexpr char kExpectedPos[] = "expected_pos";
inline constexpr char kExpectedHash[] = "expected_hash";
inline constexpr char kRewindTo[] = "rewind_to";
inline constexpr char kAppend[] = "append";
inline constexpr char kGenerate[] = "generate";  // {n, temperature, top_k, top_p, min_p, seed?}
inline constexpr char kVerify[] = "verify";      // {draft}
inline constexpr char kDraft[] = "draft";
inline constexpr char kN[] = "n";
inline constexpr char kQueue[] = "queue";
inline constexpr char kTopN[] = "top_n";

// A step's answer: {pos, tokens, logprobs, prefilled, stop, accepted?, top?}; errors carry pos.
inline constexpr char kPos[] = "pos";
inline constexpr char kTokens[] = "tokens";
inline constexpr char kLogprobs[] = "logprobs";
inline constexpr char kPrefilled[] = "prefilled";
inline constexpr char kStop[] = "stop";
inline constexpr char kAccepted[] = "accepted";

// A cancel: {from_pos}; its answer {cancelled, pos}, where cancelled counts the steps stopped.
inline constexpr char kFromPos[] = "from_pos";
inline constexpr char kCancelled[] = "cancelled";  // also the code of a cancelled step's 409

// Error codes a device acts on.
inline constexpr char kHistoryMismatch[] = "history_mismatch";
inline constexpr char kSessionBusy[] = "session_busy";

}  // namespace tandem::protocol
