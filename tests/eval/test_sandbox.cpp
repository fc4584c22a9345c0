// The sandbox that runs HumanEval's model-written programs (tandem/sandbox.h), attacked by
// hostile programs: each is stopped and scored as not passed, nothing it writes lands outside
// its scratch folder, it reaches no socket, and no process it started survives. Every check is
// on the outcome, never on how long it took. Each runs twice where it matters: with the
// namespaces, and without them (Landlock alone, the path of a machine that forbids namespaces).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "tandem/sandbox.h"

namespace tandem::eval {
namespace {

namespace fs = std::filesystem;

// Short limits, so a hostile program costs little; the verdicts are the same as at full size.
SandboxLimits quick(bool namespaces = true) {
  SandboxLimits lim;
  lim.wall_s = 5;
  lim.cpu_s = 2;
  lim.namespaces = namespaces;
  return lim;
}

bool has(const std::string& isolation, const std::string& part) {
  return ("+" + isolation + "+").find("+" + part + "+") != std::string::npos;
}

// A word no other process on the machine has in its command line.
std::string unique_marker() {
  std::random_device rd;
  return "tandem-sandbox-marker-" + std::to_string(getpid()) + "-" + std::to_string(rd());
}

// Processes whose command line holds `marker`.
int processes_with(const std::string& marker) {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "cmdline", std::ios::binary);
    const std::string cmd((std::istreambuf_iterator<char>(f)), {});
    n += cmd.find(marker) != std::string::npos;
  }
  return n;
}

// Whether any process of the group the program led still runs: a member that is not a zombie
// (a killed process whose new parent has not reaped it yet is dead).
bool group_alive(int pgid) {
  if (kill(-pgid, 0) != 0 && errno == ESRCH) return false;
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::ifstream f(e.path() / "stat");
    std::string stat;
    if (!std::getline(f, stat) || stat.rfind(')') == std::string::npos) continue;
    std::istringstream rest(stat.substr(stat.rfind(')') + 1));
    char state = 0;
    long ppid = 0, pgrp = 0;
    if (rest >> state >> ppid >> pgrp && pgrp == pgid && state != 'Z') return true;
  }
  return false;
}

class SandboxModes : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Sandbox, SandboxModes, ::testing::Values(true, false),
                         [](const auto& info) {
                           return std::string(info.param ? "Namespaces" : "NoNamespaces");
                         });

TEST(Sandbox, IsolationOnThisMachine) {
  // Reported, so a CI log shows which parts applied; the tests below check their effects.
  const SandboxResult ns = run_python("pass\n", quick(true));
  const SandboxResult plain = run_python("pass\n", quick(false));
  std::printf("with namespaces: %s\nwithout: %s\npython: %s\n", ns.isolation.c_str(),
              plain.isolation.c_str(), python_executable().c_str());
  EXPECT_EQ(ns.verdict, "passed");
  EXPECT_EQ(plain.verdict, "passed");
}

TEST_P(SandboxModes, ACorrectProgramPassesInAFolderThatIsThenGone) {
  const SandboxResult r = run_python(
      "import os, sys\n"
      "open('scratch.txt', 'w').write('mine')\n"  // its own folder is writable
      "print(os.getcwd())\n"
      "print(sorted(os.environ))\n"
      "print(sorted(os.listdir('/proc/self/fd')))\n",
      quick(GetParam()));
  ASSERT_EQ(r.verdict, "passed") << r.stderr_tail;
  EXPECT_EQ(r.exit_status, 0);
  std::istringstream out(r.stdout_head);
  std::string cwd, env, fds;
  std::getline(out, cwd);
  std::getline(out, env);
  std::getline(out, fds);
  EXPECT_NE(cwd.find("tandem-sandbox-"), std::string::npos) << cwd;
  EXPECT_FALSE(fs::exists(cwd)) << "the scratch folder outlived the run: " << cwd;
  EXPECT_EQ(env, "['HOME', 'LANG', 'PATH', 'TMPDIR']");
  // stdin, stdout, stderr and the descriptor listdir itself opened: nothing inherited.
  EXPECT_EQ(fds, "['0', '1', '2', '3']");
}

TEST_P(SandboxModes, TheProgramHoldsNoCapabilityAndIsNotRoot) {
  // Without a capability it cannot remount the root writable or leave its namespaces' bounds.
  const SandboxResult r = run_python(
      "import os\n"
      "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapPrm', "
      "'CapEff'))]\n"
      "assert caps == ['0000000000000000'] * 2, caps\n"
      "assert os.getuid() != 0 and os.geteuid() != 0, os.getuid()\n",
      quick(GetParam()));
  EXPECT_EQ(r.verdict, "passed") << r.stderr_tail;
}

TEST_P(SandboxModes, AFailingTestFails) {
  const SandboxResult r = run_python("assert 1 + 1 == 3, 'wrong sum'\n", quick(GetParam()));
  EXPECT_EQ(r.verdict, "failed");
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_NE(r.stderr_tail.find("AssertionError: wrong sum"), std::string::npos) << r.stderr_tail;
}

TEST_P(SandboxModes, AnEndlessLoopIsStopped) {
  const SandboxResult spin = run_python("while True:\n    pass\n", quick(GetParam()));
  EXPECT_EQ(spin.verdict, "timeout") << "signal " << spin.signal << ", exit " << spin.exit_status;
  EXPECT_TRUE(spin.timed_out);
  EXPECT_FALSE(group_alive(spin.pid));
  // Sleeping uses no CPU: the wall-clock deadline ends it.
  SandboxLimits lim = quick(GetParam());
  lim.wall_s = 1;
  const SandboxResult sleep = run_python("import time\ntime.sleep(600)\n", lim);
  EXPECT_EQ(sleep.verdict, "timeout");
  EXPECT_FALSE(group_alive(sleep.pid));
}

// A program that starts a child sleeping for a minute (in a session of its own: out of the
// program's process group), waits until it runs, prints "child running" and exits 0.
std::string outliving_child(const std::string& marker, bool new_session) {
  return "import subprocess, sys\n"
         "p = subprocess.Popen([sys.executable, '-c', 'import time; print(\"up\", flush=True); "
         "time.sleep(60)', '" +
         marker +
         "'], stdout=subprocess.PIPE, start_new_session=" + (new_session ? "True" : "False") +
         ")\n"
         "assert p.stdout.readline() == b'up\\n'\n"
         "print('child running')\n";
}

TEST_P(SandboxModes, AForkedChildThatOutlivesItsParentIsGone) {
  const std::string marker = unique_marker();
  const SandboxResult r = run_python(outliving_child(marker, false), quick(GetParam()));
  EXPECT_EQ(r.verdict, "passed") << r.stderr_tail;
  EXPECT_EQ(r.stdout_head, "child running\n");
  EXPECT_EQ(processes_with(marker), 0);
  EXPECT_FALSE(group_alive(r.pid));
}

TEST(Sandbox, AChildThatLeavesTheProcessGroupIsGoneToo) {
  // setsid() leaves the group killpg reaches; the PID namespace still ends it with its PID 1.
  const std::string marker = unique_marker();
  const SandboxResult r = run_python(outliving_child(marker, true), quick(true));
  if (!has(r.isolation, "pidns")) GTEST_SKIP() << "no PID namespace here: " << r.isolation;
  EXPECT_EQ(r.verdict, "passed") << r.stderr_tail;
  EXPECT_EQ(processes_with(marker), 0);
}

TEST_P(SandboxModes, AForkBombIsStopped) {
  const SandboxResult r = run_python(
      "import os\n"
      "while True:\n"
      "    try:\n"
      "        os.fork()\n"
      "    except OSError:\n"
      "        pass\n",
      quick(GetParam()));
  EXPECT_NE(r.verdict, "passed");
  EXPECT_FALSE(group_alive(r.pid));
}

TEST_P(SandboxModes, AllocatingFourGigabytesFails) {
  const SandboxResult r =
      run_python("x = bytearray(4 << 30)\nprint('allocated')\n", quick(GetParam()));
  EXPECT_EQ(r.verdict, "failed");
  EXPECT_EQ(r.stdout_head, "");
  EXPECT_NE(r.stderr_tail.find("MemoryError"), std::string::npos) << r.stderr_tail;
}

TEST_P(SandboxModes, WritingOutsideItsFolderFails) {
  // A folder anyone may write to (so only the sandbox stops the write, not permissions), and
  // /tmp itself.
  std::string tmpl = (fs::temp_directory_path() / "tandem-sandbox-test-XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const fs::path dir = tmpl;
  fs::permissions(dir, fs::perms::all);
  const std::string marker = unique_marker();
  const fs::path targets[] = {dir / "escaped.txt", fs::path("/tmp") / (marker + ".txt")};
  const SandboxResult r0 = run_python("pass\n", quick(GetParam()));
  if (!has(r0.isolation, "readonly-root") && !has(r0.isolation, "landlock-fs"))
    GTEST_SKIP() << "neither a read-only root nor Landlock here: " << r0.isolation;
  for (const fs::path& target : targets) {
    const SandboxResult r =
        run_python("open('" + target.string() + "', 'w').write('out')\n", quick(GetParam()));
    EXPECT_EQ(r.verdict, "failed") << target;
    EXPECT_FALSE(fs::exists(target)) << target << " was written; isolation " << r.isolation;
    fs::remove(target);
  }
  fs::remove_all(dir);
}

TEST_P(SandboxModes, ConnectingToALocalListenerFails) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(listener, 8), 0);
  socklen_t len = sizeof addr;
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  const SandboxResult r = run_python(
      "import socket\nsocket.create_connection(('127.0.0.1', " + port + "), timeout=2)\n",
      quick(GetParam()));
  const bool isolated = has(r.isolation, "netns") || has(r.isolation, "landlock-tcp");
  const int accepted = accept(listener, nullptr, nullptr);
  close(listener);
  if (accepted >= 0) close(accepted);
  if (!isolated) GTEST_SKIP() << "no network namespace or Landlock TCP here: " << r.isolation;
  EXPECT_EQ(r.verdict, "failed");
  EXPECT_LT(accepted, 0) << "the program reached the listener";
}

TEST_P(SandboxModes, AHundredMegabytesOfOutputAreBounded) {
  SandboxLimits lim = quick(GetParam());
  const SandboxResult r = run_python(
      "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(chunk)\n"
      "sys.stderr.write('e' * (1 << 20) + 'END')\n",
      lim);
  EXPECT_EQ(r.verdict, "passed") << r.stderr_tail.substr(0, 500);
  EXPECT_EQ(r.stdout_bytes, 100u << 20);
  EXPECT_EQ(r.stdout_head.size(), lim.capture_bytes);
  EXPECT_EQ(r.stderr_tail.size(), lim.capture_bytes);
  EXPECT_EQ(r.stderr_tail.substr(r.stderr_tail.size() - 3), "END");
}

TEST_P(SandboxModes, AFileBeyondTheSizeLimitIsNotWritten) {
  const SandboxResult r = run_python(
      "import os\nf = open('big', 'wb')\nf.write(b'x' * (32 << 20))\nf.close()\n"
      "assert os.path.getsize('big') == 32 << 20\n",
      quick(GetParam()));
  EXPECT_NE(r.verdict, "passed");
}

}  // namespace
}  // namespace tandem::eval
