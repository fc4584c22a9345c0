// -m,--model and --pair, as every command that loads a model takes them: -m names a GGUF file;
// without it, --pair NAME picks that known pair's model for the command's role (the device's
// model, or the cloud's for serve), and without either the default pair's (tandem/default_model.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "tandem/default_model.h"

namespace tandem::cli {

struct ModelFlag {
  std::string path;  // -m
  std::string pair;  // --pair

  // `what` describes the file ("Small (edge) GGUF model"); --help adds the default.
  void add_to(CLI::App& sub, ModelRole role, const std::string& what);
  // The file to load: -m, else --pair's model, else default_model_path(role). Throws
  // tandem::Error for an unknown pair.
  std::string resolve(ModelRole role) const;
};

}  // namespace tandem::cli
