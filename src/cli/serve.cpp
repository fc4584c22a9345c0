// tandem serve: being built (issues 9 and 10); until then it says so.
#include "cli/commands.h"
#include "common/error.h"

namespace tandem::cli {
namespace {
class ServeCommand : public Command {
 public:
  explicit ServeCommand(CLI::App& app) : Command(app.add_subcommand("serve", "(not built yet)")) {}
  int run() override { throw Error("tandem serve is not built yet"); }
};
}  // namespace
std::unique_ptr<Command> make_serve_command(CLI::App& app) {
  return std::make_unique<ServeCommand>(app);
}
}  // namespace tandem::cli
