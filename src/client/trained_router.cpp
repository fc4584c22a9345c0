// load_trained_router: a router file into EdgeOptions, for every command alike.
#include "router/router_file.h"
#include "tandem/client.h"
#include "tandem/router_mlp.h"

namespace tandem {

TrainedRouterInfo load_trained_router(const std::string& path, const Model& edge_model,
                                      const std::string& edge_path, std::optional<double> threshold,
                                      EdgeOptions& options) {
  router::RouterExpectations expect;
  expect.vocab_hash = edge_model.info().vocab_hash;
  expect.n_vocab = static_cast<uint32_t>(edge_model.info().n_vocab);
  expect.n_embd = edge_model.info().n_embd;
  expect.edge_path = edge_path;
  const router::LoadedRouter loaded = router::load_router(path, expect);
  RouterConfig& r = options.router;
  r.policy = RouterPolicy::Mlp;
  r.mlp = loaded.model;
  r.threshold = threshold ? *threshold : loaded.model->threshold_for_share(0.07);
  if (r.target_rate) r.prior_scores = loaded.model->prior_scores(r.window);
  options.signal_hidden = true;
  options.top_k_signal = std::max(options.top_k_signal, loaded.model->spec.top_k);
  return {loaded.info.label, loaded.info.vocab_hash, loaded.info.edge_name,
          loaded.info.training_json};
}

}  // namespace tandem
