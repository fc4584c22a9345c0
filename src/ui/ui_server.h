// The server behind `tandem ui`: serves the embedded page and runs the edge decoder for it.
//
//   GET  /, /ui.css, /ui.js          the page (embedded at build time)
//   GET  /api/info                   model, cloud, defaults, limits, whether a turn is running
//   POST /api/generate               {"prompt", "mode", "policy", "threshold" | "target_rate",
//                                     "n_predict", "temp", "continue", "chat"} -> server-sent
//                                     events: start, token..., done (or error); 400 names a bad
//                                     field, 409 while another turn runs (one at a time per
//                                     process)
//   POST /api/stop                   stops the running turn at its next token
//   GET  /api/turns                  every kept turn with its events (a reloaded page redraws)
//   GET  /api/turns/ID/events?after=N  the turn's events after the N-th, then live ones
//
// Every route first checks that the request comes from this server's own page (see
// request_refusal: a loopback Host with the UI's port, an allowed Origin, a JSON POST) and
// answers 403 otherwise; every answer carries a Content-Security-Policy and the headers that
// keep the page out of frames and sniffers (security_headers()).
//
// One worker thread decodes; the HTTP threads only parse, queue and copy events to the streams.
// A turn goes on when its browser goes away, and a reconnecting page picks it up again.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/http_server.h"
#include "tandem/ui.h"  // UiLimits, GenerateRequest, UiOptions, UiServer

namespace tandem::ui {

// A request field that is missing, of the wrong type or out of range: answered 400 with the
// field's name.
class RequestError : public std::invalid_argument {
 public:
  RequestError(std::string field, std::string problem)
      : std::invalid_argument(field + ": " + problem),
        field_(std::move(field)),
        problem_(std::move(problem)) {}
  const std::string& field() const { return field_; }
  const std::string& problem() const { return problem_; }  // what() without the field

 private:
  std::string field_, problem_;
};

// Parses and checks a POST /api/generate body. Throws RequestError naming the field.
GenerateRequest parse_generate_request(std::string_view body, const GenerateRequest& defaults,
                                       const UiLimits& limits);

// The hosts a request may name (Host header; Origin after "http://"): the loopback names with
// the UI's port -- "127.0.0.1:PORT", "localhost:PORT", "[::1]:PORT" -- and, for a UI bound to
// another literal IP address (--host), that address with the port. The bare names are allowed
// only on port 80, where browsers leave the port out. A name is what a DNS-rebinding page cannot
// fake: its requests carry the attacker's own host name.
std::vector<std::string> allowed_hosts(int port, const std::string& bind_host = "127.0.0.1");

// Why a request is refused as possibly sent by another site's page (empty: accepted):
// - Host must be one of `hosts` (case-insensitive), on every route;
// - an Origin, when sent, must be "http://" + one of `hosts`;
// - a POST must send such an Origin (browsers always do) and Content-Type: application/json
//   (a JSON POST makes a browser ask first, with a CORS preflight this server never allows).
std::string request_refusal(const net::HttpRequest& request, const std::vector<std::string>& hosts);

// One server-sent event: "id: ID\nevent: TYPE\ndata: JSON\n\n".
std::string sse_event(std::string_view type, uint64_t id, const nlohmann::json& data);

}  // namespace tandem::ui
