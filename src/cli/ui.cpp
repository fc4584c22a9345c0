// tandem ui: a browser view of routing. Serves a page (embedded in the binary) on 127.0.0.1 that
// sends prompts to the edge decoder of `tandem run` (same flags) and shows the answer streaming
// token by token, cloud tokens marked, with the router's scores and live stats.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <utility>

#include "cli/commands.h"
#include "cli/edge_flags.h"
#include "tandem/engine.h"
#include "tandem/error.h"
#include "tandem/http_server.h"
#include "tandem/ui.h"

namespace tandem::cli {
namespace {

constexpr double kUiDefaultTargetRate = 0.07;

class UiCommand : public Command {
 public:
  explicit UiCommand(CLI::App& app)
      : Command(app.add_subcommand(
            "ui",
            "A browser view of routing: a page on 127.0.0.1 that streams each answer token "
            "by token, cloud tokens marked, with router scores and live stats")) {
    flags_.edge.options.sampling.temp = 0;  // greedy unless --temp says otherwise
    flags_.add_to(*sub_);
    http_.port = 8090;  // next to tandem serve's 8080, so both run with their defaults
    sub_->add_option("--host", http_.host,
                     "Address to bind (loopback by default: the page has no authentication)")
        ->capture_default_str();
    sub_->add_option("--port", http_.port, "Port (0: any free port, printed on stderr)")
        ->check(CLI::Range(0, 65535))
        ->capture_default_str();
    sub_->add_flag("--chat", chat_,
                   "Prompts are user turns in the model's chat template (an instruct model, such "
                   "as the default pair's); the page can switch it per prompt");
    sub_->add_option("--system", system_, "System message of a chat's first turn");
    sub_->add_option("--max-predict", limits_.max_predict, "Tokens one answer may ask for at most")
        ->check(CLI::Range(1, 8192))
        ->capture_default_str();
  }

  int run() override {
    http_.max_body_bytes = 64 * 1024;
    http_.own_answer_headers = ui::security_headers();
    // The page opens at the paper's operating point: a 7% cloud share (a fixed threshold routes
    // far more than that on a base model's answers), greedy (set before the flags, above).
    const std::string& policy = flags_.edge.policy;
    const bool scored = policy.empty() || policy == "confidence" || policy == "entropy" ||
                        policy == "margin";  // not random, always or never
    if (scored && sub_->count("--threshold") == 0 && sub_->count("--target-rate") == 0)
      flags_.edge.target_rate = kUiDefaultTargetRate;
    flags_.resolve();
    auto model = Model::load(flags_.edge.model);
    flags_.load_router(*model);
    if (flags_.edge.options.mode != EdgeMode::Local || !flags_.cloud.options.url.empty()) {
      // Fail on a bad URL now rather than on the first request.
      (void)flags_.make_backend(*model);
    }

    ui::UiOptions o;
    o.edge = flags_.edge.options;
    o.limits = limits_;
    o.defaults.mode = flags_.edge.options.mode;
    o.defaults.routing =
        flags_.edge.routing();  // with the shipped router, when load_router chose it
    o.model_path = flags_.edge.model;
    o.defaults.temp = flags_.edge.options.sampling.temp;
    o.defaults.n_predict =
        std::clamp(flags_.edge.n_predict < 0 ? 128 : flags_.edge.n_predict, 1, limits_.max_predict);
    o.defaults.chat = chat_;
    o.system = system_;
    o.model_name = std::filesystem::path(flags_.edge.model).filename().string();
    o.cloud_url = flags_.cloud.options.url;
    o.cloud_api = flags_.cloud.options.api;
    const CloudOptions& cloud = flags_.cloud.options;
    const Model& small = *model;
    auto ui = std::make_unique<ui::UiServer>(small, o,
                                             [&cloud, &small]() -> std::unique_ptr<CloudBackend> {
                                               if (cloud.url.empty()) return nullptr;
                                               return make_cloud_backend(cloud, small);
                                             });
    http_.io_threads = 2;
    net::HttpServer http(http_,
                         [&ui](const net::HttpRequest& req, std::shared_ptr<net::Responder> res) {
                           ui->handle(req, std::move(res));
                         });
    http.start();
    ui->set_address(http_.host, http.port());  // the Host/Origin allowlist needs the bound port
    std::fprintf(stderr, "tandem ui: open http://%s:%d/ (edge %s, cloud %s)\n", http_.host.c_str(),
                 http.port(), o.model_name.c_str(),
                 o.cloud_url.empty() ? "none: local only" : o.cloud_url.c_str());
    std::fflush(stderr);

    http.on_stop_signal([&http](int) {
      std::fprintf(stderr, "tandem ui: stopping\n");
      http.stop_accepting();
      http.stop();
    });
    http.wait();
    // The UI server goes before the HTTP server: its open streams hold connections, which live
    // on the server's I/O loop.
    ui.reset();
    return 0;
  }

 private:
  DeviceFlags flags_;
  net::HttpServerOptions http_;
  ui::UiLimits limits_;
  bool chat_ = false;
  std::string system_;
};

}  // namespace

std::unique_ptr<Command> make_ui_command(CLI::App& app) {
  return std::make_unique<UiCommand>(app);
}

}  // namespace tandem::cli
