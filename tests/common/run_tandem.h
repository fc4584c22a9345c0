// Runs the tandem binary (TANDEM_BINARY, defined by the test target) as a child process with its
// stdout and stderr captured in files under `dir`; for tests that drive the CLI end to end.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/testdata.h"

namespace tandem::testing {

struct Ran {
  int rc = -1;
  std::string out, err;
};

inline Ran run_tandem(const std::vector<std::string>& args, const std::filesystem::path& dir) {
  const std::filesystem::path out = dir / "stdout.txt", err = dir / "stderr.txt";
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<std::string> all = {TANDEM_BINARY};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int fo = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int fe = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fo, STDOUT_FILENO);
    dup2(fe, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  Ran r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out.string());
  r.err = read_file(err.string());
  return r;
}

}  // namespace tandem::testing
