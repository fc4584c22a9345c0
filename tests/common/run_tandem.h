// Runs the tandem binary (TANDEM_BINARY, defined by the test target) as a child process with its
// stdout and stderr captured in files under `dir`; for tests that drive the CLI end to end.
#pragma once

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/testdata.h"

namespace tandem::testing {

struct Ran {
  int rc = -1;     // the exit status; -1 when the child did not exit (a signal ended it)
  int signal = 0;  // the signal that ended the child, 0 when it exited
  // The child's peak resident set (ru_maxrss, KiB). Linux counts from the fork, so it is at
  // least the test process's resident set at that moment: compare runs forked from one process.
  long max_rss_kib = 0;
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
  rusage usage{};
  wait4(pid, &status, 0, &usage);
  Ran r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  r.max_rss_kib = usage.ru_maxrss;
  r.out = read_file(out.string());
  r.err = read_file(err.string());
  return r;
}

}  // namespace tandem::testing
