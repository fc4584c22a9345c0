// The browser view's entry for the CLI (`tandem ui`), so that it includes no header of src/ui:
// the options, the page's defaults and limits, the headers every answer carries, and the server
// that answers the page's requests on an HTTP server (tandem/http_server.h) and runs the edge
// decoder for it. Its routes and rules are described in src/ui/ui_server.h.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tandem/client.h"
#include "tandem/engine.h"
#include "tandem/http_server.h"
#include "tandem/routing.h"

namespace tandem::ui {

struct UiLimits {
  int max_predict = 1024;
  size_t max_prompt_bytes = 32 * 1024;
  int max_json_depth = 8;  // a generate request nests 1 deep
  size_t kept_turns = 32;  // turns /api/turns keeps for a reloaded page
};

// What a page asks for; fields it leaves out take the command line's values.
struct GenerateRequest {
  std::string prompt;
  EdgeMode mode = EdgeMode::Route;
  RoutingSpec routing;  // as asked: the command line's, changed by the page's fields
  RouterConfig router;  // resolve_routing(routing), by the UiServer
  int n_predict = 64;
  float temp = 0;
  bool continue_conversation = false;
  bool chat = false;  // the prompt is a user turn in the model's chat template
};

// The headers every answer carries: a Content-Security-Policy that allows only the page's own
// files (no inline script or style, no frames, no plugins, no <base>), X-Frame-Options: DENY,
// X-Content-Type-Options: nosniff and Referrer-Policy: no-referrer.
const net::HeaderList& security_headers();

struct UiOptions {
  EdgeOptions edge;  // mode, router and temperature are replaced per request
  GenerateRequest defaults;
  UiLimits limits;
  std::string model_name, cloud_url, cloud_api;
  std::string model_path;  // the edge model's file (a trained router is checked against it)
  std::string system;      // the system message of a chat's first turn (empty: none)
  // Where the page is served: the allowed Host and Origin values follow from these (set_address
  // replaces them once the listening port is known, e.g. with --port 0).
  std::string bind_host = "127.0.0.1";
  int port = 0;
};

class UiServer {
 public:
  // Makes a fresh cloud backend for a new decoder (null: no cloud, decode locally).
  using BackendFactory = std::function<std::unique_ptr<CloudBackend>()>;

  UiServer(const Model& edge_model, UiOptions options, BackendFactory make_backend);
  ~UiServer();  // stops a running turn and joins the worker
  UiServer(const UiServer&) = delete;
  UiServer& operator=(const UiServer&) = delete;

  // The address the HTTP server listens on (call before it serves requests); until then the
  // options' bind_host and port are used.
  void set_address(const std::string& bind_host, int port);

  void handle(const net::HttpRequest& request, std::shared_ptr<net::Responder> responder);

 private:
  void route(const net::HttpRequest& request, const std::shared_ptr<net::Responder>& responder);
  struct Turn {
    uint64_t id = 0;
    GenerateRequest request;
    std::vector<nlohmann::json> events;  // each {"type", ...}; the last of a finished turn is
                                         // "done" or "error"
    bool finished = false;
    std::vector<std::shared_ptr<net::Responder>> streams;
  };

  void serve_asset(const net::HttpRequest& request, net::Responder& responder) const;
  void start_turn(const net::HttpRequest& request,
                  const std::shared_ptr<net::Responder>& responder);
  void attach(uint64_t turn_id, size_t after, const std::shared_ptr<net::Responder>& responder);
  nlohmann::json info() const;
  nlohmann::json turns_json() const;

  void worker_loop();
  void run_turn(Turn& turn);
  std::vector<TokenId> turn_context(const GenerateRequest& request) const;
  // Makes the decoder for the request's settings, reusing the last one when they are the same
  // (its cloud session and target-rate controller carry over). Returns the cloud line.
  std::string prepare_decoder(const GenerateRequest& request);
  // resolve_routing of `spec` over the command line's options; throws tandem::Error.
  RouterConfig resolved_router(const RoutingSpec& spec) const;
  void publish(Turn& turn, nlohmann::json event);

  const Model& model_;
  UiOptions options_;
  std::vector<std::string> hosts_;  // allowed_hosts(), set before requests are served
  BackendFactory make_backend_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Turn>> turns_;  // oldest first, at most limits.kept_turns
  std::shared_ptr<Turn> pending_;            // queued for the worker
  bool busy_ = false;                        // a turn is queued or running
  bool quit_ = false;
  uint64_t next_turn_id_ = 1;
  std::atomic<bool> stop_requested_{false};

  // Worker thread only.
  std::unique_ptr<EdgeDecoder> decoder_;
  std::string decoder_key_, cloud_line_;
  std::vector<TokenId> conversation_;

  std::thread worker_;
};

}  // namespace tandem::ui
