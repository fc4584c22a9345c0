// A sandbox for running model-written Python (HumanEval, docs/eval.md): one program, one fresh
// scratch folder, one process tree that is gone when run_python returns.
//
// The program runs as `python3 -I -S -B main.py` in its scratch folder (mkdtemp, removed
// afterwards whatever happened), with stdin /dev/null, stdout and stderr captured up to a bound,
// every other inherited descriptor closed and an environment of PATH, HOME (the scratch folder),
// TMPDIR and LANG only. Limits (setrlimit): CPU time, address space, file size, processes, no
// core files. The parent kills the whole process group at the wall-clock deadline and again
// when the program exits, so no grandchild outlives it.
//
// Isolation, each part where the kernel allows it (Result::isolation says which applied):
//   userns, pidns, netns, mountns  clone() into new namespaces: no network but an unconfigured
//                                  loopback; the program is PID 1 of its own PID namespace, so
//                                  the kernel kills every process it started when it exits;
//                                  the root is remounted read-only (recursively) with only the
//                                  scratch folder writable ("readonly-root");
//   uid                            the program runs as an unprivileged uid (nobody when tandem
//                                  runs as root; the caller's own uid otherwise), so the process
//                                  limit bites and no capability is left;
//   landlock-fs, landlock-tcp      Landlock: writes only beneath the scratch folder; no TCP
//                                  connect or bind (kernel ABI 4+).
// Without namespaces (a container that forbids them) Landlock alone keeps writes in the folder;
// a kernel with neither leaves the program able to write wherever its uid may.
//
// Public (owned by src/eval), for `tandem eval --task humaneval --allow-exec`.
#pragma once

#include <cstdint>
#include <string>

namespace tandem::eval {

struct SandboxLimits {
  double wall_s = 15;                  // killed (the whole group) at this deadline
  int cpu_s = 10;                      // RLIMIT_CPU: SIGKILL after this much CPU time
  uint64_t memory_bytes = 1ull << 30;  // RLIMIT_AS: 1 GiB; a 4 GB allocation fails
  uint64_t file_bytes = 16ull << 20;   // RLIMIT_FSIZE: no file written beyond 16 MiB
  int processes = 16;                  // RLIMIT_NPROC of the program's uid
  size_t capture_bytes = 64 << 10;     // stdout's first and stderr's last bytes kept
  bool namespaces = true;              // false: skip the namespaces (tests of the fallback)
};

// How a program ended: "passed" (exit status 0), "failed" (another exit status), "timeout"
// (killed at the wall-clock deadline or by the CPU limit), "killed" (another signal).
struct SandboxResult {
  std::string verdict;
  int exit_status = -1;    // when it exited
  int signal = 0;          // when a signal ended it
  bool timed_out = false;  // the wall-clock deadline or the CPU limit ended it
  double wall_ms = 0, cpu_ms = 0;
  std::string stdout_head, stderr_tail;         // at most capture_bytes each
  uint64_t stdout_bytes = 0, stderr_bytes = 0;  // all that was written, kept or not
  std::string
      isolation;  // what applied, '+'-joined: "userns+pidns+netns+mountns+readonly-root+..."
  int pid = 0;    // the program's pid (= its process group) in tandem's namespace
  bool passed() const { return verdict == "passed"; }
};

// Runs `program` (Python source) in the sandbox. Throws tandem::Error when the sandbox cannot be
// set up: no python3 on PATH, no scratch folder, fork or exec failing. What the program does,
// it does inside: any way it ends is a result.
SandboxResult run_python(const std::string& program, const SandboxLimits& limits = {});

// The interpreter run_python uses: python3 found on PATH, resolved to the real executable
// (sys.executable: a pyenv shim would need a shell and an environment). Throws tandem::Error
// when there is none.
std::string python_executable();

}  // namespace tandem::eval
