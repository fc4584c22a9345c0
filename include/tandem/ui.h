// The browser view's entry for the CLI (`tandem ui`), so that it includes no header of src/ui:
// the options, the page's defaults and limits, the headers every answer carries, and the server
// that answers the page's requests on an HTTP server (tandem/http_server.h) and runs the edge
// decoder for it. Its routes and rules are described in src/ui/ui_server.h.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

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
  // The turns, the worker and the decoder live in ui_server.cpp: their JSON events and threads
  // are none of the caller's business.
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::ui
