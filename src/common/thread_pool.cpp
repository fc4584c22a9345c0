#include "common/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <cassert>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define TANDEM_CPU_RELAX() asm volatile("yield")
#else
#define TANDEM_CPU_RELAX() \
  do {                     \
  } while (0)
#endif

namespace tandem {
namespace {
// About 50-100 microseconds of spinning before a worker goes to sleep.
constexpr int kSpinIterations = 20000;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < kSpinIterations && !stop_.load(); ++spin) {
      if (spin < kSpinIterations / 4) {
        TANDEM_CPU_RELAX();
      } else {
        std::this_thread::yield();
      }
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      ++sleepers_;
      cv_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
      --sleepers_;
      if (stop_.load()) return;
      gen = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load()) return;
    seen = gen;
    (*job_)(index, n_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  assert(job_ == nullptr && "ThreadPool::run is not reentrant: a job ran a job on its own pool");
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // Publishing under the lock means a worker that is about to sleep either sees the new
    // generation in its wait predicate or is already waiting and gets the notification.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
    if (sleepers_ > 0) cv_.notify_all();
  }
  fn(0, n_threads_);
  // Spin for the stragglers, then yield: on an oversubscribed machine the worker we wait for
  // may need this very core.
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < 2000) {
      TANDEM_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
  job_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t n_chunks = (n + grain - 1) / grain;
  const int n_workers = static_cast<int>(std::min<int64_t>(n_threads_, n_chunks));
  if (n_workers <= 1) {
    fn(0, n);
    return;
  }
  run([&](int t, int) {
    if (t >= n_workers) return;
    // Even split of whole chunks; the first (n_chunks % n_workers) threads get one more.
    const int64_t base = n_chunks / n_workers, extra = n_chunks % n_workers;
    const int64_t c0 = t * base + std::min<int64_t>(t, extra);
    const int64_t c1 = c0 + base + (t < extra ? 1 : 0);
    const int64_t begin = c0 * grain, end = std::min(n, c1 * grain);
    assert(t + 1 < n_workers || c1 == n_chunks);  // the last worker's share ends the range
    if (begin < end) fn(begin, end);
  });
}

int default_thread_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int n = 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(n, 1, 64);
}

}  // namespace tandem
