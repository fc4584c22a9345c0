// The sandbox for model-written Python (tandem/sandbox.h). The parent prepares everything the
// child needs (argv, environment, id maps, the Landlock ruleset) before it clones, because the
// child of a multi-threaded process may only make system calls until it execs: it allocates
// nothing and calls glibc only for thin system-call wrappers (ids through raw syscalls, as
// glibc's set*id would wait for threads that the child does not have).
#include "tandem/sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "common/error.h"

namespace tandem::eval {

namespace fs = std::filesystem;

namespace {

// Landlock's ABI (linux/landlock.h, spelled out: Debian 12's headers stop at ABI 3).
constexpr uint32_t kLandlockVersion = 1u << 0;  // landlock_create_ruleset flag
constexpr uint64_t kFsWriteFile = 1ull << 1;
constexpr uint64_t kFsWriteAbi1 = kFsWriteFile | (0x1FFull << 4);  // and REMOVE_DIR .. MAKE_SYM
constexpr uint64_t kFsRefer = 1ull << 13, kFsTruncate = 1ull << 14;
constexpr uint64_t kNetBindConnectTcp = 3;   // BIND_TCP | CONNECT_TCP (ABI 4)
constexpr uint64_t kScopeUnixAndSignal = 3;  // ABSTRACT_UNIX_SOCKET | SIGNAL (ABI 6)
constexpr uint32_t kRulePathBeneath = 1;
struct LandlockRuleset {
  uint64_t handled_access_fs = 0, handled_access_net = 0, scoped = 0;
};
struct __attribute__((packed)) LandlockPathBeneath {
  uint64_t allowed_access;
  int32_t parent_fd;
};

// mount_setattr(2) (linux/mount.h).
struct MountAttr {
  uint64_t attr_set = 0, attr_clr = 0, propagation = 0, userns_fd = 0;
};
constexpr uint64_t kMountAttrRdonly = 1;
constexpr unsigned kAtRecursive = 0x8000;

// What applied, as bits the child reports and Result::isolation spells.
enum Applied : uint32_t {
  kUserNs = 1 << 0,
  kPidNs = 1 << 1,
  kNetNs = 1 << 2,
  kMountNs = 1 << 3,
  kReadonlyRoot = 1 << 4,
  kUid = 1 << 5,
  kLandlockFs = 1 << 6,
  kLandlockTcp = 1 << 7,
  kLandlockScope = 1 << 8,
};
constexpr const char* kAppliedNames[] = {"userns",      "pidns",         "netns",
                                         "mountns",     "readonly-root", "uid",
                                         "landlock-fs", "landlock-tcp",  "landlock-scope"};

std::string isolation_name(uint32_t applied) {
  std::string out;
  for (size_t i = 0; i < std::size(kAppliedNames); ++i) {
    if (!(applied & (1u << i))) continue;
    if (!out.empty()) out += '+';
    out += kAppliedNames[i];
  }
  return out.empty() ? "none" : out;
}

// The child's report through a close-on-exec pipe: what applied, written just before exec, and
// on a failure the stage and errno (then it exits 127). EOF after the first report: exec worked.
enum Stage : int32_t { kStageNone, kStageIdMap, kStageIds, kStageDir, kStageLimits, kStageExec };
constexpr const char* kStageNames[] = {"",
                                       "waiting for its uid map",
                                       "changing uid",
                                       "entering its scratch folder",
                                       "setting limits",
                                       "exec"};
struct ChildReport {
  uint32_t applied = 0;
  int32_t stage = kStageNone, err = 0;
};

// Everything the child uses, prepared by the parent.
struct ChildPlan {
  const char* python = nullptr;
  std::vector<char*> argv, envp;  // null-terminated
  const char* scratch = nullptr;
  int devnull = -1, out_w = -1, err_w = -1, status_w = -1, sync_r = -1, landlock = -1;
  uint32_t landlock_bits = 0;  // what the ruleset restricts, when restrict_self works
  bool namespaces = false;     // in new namespaces: wait for the parent's id maps, then mount
  bool set_ids = false, clear_groups = false;
  uid_t uid = 0;
  gid_t gid = 0;
  rlimit cpu{}, as{}, fsize{}, nproc{}, core{};
};

[[noreturn]] void child_fail(const ChildPlan& p, ChildReport rep, Stage stage) {
  rep.stage = stage;
  rep.err = errno;
  (void)!write(p.status_w, &rep, sizeof rep);
  _exit(127);
}

// Everything read-only but the scratch folder (bind-mounted onto itself, then made writable
// again): the mount namespace is the child's own, so nothing outside sees it.
bool make_root_readonly(const char* scratch) {
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return false;
  if (mount(scratch, scratch, nullptr, MS_BIND, nullptr) != 0) return false;
  MountAttr ro{.attr_set = kMountAttrRdonly};
  if (syscall(SYS_mount_setattr, AT_FDCWD, "/", kAtRecursive, &ro, sizeof ro) != 0) return false;
  MountAttr rw{.attr_clr = kMountAttrRdonly};
  return syscall(SYS_mount_setattr, AT_FDCWD, scratch, 0u, &rw, sizeof rw) == 0;
}

// Default dispositions and an empty mask: a child inherits ignored signals and the mask.
void reset_signals() {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) sigaction(s, &dfl, nullptr);  // fails harmlessly on some
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

// Marks every descriptor from 3 up close-on-exec (the status pipe already is).
void close_inherited_fds() {
  if (syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */) == 0) return;
  for (int fd = 3; fd < 65536; ++fd) fcntl(fd, F_SETFD, FD_CLOEXEC);
}

[[noreturn]] void child_main(const ChildPlan& p) {
  ChildReport rep;
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  reset_signals();
  if (p.namespaces) {
    char ok = 0;
    if (read(p.sync_r, &ok, 1) != 1 || ok != 1) child_fail(p, rep, kStageIdMap);
    if (make_root_readonly(p.scratch)) rep.applied |= kReadonlyRoot;
  }
  if (p.clear_groups && syscall(SYS_setgroups, 0, nullptr) != 0) child_fail(p, rep, kStageIds);
  if (p.set_ids) {
    if (syscall(SYS_setresgid, p.gid, p.gid, p.gid) != 0 ||
        syscall(SYS_setresuid, p.uid, p.uid, p.uid) != 0)
      child_fail(p, rep, kStageIds);
    rep.applied |= kUid;
  }
  if (chdir(p.scratch) != 0) child_fail(p, rep, kStageDir);
  // After the uid change: setresuid would otherwise flag the process as over RLIMIT_NPROC.
  if (setrlimit(RLIMIT_CPU, &p.cpu) != 0 || setrlimit(RLIMIT_AS, &p.as) != 0 ||
      setrlimit(RLIMIT_FSIZE, &p.fsize) != 0 || setrlimit(RLIMIT_NPROC, &p.nproc) != 0 ||
      setrlimit(RLIMIT_CORE, &p.core) != 0)
    child_fail(p, rep, kStageLimits);
  if (dup2(p.devnull, 0) < 0 || dup2(p.out_w, 1) < 0 || dup2(p.err_w, 2) < 0)
    child_fail(p, rep, kStageDir);
  prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  if (p.landlock >= 0 && syscall(SYS_landlock_restrict_self, p.landlock, 0u) == 0)
    rep.applied |= p.landlock_bits;
  close_inherited_fds();
  (void)!write(p.status_w, &rep, sizeof rep);
  execve(p.python, p.argv.data(), p.envp.data());
  child_fail(p, rep, kStageExec);
}

// A descriptor closed when it goes out of scope.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    reset();
    fd = std::exchange(o.fd, -1);
    return *this;
  }
  ~Fd() { reset(); }
  void reset() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
};

struct Pipe {
  Fd r, w;
};
Pipe make_pipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error(std::string("sandbox: pipe: ") + strerror(errno));
  return {Fd(fds[0]), Fd(fds[1])};
}

// The scratch folder: made for one program, removed with everything in it afterwards.
struct Scratch {
  std::string path;
  Scratch() {
    std::string tmpl = (fs::temp_directory_path() / "tandem-sandbox-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) {
      throw Error("sandbox: cannot make a scratch folder from " + tmpl + ": " + strerror(errno));
    }
    path = tmpl;
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// The uid and gid the program runs as outside any user namespace: nobody when tandem is root
// (so RLIMIT_NPROC counts, which root escapes, and no capability is left), else the caller's.
struct Ids {
  uid_t uid;
  gid_t gid;
};
Ids program_ids() {
  if (geteuid() == 0) return {65534, 65534};
  return {geteuid(), getegid()};
}
constexpr uid_t kInsideId = 1000;  // the program's uid and gid inside its user namespace

// The Landlock ruleset: no writes but beneath the scratch folder (and to /dev/null), no TCP,
// no abstract unix sockets or signals outside. -1 where the kernel has no Landlock.
Fd landlock_ruleset(const std::string& scratch, uint32_t& bits) {
  const long abi = syscall(SYS_landlock_create_ruleset, nullptr, 0, kLandlockVersion);
  bits = 0;
  if (abi < 1) return Fd();
  LandlockRuleset attr;
  attr.handled_access_fs = kFsWriteAbi1;
  if (abi >= 2) attr.handled_access_fs |= kFsRefer;
  if (abi >= 3) attr.handled_access_fs |= kFsTruncate;
  size_t size = sizeof(uint64_t);
  if (abi >= 4) attr.handled_access_net = kNetBindConnectTcp, size = 2 * sizeof(uint64_t);
  if (abi >= 6) attr.scoped = kScopeUnixAndSignal, size = sizeof attr;
  Fd rules(static_cast<int>(syscall(SYS_landlock_create_ruleset, &attr, size, 0u)));
  if (rules.fd < 0) return Fd();
  auto allow = [&](const char* path, uint64_t access) {
    Fd dir(open(path, O_PATH | O_CLOEXEC));
    LandlockPathBeneath rule{access, dir.fd};
    return dir.fd >= 0 &&
           syscall(SYS_landlock_add_rule, rules.fd, kRulePathBeneath, &rule, 0u) == 0;
  };
  if (!allow(scratch.c_str(), attr.handled_access_fs)) return Fd();
  allow("/dev/null", attr.handled_access_fs & (kFsWriteFile | kFsTruncate));
  bits = kLandlockFs;
  if (abi >= 4) bits |= kLandlockTcp;
  if (abi >= 6) bits |= kLandlockScope;
  return rules;
}

// Writes the child's uid and gid maps from outside (a user namespace's maps must be written by
// a process with the rights in the parent namespace): inside id kInsideId is `ids` outside.
bool write_id_maps(pid_t pid, const Ids& ids) {
  const std::string proc = "/proc/" + std::to_string(pid);
  auto put = [&](const std::string& file, const std::string& text) {
    std::ofstream f(proc + "/" + file);
    f << text;
    f.flush();
    return static_cast<bool>(f);
  };
  // Without root, a gid map needs setgroups denied first; root keeps it to clear the groups.
  if (geteuid() != 0 && !put("setgroups", "deny")) return false;
  return put("uid_map", std::to_string(kInsideId) + " " + std::to_string(ids.uid) + " 1\n") &&
         put("gid_map", std::to_string(kInsideId) + " " + std::to_string(ids.gid) + " 1\n");
}

// Bounded capture of one output stream: the first `cap` bytes (stdout: the start shows what
// ran) or the last (stderr: a traceback ends there); the rest is read and dropped.
struct Capture {
  std::string kept;
  uint64_t total = 0;
  size_t cap = 0;
  bool keep_tail = false;
  void add(const char* data, size_t n) {
    total += n;
    if (!keep_tail) {
      kept.append(data, std::min(n, cap - std::min(cap, kept.size())));
      return;
    }
    kept.append(data, n);
    if (kept.size() > 2 * cap) kept.erase(0, kept.size() - cap);
  }
  std::string result() const {
    return keep_tail && kept.size() > cap ? kept.substr(kept.size() - cap) : kept;
  }
};

// A started program: its pid (= its group), the parent's ends of its pipes.
struct Started {
  pid_t pid = -1;
  uint32_t applied = 0;  // the namespaces it was cloned into
  Fd out_r, err_r, status_r, sync_w;
};

// Clones (namespaces) or forks the child. Returns pid -1 when clone refused the namespaces.
Started start(ChildPlan& plan, bool namespaces) {
  Pipe out = make_pipe(), err = make_pipe(), status = make_pipe(), sync = make_pipe();
  plan.out_w = out.w.fd;
  plan.err_w = err.w.fd;
  plan.status_w = status.w.fd;
  plan.sync_r = sync.r.fd;
  plan.namespaces = namespaces;
  const Ids ids = program_ids();
  plan.set_ids = namespaces || geteuid() == 0;
  plan.clear_groups = geteuid() == 0;
  plan.uid = namespaces ? kInsideId : ids.uid;
  plan.gid = namespaces ? kInsideId : ids.gid;
  Started s;
  const unsigned long ns_flags = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS;
  // Like fork (no new stack: the child runs on its copy of this one), into new namespaces.
  s.pid = namespaces ? static_cast<pid_t>(syscall(SYS_clone, ns_flags | SIGCHLD, nullptr, nullptr,
                                                  nullptr, nullptr))
                     : fork();
  if (s.pid == 0) child_main(plan);
  if (s.pid < 0) {
    if (namespaces) return s;
    throw Error(std::string("sandbox: fork: ") + strerror(errno));
  }
  if (namespaces) s.applied = kUserNs | kPidNs | kNetNs | kMountNs;
  s.out_r = std::move(out.r);
  s.err_r = std::move(err.r);
  s.status_r = std::move(status.r);
  s.sync_w = std::move(sync.w);
  return s;
}

// Reads the child's reports until exec closes the pipe. Returns the last one.
ChildReport read_report(int fd) {
  ChildReport rep, got;
  rep.stage = kStageExec;  // nothing read: the child died before reporting
  while (true) {
    const ssize_t n = read(fd, &got, sizeof got);
    if (n == static_cast<ssize_t>(sizeof got)) {
      rep = got;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return rep;
  }
}

using Clock = std::chrono::steady_clock;

// Whether a process of group `pgid` is still running (a zombie is not: it is dead, waiting for
// its new parent to reap it). /proc/PID/stat: "PID (COMM) STATE PPID PGRP ...".
bool group_running(pid_t pgid) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "stat");
    std::string stat;
    std::getline(f, stat);
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(paren + 1));
    char state = 0;
    long ppid = 0, pgrp = 0;
    if (rest >> state >> ppid >> pgrp && pgrp == pgid && state != 'Z' && state != 'X') return true;
  }
  return false;
}

// Outside a PID namespace the group's other processes, killed, die on their own time: waits
// (at most 2 s) until none runs, so none outlives run_python.
void await_group_death(pid_t pgid) {
  for (int i = 0; i < 400 && group_running(pgid); ++i) {
    killpg(pgid, SIGKILL);
    usleep(5000);
  }
}

// Waits for the program, reading its output, until it exits or the deadline passes (then the
// group is killed). The group is killed again once the program has exited: a grandchild that
// kept running (outside a PID namespace) goes with it.
void supervise(Started& s, const SandboxLimits& lim, SandboxResult& r) {
  const auto t0 = Clock::now();
  const auto deadline =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(lim.wall_s));
  const auto give_up = deadline + std::chrono::seconds(1);  // for pipes an escapee holds open
  Fd pidfd(static_cast<int>(syscall(SYS_pidfd_open, s.pid, 0u)));
  Capture out, err;
  out.cap = err.cap = lim.capture_bytes;
  err.keep_tail = true;
  bool exited = false, killed = false;
  int status = 0;
  rusage ru{};
  std::vector<char> buf(1 << 16);
  while (!exited || s.out_r.fd >= 0 || s.err_r.fd >= 0) {
    const auto now = Clock::now();
    if (!killed && (exited || now >= deadline)) {
      r.timed_out = !exited;
      killpg(s.pid, SIGKILL);
      if (!exited) kill(s.pid, SIGKILL);
      killed = true;
    }
    if (killed && now >= give_up) break;
    const auto until = killed ? give_up : deadline;
    int wait_ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count() + 1);
    if (pidfd.fd < 0 && !exited) wait_ms = std::min(wait_ms, 50);  // no pidfd: check often
    pollfd fds[3] = {
        {s.out_r.fd, POLLIN, 0}, {s.err_r.fd, POLLIN, 0}, {exited ? -1 : pidfd.fd, POLLIN, 0}};
    if (poll(fds, 3, wait_ms) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      Fd& fd = i == 0 ? s.out_r : s.err_r;
      if (fd.fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t n = read(fd.fd, buf.data(), buf.size());
      if (n > 0) (i == 0 ? out : err).add(buf.data(), static_cast<size_t>(n));
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) fd.reset();
    }
    if (!exited && wait4(s.pid, &status, WNOHANG, &ru) == s.pid) exited = true;
  }
  if (!exited) {
    killpg(s.pid, SIGKILL);
    kill(s.pid, SIGKILL);
    while (wait4(s.pid, &status, 0, &ru) < 0 && errno == EINTR) {
    }
  }
  killpg(s.pid, SIGKILL);
  r.wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  r.cpu_ms = 1e3 * (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
             1e-3 * (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  r.stdout_head = out.result();
  r.stderr_tail = err.result();
  r.stdout_bytes = out.total;
  r.stderr_bytes = err.total;
  if (WIFEXITED(status)) r.exit_status = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  // The CPU limit kills with SIGXCPU (only that limit sends it), or SIGKILL at the hard limit
  // (PID 1 ignores SIGXCPU); rusage may read a little under the limit, so SIGXCPU decides alone.
  if (r.signal == SIGXCPU || (r.signal != 0 && r.cpu_ms >= 1000.0 * lim.cpu_s - 50))
    r.timed_out = true;
}

std::string verdict(const SandboxResult& r) {
  if (r.timed_out) return "timeout";
  if (r.signal != 0) return "killed";
  return r.exit_status == 0 ? "passed" : "failed";
}

rlimit limit(uint64_t soft, uint64_t hard) {
  return {static_cast<rlim_t>(soft), static_cast<rlim_t>(hard)};
}

// Runs argv (argv[0] a path) and returns its stdout; "" when it fails.
std::string output_of(const std::vector<std::string>& args) {
  Pipe p = make_pipe();
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(p.w.fd, 1);
    execv(argv[0], argv.data());
    _exit(127);
  }
  p.w.reset();
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(p.r.fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
    out.append(buf, static_cast<size_t>(std::max<ssize_t>(n, 0)));
  int status = 0;
  if (pid > 0) waitpid(pid, &status, 0);
  return pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? out : "";
}

// Whether a user other than the owner may reach `path`: every folder on the way searchable by
// others, the file itself readable or executable by others (as `need`).
bool others_may(const fs::path& path, mode_t need) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || (st.st_mode & need) != need) return false;
  for (fs::path dir = path.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    if (stat(dir.c_str(), &st) != 0 || !(st.st_mode & S_IXOTH)) return false;
    if (dir == dir.parent_path()) break;
  }
  return true;
}

std::string find_python() {
  const char* path_env = std::getenv("PATH");
  const std::string path = path_env ? path_env : "/usr/bin:/bin";
  std::string tried;
  size_t begin = 0;
  while (begin <= path.size()) {
    const size_t end = std::min(path.find(':', begin), path.size());
    const fs::path candidate = fs::path(path.substr(begin, end - begin)) / "python3";
    begin = end + 1;
    if (candidate.parent_path().empty() || access(candidate.c_str(), X_OK) != 0) continue;
    // "EXECUTABLE\nPREFIX\n": the interpreter behind a shim, and where its library lives.
    const std::string info = output_of({candidate.string(), "-I", "-S", "-c",
                                        "import sys; print(sys.executable); print(sys.prefix)"});
    const size_t nl = info.find('\n');
    if (nl == std::string::npos) continue;
    const std::string exe = info.substr(0, nl);
    const std::string prefix = info.substr(nl + 1, info.find('\n', nl + 1) - nl - 1);
    // Run as nobody (tandem as root), the interpreter and its library must be open to others.
    if (geteuid() == 0 && !(others_may(exe, S_IXOTH) && others_may(prefix, S_IXOTH))) {
      tried += " " + exe + " (not reachable by an unprivileged user)";
      continue;
    }
    if (!exe.empty()) return exe;
  }
  throw Error("sandbox: no usable python3 on PATH (" + path + ")" +
              (tried.empty() ? "" : ";" + tried));
}

}  // namespace

std::string python_executable() {
  static std::mutex mu;
  static std::string found;
  std::lock_guard lock(mu);
  if (found.empty()) found = find_python();
  return found;
}

SandboxResult run_python(const std::string& program, const SandboxLimits& lim) {
  const std::string python = python_executable();
  Scratch scratch;
  const std::string main_py = scratch.path + "/main.py";
  if (!(std::ofstream(main_py, std::ios::binary) << program))
    throw Error("sandbox: cannot write " + main_py);
  const Ids ids = program_ids();
  if (geteuid() == 0 && (chown(scratch.path.c_str(), ids.uid, ids.gid) != 0 ||
                         chown(main_py.c_str(), ids.uid, ids.gid) != 0)) {
    throw Error("sandbox: cannot give " + scratch.path + " to uid " + std::to_string(ids.uid) +
                ": " + strerror(errno));
  }
  Fd devnull(open("/dev/null", O_RDONLY | O_CLOEXEC));
  uint32_t landlock_bits = 0;
  Fd landlock = landlock_ruleset(scratch.path, landlock_bits);

  // Everything the child reads, built here: it may not allocate.
  std::vector<std::string> args = {python, "-I", "-S", "-B", "main.py"};
  std::vector<std::string> env = {"PATH=/usr/bin:/bin", "HOME=" + scratch.path,
                                  "TMPDIR=" + scratch.path, "LANG=C.UTF-8"};
  ChildPlan plan;
  plan.python = python.c_str();
  for (auto& a : args) plan.argv.push_back(a.data());
  plan.argv.push_back(nullptr);
  for (auto& e : env) plan.envp.push_back(e.data());
  plan.envp.push_back(nullptr);
  plan.scratch = scratch.path.c_str();
  plan.devnull = devnull.fd;
  plan.landlock = landlock.fd;
  plan.landlock_bits = landlock_bits;
  plan.cpu = limit(static_cast<uint64_t>(lim.cpu_s), static_cast<uint64_t>(lim.cpu_s) + 1);
  plan.as = limit(lim.memory_bytes, lim.memory_bytes);
  plan.fsize = limit(lim.file_bytes, lim.file_bytes);
  plan.nproc = limit(static_cast<uint64_t>(lim.processes), static_cast<uint64_t>(lim.processes));
  plan.core = limit(0, 0);

  Started s;
  ChildReport rep;
  if (lim.namespaces) {
    s = start(plan, true);
    if (s.pid > 0) {
      const char ok = write_id_maps(s.pid, ids) ? 1 : 0;
      (void)!write(s.sync_w.fd, &ok, 1);
      rep = read_report(s.status_r.fd);
      if (rep.stage == kStageIdMap) {  // no id map: run without namespaces instead
        while (waitpid(s.pid, nullptr, 0) < 0 && errno == EINTR) {
        }
        s.pid = -1;
      }
    }
  }
  if (s.pid <= 0) {
    s = start(plan, false);
    rep = read_report(s.status_r.fd);
  }
  SandboxResult r;
  r.pid = s.pid;
  r.isolation = isolation_name(s.applied | rep.applied);
  if (rep.stage != kStageNone) {
    killpg(s.pid, SIGKILL);
    while (waitpid(s.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    throw Error(std::string("sandbox: the child failed ") + kStageNames[rep.stage] + " (" + python +
                "): " + strerror(rep.err));
  }
  supervise(s, lim, r);
  if (!(s.applied & kPidNs)) await_group_death(s.pid);
  r.verdict = verdict(r);
  return r;
}

}  // namespace tandem::eval
