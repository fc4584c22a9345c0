// tandem run: being built (issues 9 and 10); until then it says so.
#include "cli/commands.h"
#include "common/error.h"

namespace tandem::cli {
namespace {
class RunCommand : public Command {
 public:
  explicit RunCommand(CLI::App& app) : Command(app.add_subcommand("run", "(not built yet)")) {}
  int run() override { throw Error("tandem run is not built yet"); }
};
}  // namespace
std::unique_ptr<Command> make_run_command(CLI::App& app) {
  return std::make_unique<RunCommand>(app);
}
}  // namespace tandem::cli
